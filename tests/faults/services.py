"""Private services for the fault suite: a RabbitMQ node and a PostgreSQL cluster of its own.

The fault scenarios kill -9 a broker and stop a database, so they never use the machine's
own services: each service here runs under a temporary directory, on ports picked free at
start, and is signalled only by the exact PIDs it started (never ``pkill``, never ``epmd
-kill`` without ``-port``). Facts behind the RabbitMQ set-up are in
``/work/shared/notes/rabbitmq-cluster.md`` (node name, own epmd port, Debian scripts called
directly so that root is not switched to the ``rabbitmq`` user). The node runs the machine's
RabbitMQ 3.10, or RabbitMQ 4.3 from the root that ``TASKQ_TEST_RABBITMQ_ROOT`` names
(tests/support/rabbitmq_root.py; its files then live inside that root).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.processes import kill_process, wait_gone
from tests.support.rabbitmq_nodes import (
    answers,
    deprecated_feature_lines,
    free_port,
    node_config,
    speaks_amqp,
)
from tests.support.rabbitmq_root import RabbitInstall, requested_install, unusable
from tests.support.waiting import wait_until

logger = logging.getLogger(__name__)

POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


class PrivateRabbit:
    """One RabbitMQ node with its own epmd, ports, cookie, data and log directories.

    ``start()`` boots it (a cold boot takes about 5 s here); ``kill()`` SIGKILLs its
    ``beam.smp`` (the PID from ``RABBITMQ_PID_FILE``); ``start()`` again restarts it on the
    same ports and data, so durable queues and persistent messages come back.
    """

    def __init__(self, install: RabbitInstall | None = None) -> None:
        """``install``: where its RabbitMQ comes from (default: the one the run asked for)."""
        self.install = install or requested_install()
        unusable(self.install)
        self.root = self.install.make_dir("taskq-faults-rabbit-")
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.ctl_port = free_port()
        self.node = f"tqfault{os.getpid()}@localhost"
        self._epmd: subprocess.Popen[bytes] | None = None
        self._script: subprocess.Popen[bytes] | None = None
        self.beam_pid: int | None = None
        self._write_files()

    @property
    def url(self) -> str:
        """AMQP URL of the node (guest may log in from loopback)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def _write_files(self) -> None:
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(f"taskqfaults{os.getpid()}")
        cookie.chmod(0o400)
        (self.root / "env.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[].\n")
        (self.root / "advanced.config").write_text("[].\n")
        (self.root / "rabbitmq.conf").write_text(node_config(self.port, [self.node],
                                                             self.install))

    def _env(self) -> dict[str, str]:
        root, seen = self.root, self.install.seen
        return {
            "HOME": seen(root / "home"),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_CONF_ENV_FILE": seen(root / "env.conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": seen(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": seen(root / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": seen(root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": seen(root / "mnesia"),
            "RABBITMQ_LOG_BASE": seen(root / "log"),
            "RABBITMQ_PID_FILE": seen(root / "beam.pid"),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.ctl_port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.ctl_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "+S 1:1 +sbwt none -kernel inet_dist_use_interface {127,0,0,1}"
            ),
        }

    def deprecated_feature_lines(self) -> list[str]:
        """What the node logged so far about deprecated features used (none, we hope)."""
        return deprecated_feature_lines(self.root / "log")

    def start(self) -> None:
        """Boot the node (and its epmd on first use); return once AMQP answers."""
        if self._epmd is None or self._epmd.poll() is not None:
            self._epmd = subprocess.Popen(
                self.install.epmd_command(self.epmd_port), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        pid_file = self.root / "beam.pid"
        pid_file.unlink(missing_ok=True)
        argv, env = self.install.command("rabbitmq-server", env=self._env())
        with open(self.root / "server.out", "ab") as out:
            self._script = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        wait_until(
            lambda: self._script is not None and (
                self._script.poll() is not None or speaks_amqp(self.port)
            ),
            timeout_s=BOOT_TIMEOUT_S, interval_s=0.1,
            message=f"private RabbitMQ node {self.node} to accept AMQP on {self.port}",
        )
        if self._script.poll() is not None:
            raise RuntimeError(f"private RabbitMQ did not start; see {self.root}/server.out")
        self.beam_pid = int(str(wait_until(lambda: _read(pid_file), timeout_s=10)))
        logger.info("private RabbitMQ %s (%s) on port %d (beam pid %d)", self.node,
                    self.install.label, self.port, self.beam_pid)

    def is_running(self) -> bool:
        """Whether the node accepts AMQP connections."""
        return (self._script is not None and self._script.poll() is None
                and speaks_amqp(self.port))

    def kill(self) -> int:
        """SIGKILL the node's beam.smp; return its PID once it is gone."""
        pid = self.beam_pid
        if pid is None:
            raise RuntimeError("the private RabbitMQ node is not running")
        script = self._script
        # beam.smp is a child of the server script; if it has exited, its PID is not ours
        kill_process(pid, parent=script.pid if script is not None else None)
        wait_gone(pid, timeout_s=STOP_TIMEOUT_S, what=f"beam.smp of {self.node}")
        if script is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                script.wait(STOP_TIMEOUT_S)
            script.kill()  # a no-op once reaped: Popen never signals a PID it gave back
            script.wait(STOP_TIMEOUT_S)
        self.beam_pid = None
        return pid

    def close(self) -> None:
        """Kill the node and its epmd, and remove every file of theirs."""
        if self.beam_pid is not None:
            self.kill()
        if self._script is not None:
            self._script.kill()  # a no-op once it has been reaped
            self._script.wait(STOP_TIMEOUT_S)
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.kill()
            self._epmd.wait(STOP_TIMEOUT_S)
        shutil.rmtree(self.root, ignore_errors=True)


class ManagedRabbit(PrivateRabbit):
    """A private node with the management plugin on a port of its own.

    Its statistics are collected every second (the default is 5 s), so the management API's
    consumer lists and message rates follow within a couple of seconds.
    """

    def __init__(self, install: RabbitInstall | None = None) -> None:
        self.management_port = free_port()
        super().__init__(install)

    def _write_files(self) -> None:
        super()._write_files()
        (self.root / "enabled_plugins").write_text("[rabbitmq_management].\n")
        with open(self.root / "rabbitmq.conf", "a") as conf:
            conf.write(f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = "
                       f"{self.management_port}\ncollect_statistics_interval = 1000\n")

    def start(self) -> None:
        super().start()
        wait_until(lambda: answers(self.management_port), timeout_s=60,
                   message="the management API of the private node")


class PrivatePostgres:
    """A PostgreSQL 15 cluster in a temporary directory, run as ``postgres`` when root.

    ``stop_immediate()`` is ``pg_ctl stop -m immediate`` (the server's processes quit at once,
    without a checkpoint: crash recovery at the next start); ``start()`` starts it again.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="taskq-faults-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(POSTGRES_BIN / "initdb", "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "--no-sync")

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` on this cluster."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: Path, *args: str) -> None:
        command = [str(program), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=BOOT_TIMEOUT_S)

    def start(self) -> None:
        """Start the server; return once it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c max_connections=200 "
            # the suite kills processes, never the machine: the page cache survives, so
            # fsync buys nothing here but time
            "-c fsync=off"
        )
        self._run(POSTGRES_BIN / "pg_ctl", "-D", str(self.data), "-o", options,
                  "-l", str(self.root / "server.log"), "-w", "-t", "60", "start")
        wait_until(lambda: answers(self.port), timeout_s=BOOT_TIMEOUT_S)

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: no clean shutdown, connections cut at once."""
        self._run(POSTGRES_BIN / "pg_ctl", "-D", str(self.data), "-m", "immediate",
                  "-w", "stop")

    def is_running(self) -> bool:
        """Whether the server accepts connections."""
        return answers(self.port)

    def close(self) -> None:
        """Stop the server and remove the cluster."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop_immediate()
        shutil.rmtree(self.root, ignore_errors=True)


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def wait_s(seconds: float) -> None:
    """Hold a fault for ``seconds`` (an outage's length is the fault, not a wait for a
    condition)."""
    time.sleep(seconds)
