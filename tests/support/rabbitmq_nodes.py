"""Private RabbitMQ nodes for tests: one node, or a cluster of N, started beside the machine's.

Each :class:`RabbitCluster` has its own epmd on a free port, its own cookie in a private
``HOME``, and per node its own name (``rabbitN@localhost``), AMQP, distribution and CLI ports,
data and log directories, all under one temporary directory that :meth:`RabbitCluster.close`
removes. Nodes are started with the Debian scripts under ``/usr/lib/rabbitmq/bin`` called
directly (the ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user when run as root and
reset ``HOME``), from the machine's RabbitMQ 3.10 or, when ``TASKQ_TEST_RABBITMQ_ROOT`` is
set, from a Debian root with RabbitMQ 4.3 (tests/support/rabbitmq_root.py: how a node runs
there). Several nodes find each other by classic-config peer discovery; on a Mnesia broker
(3.10) they run with ``cluster_partition_handling = pause_minority``, on a Khepri one (4.2
and later) with no partition handling setting: Raft is the only mode, and 4.3 has no other.
Facts measured on this machine behind these choices: ``/work/shared/notes/rabbitmq-cluster.md``
and docs/cluster.md.

Only PIDs started here are ever signalled (a node's ``beam.smp`` PID is read from its
``RABBITMQ_PID_FILE``); never ``pkill``, and never ``epmd -kill`` (it would stop the machine's
epmd on 4369). The machine's broker (127.0.0.1:5672) is never touched.

Usage::

    with RabbitCluster(3) as cluster:      # skips the test where rabbitmq-server is missing
        cluster.start()                      # returns once 3 nodes run in one cluster
        urls = cluster.urls                  # one AMQP URL per node
        cluster.nodes[0].kill()              # kill -9 of its beam.smp
        cluster.nodes[0].start()             # back on the same ports and data
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from tests.support.processes import kill_process, process_gone, wait_gone
from tests.support.rabbitmq_root import RabbitInstall, requested_install, unusable
from tests.support.waiting import wait_until

logger = logging.getLogger(__name__)

BOOT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
_CTL_TIMEOUT_S = 60.0
# What a node writes to its log when a client uses a deprecated feature (RabbitMQ 3.13 and
# later; 4.3 lists global QoS, transient non-exclusive queues, queue master locators).
DEPRECATED_FEATURES = "Deprecated features"


def deprecated_feature_lines(log_dir: Path) -> list[str]:
    """The lines of the node logs in ``log_dir`` that report a deprecated feature used."""
    lines: list[str] = []
    for path in sorted(log_dir.glob("*.log")):
        with open(path, errors="replace") as log:
            lines += [f"{path.name}: {line.strip()}" for line in log
                      if DEPRECATED_FEATURES in line]
    return lines


def node_config(port: int, peers: list[str], install: RabbitInstall) -> str:
    """``rabbitmq.conf`` of a private node on ``port`` in a cluster of ``peers``."""
    lines = [
        f"listeners.tcp.default = 127.0.0.1:{port}",
        "loopback_users = none",
        "vm_memory_high_watermark.absolute = 1GiB",
        "disk_free_limit.absolute = 50MB",
        "log.console = false",
        "log.file.level = info",
    ]
    if len(peers) > 1:
        lines += [
            "cluster_formation.peer_discovery_backend = classic_config",
            *(f"cluster_formation.classic_config.nodes.{i} = {peer}"
              for i, peer in enumerate(peers, 1)),
        ]
        if not install.khepri_only:
            # Mnesia: a node cut off from the majority stops serving (closes its clients)
            # until the partition heals. Khepri has no such mode (module docstring).
            lines.append("cluster_partition_handling = pause_minority")
    return "\n".join(lines) + "\n"


# Every port free_port() has handed out in this process.
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that no earlier call returned.

    ``bind(0)`` may give back a port it gave a moment ago once that socket is closed, so two
    calls for one node (its AMQP and its epmd port) could agree, and the node would then
    fail to start with ``eaddrinuse`` while its epmd answers on the port.
    """
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def speaks_amqp(port: int) -> bool:
    """Whether an AMQP 0-9-1 server answers on 127.0.0.1:``port``.

    More than :func:`answers`: whatever else holds the port (an epmd, a proxy whose upstream
    is down) accepts the connection too, but only a broker answers the protocol header with
    a frame (``connection.start``).
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(5)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # frame type 1: a method frame
    except OSError:
        return False


def answers(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitNode:
    """One node of a :class:`RabbitCluster` (build them through the cluster)."""

    def __init__(self, cluster: RabbitCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"rabbit{index}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.ctl_port = free_port()
        self.root = cluster.root / f"rabbit{index}"
        self.root.mkdir()
        self._script: subprocess.Popen[bytes] | None = None
        self.beam_pid: int | None = None

    def __repr__(self) -> str:
        return f"<RabbitNode {self.name} amqp={self.port} beam={self.beam_pid}>"

    @property
    def url(self) -> str:
        """AMQP URL of this node (guest may log in: ``loopback_users = none``)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def env(self) -> dict[str, str]:
        """Variables of this node's server script and of ``rabbitmqctl -n`` on it (paths as
        the node sees them: the install's :meth:`~RabbitInstall.command` adds the rest)."""
        root, shared = self.root, self.cluster.root
        seen = self.cluster.install.seen
        return {
            "HOME": seen(self.cluster.home),
            "ERL_EPMD_PORT": str(self.cluster.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_CONF_ENV_FILE": seen(shared / "env.conf"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": seen(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": seen(shared / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": seen(shared / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": seen(root / "mnesia"),
            "RABBITMQ_LOG_BASE": seen(root / "log"),
            "RABBITMQ_PID_FILE": seen(root / "beam.pid"),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.ctl_port),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.ctl_port + 10),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "+S 1:1 +sbwt none "
                "-kernel inet_dist_use_interface {127,0,0,1}"
            ),
        }

    def write_config(self, peers: list[str]) -> None:
        (self.root / "rabbitmq.conf").write_text(
            node_config(self.port, peers, self.cluster.install))

    def deprecated_feature_lines(self) -> list[str]:
        """What this node logged so far about deprecated features used (none, we hope)."""
        return deprecated_feature_lines(self.root / "log")

    # -- life cycle --------------------------------------------------------------------------

    def launch(self) -> None:
        """Start the server script without waiting (see :meth:`wait_amqp`)."""
        if self.is_alive():
            raise RuntimeError(f"{self.name} is already running")
        (self.root / "beam.pid").unlink(missing_ok=True)
        argv, env = self.cluster.install.command("rabbitmq-server", env=self.env())
        with open(self.root / "server.out", "ab") as out:
            self._script = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def wait_amqp(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        """Wait until this node accepts AMQP connections and its beam PID is known."""
        script = self._script
        assert script is not None, "launch() first"
        wait_until(
            lambda: script.poll() is not None or speaks_amqp(self.port),
            timeout_s=timeout_s, interval_s=0.1,
            message=f"private RabbitMQ node {self.name} to accept AMQP on {self.port}",
        )
        if script.poll() is not None:
            raise RuntimeError(
                f"private RabbitMQ node {self.name} exited; see {self.root}/server.out and "
                f"{self.root}/log"
            )
        self.beam_pid = int(str(wait_until(self._read_pid, timeout_s=10, interval_s=0.05)))

    def start(self, timeout_s: float = BOOT_TIMEOUT_S) -> float:
        """(Re)start the node on its ports and data; return seconds until AMQP answered."""
        started_at = time.monotonic()
        self.launch()
        self.wait_amqp(timeout_s)
        return time.monotonic() - started_at

    def kill(self) -> int:
        """``kill -9`` this node's ``beam.smp``; return its PID once it is gone."""
        pid = self.beam_pid
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        # beam.smp is a child of the server script; if it has exited, its PID is not ours
        script = self._script
        kill_process(pid, parent=script.pid if script is not None else None)
        wait_gone(pid, timeout_s=STOP_TIMEOUT_S, what=f"beam.smp of {self.name}")
        self._reap_script()
        self.beam_pid = None
        return pid

    def stop(self) -> None:
        """Stop the node gracefully (``rabbitmqctl stop``), as a rolling restart does."""
        pid = self.beam_pid
        if pid is None:
            return
        self.ctl("stop", timeout_s=STOP_TIMEOUT_S)
        wait_gone(pid, timeout_s=STOP_TIMEOUT_S, what=f"beam.smp of {self.name} after stop")
        self._reap_script()
        self.beam_pid = None

    def is_alive(self) -> bool:
        return self.beam_pid is not None and not process_gone(self.beam_pid)

    def _reap_script(self) -> None:
        script = self._script
        if script is not None:
            try:
                script.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(script.pid, signal.SIGKILL)  # its own session: ours only
                script.wait(STOP_TIMEOUT_S)

    def _read_pid(self) -> str | None:
        try:
            text = (self.root / "beam.pid").read_text().strip()
        except OSError:
            return None
        return text if text.isdigit() else None

    # -- CLI ---------------------------------------------------------------------------------

    def cli(self, program: str, *args: str,
            timeout_s: float = _CTL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run ``program -n <this node> args...`` (a CLI tool of the node's install)."""
        argv, env = self.cluster.install.command(program, "-n", self.name, *args,
                                                 env=self.env())
        # stdin closed: the 4.3 root's CLI (Erlang 29) crashes on some inherited stdins
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, check=False)

    def ctl(self, *args: str, timeout_s: float = _CTL_TIMEOUT_S, check: bool = True) -> str:
        """Run ``rabbitmqctl -n <this node> args...``; return its standard output."""
        done = self.cli("rabbitmqctl", *args, timeout_s=timeout_s)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {self.name} {' '.join(args)} exited {done.returncode}: "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        return done.stdout

    def is_quorum_critical(self) -> bool:
        """Whether stopping this node now would leave a quorum queue without a majority."""
        return self.cli("rabbitmq-queues", "check_if_node_is_quorum_critical").returncode != 0

    def running_nodes(self) -> list[str]:
        """Nodes this node sees running in its cluster (empty while it cannot answer)."""
        done = self.cli("rabbitmqctl", "cluster_status", "--formatter", "json")
        if done.returncode != 0:
            return []
        try:
            return sorted(json.loads(done.stdout).get("running_nodes", []))
        except ValueError:
            return []

    def eval(self, expression: str) -> str:
        """Evaluate an Erlang expression on this node."""
        return self.ctl("eval", expression).strip()

    def partition(self) -> float:
        """Cut this node off from the others (a wrong cookie blocks the reconnects).

        Returns when (epoch seconds, the node's clock: this machine's) the cut took effect:
        the CLI needs seconds to reach the node (2-3 s on 3.10, 3-20 s on 4.3 under load
        here), so the moment of the call is not the moment of the fault.
        """
        others = self._other_names()
        return int(self.eval(
            f"Os=[{others}], [erlang:set_cookie(N, partitioned) || N <- Os], "
            "[erlang:disconnect_node(N) || N <- Os], os:system_time(millisecond)."
        )) / 1000

    def heal(self) -> float:
        """Undo :meth:`partition`: the right cookie again, and reconnect; return when the
        reconnects were made (epoch seconds, as :meth:`partition`)."""
        others = self._other_names()
        return int(self.eval(
            f"Os=[{others}], [erlang:set_cookie(N, erlang:get_cookie()) || N <- Os], "
            "[net_adm:ping(N) || N <- Os], os:system_time(millisecond)."
        )) / 1000

    def _other_names(self) -> str:
        return ",".join(f"'{n.name}'" for n in self.cluster.nodes if n is not self)


class RabbitCluster:
    """``size`` private RabbitMQ nodes in one cluster (``size=1``: a lone node).

    ``install``: where the nodes' RabbitMQ comes from, by default the one the run asked for
    (:func:`~tests.support.rabbitmq_root.requested_install`). Skips the calling test (with
    the reason) where the machine's ``rabbitmq-server`` is not installed; fails it where a
    requested root cannot be used. Boot with :meth:`start`; :meth:`close` kills every node
    and epmd started here and removes the temporary directory.
    """

    def __init__(self, size: int = 3, *, rabbit_env: dict[str, int] | None = None,
                 install: RabbitInstall | None = None) -> None:
        """``rabbit_env``: settings of the ``rabbit`` application (``advanced.config``)."""
        self.install = install or requested_install()
        unusable(self.install)
        self.root = self.install.make_dir("taskq-rabbit-nodes-")
        self.home = self.root / "home"
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(f"taskqnodes{os.getpid()}{int(time.time())}")
        cookie.chmod(0o400)
        (self.root / "env.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[].\n")
        entries = ", ".join(f"{{{key}, {value}}}" for key, value in (rabbit_env or {}).items())
        (self.root / "advanced.config").write_text(
            f"[{{rabbit, [{entries}]}}].\n" if entries else "[].\n"
        )
        self.epmd_port = free_port()
        self._epmd: subprocess.Popen[bytes] | None = None
        self.nodes = [RabbitNode(self, index) for index in range(1, size + 1)]
        names = [node.name for node in self.nodes]
        for node in self.nodes:
            node.write_config(names)
        self.boot_s: float | None = None

    def __enter__(self) -> RabbitCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        """One AMQP URL per node, in node order."""
        return [node.url for node in self.nodes]

    @property
    def broker_url(self) -> str:
        """Every node's URL, ``;``-separated (taskq's multi-node ``broker_url``)."""
        return ";".join(self.urls)

    def start(self, timeout_s: float = BOOT_TIMEOUT_S) -> float:
        """Boot epmd and every node; return once all run in one cluster (seconds taken)."""
        started_at = time.monotonic()
        self._epmd = subprocess.Popen(
            self.install.epmd_command(self.epmd_port), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.wait_amqp(timeout_s)
        self.wait_formed(timeout_s)
        self.boot_s = time.monotonic() - started_at
        logger.info("private RabbitMQ cluster of %d (%s) up in %.1fs: %s", len(self.nodes),
                    self.install.label, self.boot_s, self.nodes)
        return self.boot_s

    def wait_formed(self, timeout_s: float = BOOT_TIMEOUT_S, *, via: RabbitNode | None = None,
                    count: int | None = None) -> None:
        """Wait until ``count`` (default: all) nodes run in one cluster, as ``via`` sees it."""
        want = len(self.nodes) if count is None else count
        node = via or next(n for n in self.nodes if n.is_alive())
        wait_until(lambda: len(node.running_nodes()) == want, timeout_s=timeout_s,
                   interval_s=0.5, message=f"{want} nodes running in one cluster")

    def node_by_name(self, name: str) -> RabbitNode:
        return next(node for node in self.nodes if node.name == name)

    def queue_leader(self, queue: str) -> RabbitNode:
        """The node holding the leader of quorum queue ``queue``."""
        via = next(n for n in self.nodes if n.is_alive())
        text = via.ctl("list_queues", "name", "leader", "--formatter", "json")
        for row in json.loads(text):
            if row.get("name") == queue and row.get("leader"):
                return self.node_by_name(str(row["leader"]))
        raise LookupError(f"quorum queue {queue!r} has no leader listed")

    def deprecated_feature_lines(self) -> list[str]:
        """Every node's log lines so far that report a deprecated feature used."""
        return [line for node in self.nodes for line in node.deprecated_feature_lines()]

    def close(self) -> None:
        """Kill every node and epmd started here; remove the temporary directory."""
        for node in self.nodes:
            if node.beam_pid is not None:
                with contextlib.suppress(Exception):
                    node.kill()
            node._reap_script()
        epmd = self._epmd
        if epmd is not None and epmd.poll() is None:
            epmd.kill()
            epmd.wait(STOP_TIMEOUT_S)
        shutil.rmtree(self.root, ignore_errors=True)
