"""What /proc and the broker tell about processes: RSS, CPU seconds, the broker's PID and memory.

Everything here reads; nothing signals or reconfigures. The broker is asked through
``rabbitmqctl eval`` (read-only Erlang calls) when that works on this machine, else its
figures are reported as unavailable. ``BENCH_RABBITMQCTL`` replaces the ``rabbitmqctl``
command for a node that the machine's own one cannot reach (a node in a chroot, with its own
epmd), e.g. ``chroot /opt/rmq43 env HOME=/var/lib/rabbitmq ERL_EPMD_PORT=4373 rabbitmqctl -n
r43@localhost``. The broker's PID is the process listening on the broker URL's port (read from
/proc), so it is found for such a node too; ``rabbitmqctl eval 'os:getpid().'`` is the
fallback.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MiB, ``None`` once it is gone."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * _PAGE_BYTES / 2**20


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far, ``None`` once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    pids, frontier = [pid], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children(parent)]
        pids.extend(frontier)
    return pids


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its living descendants (exited ones are counted by the
    kernel in their parent's cutime only once reaped, so measure before stopping)."""
    return sum(cpu_s(p) or 0.0 for p in tree(pid))


@dataclass(frozen=True)
class Broker:
    """The shared RabbitMQ node, as far as this machine lets us read it."""

    pid: int | None

    @classmethod
    def find(cls, url: str | None = None) -> Broker:
        """The node behind ``url`` (its AMQP port), else the one ``rabbitmqctl`` reaches."""
        if url is not None:
            pid = listening_pid(urlparse(url).port or 5672)
            if pid is not None:
                return cls(pid)
        text = _ctl_eval("list_to_integer(os:getpid()).")
        return cls(int(text) if text and text.isdigit() else None)

    def cpu_s(self) -> float | None:
        return None if self.pid is None else cpu_s(self.pid)

    def memory_mb(self) -> float | None:
        """``erlang:memory(total)`` of the node in MiB."""
        text = _ctl_eval("erlang:memory(total).")
        return int(text) / 2**20 if text and text.isdigit() else None


def listening_pid(port: int) -> int | None:
    """The PID of the process with a TCP socket listening on ``port``, ``None`` if unseen.

    Reads /proc/net/tcp{,6} for the listening socket's inode, then the processes' fd links
    for that socket (needs the rights to read them: root, or the broker's own user).
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN.
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
        except OSError:
            continue
    return None


def rabbitmqctl() -> list[str]:
    """The ``rabbitmqctl`` command (``BENCH_RABBITMQCTL`` when set: module docstring)."""
    return shlex.split(os.environ.get("BENCH_RABBITMQCTL", "rabbitmqctl"))


def _ctl_eval(expression: str) -> str | None:
    try:
        done = subprocess.run(
            [*rabbitmqctl(), "-q", "eval", expression], capture_output=True, text=True,
            timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


class CpuMeter:
    """CPU seconds of one measurement: this process (the producer), a worker tree, the broker.

    Start it just before enqueueing; call :meth:`producer_done` when the producer returns and
    :meth:`per_task_us` before the workers stop.
    """

    def __init__(self, broker: Broker, worker_pid: int) -> None:
        import time

        self._time = time
        self.broker, self.worker_pid = broker, worker_pid
        self.broker_at = broker.cpu_s()
        self.workers_at = tree_cpu_s(worker_pid)
        self.producer_at = time.process_time()
        self.producer_s: float | None = None

    def producer_done(self) -> None:
        self.producer_s = self._time.process_time() - self.producer_at

    def per_task_us(self, tasks: int) -> dict[str, float | None]:
        broker_now = self.broker.cpu_s()
        broker_s = (None if broker_now is None or self.broker_at is None
                    else broker_now - self.broker_at)
        workers_s = tree_cpu_s(self.worker_pid) - self.workers_at

        def us(seconds: float | None) -> float | None:
            return None if seconds is None else seconds / tasks * 1e6

        return {"producer": us(self.producer_s), "workers": us(workers_s), "broker": us(broker_s)}
