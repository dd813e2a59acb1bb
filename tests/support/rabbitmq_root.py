"""Which RabbitMQ the tests' private nodes run: the machine's own, or the one in a Debian root.

Private nodes (tests/support/rabbitmq_nodes.py: the cluster tests, the fault suite's node,
the slow layer's one-off nodes) run the machine's RabbitMQ (Debian 12's 3.10.8, scripts in
``/usr/lib/rabbitmq/bin``) unless ``TASKQ_TEST_RABBITMQ_ROOT`` names a root built by
``scripts/ensure-rabbitmq4.sh`` (Debian sid: RabbitMQ 4.3.6 on Erlang 29), e.g.
``TASKQ_TEST_RABBITMQ_ROOT=/opt/rmq43``. That root's programs need its own C library, so
they run through ``chroot <root> env -i <variables> <program>``; what follows from that:

- every file a node reads or writes (its home with the cookie, config, data, logs, PID
  file) lives inside the root, under ``<root>/tmp/taskq-*``: :meth:`RabbitInstall.make_dir`
  makes such a directory, :meth:`RabbitInstall.seen` turns a path of ours into the path the
  node sees (the same path on the machine's install);
- the node's environment is given on the ``env -i`` command line, so nothing of ours
  (``ERL_FLAGS``, ``PYTHONPATH``, the machine's Erlang) leaks in;
- its epmd is the root's, started the same way on a private port (never 4369, the machine's,
  nor the port of the root's shared node: that node and its epmd are never touched);
- PIDs stay ours to signal: ``chroot`` and ``env`` exec the program, so the PID that
  ``subprocess.Popen`` returns is the server script's (``beam.smp`` is its child) or epmd's.

``/proc`` must be mounted in the root (Erlang reads it; ``scripts/ensure-rabbitmq4.sh``
mounts it) and chroot needs root. When the root was asked for but cannot be used, the test
fails saying why: a 4.3 run never quietly falls back to 3.10.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

ROOT_ENV = "TASKQ_TEST_RABBITMQ_ROOT"
SCRIPTS = Path("/usr/lib/rabbitmq/bin")  # where Debian puts them, on the machine and in roots
_LIBRARY = Path("/usr/lib/rabbitmq/lib")
# The environment of a program in the root: the root's own PATH, and a UTF-8 locale (the
# 4.x CLI warns on Latin-1) that every glibc since 2.35 has built in.
_ROOT_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}


class RabbitInstall:
    """One RabbitMQ installation that private nodes can run from (module docstring).

    ``root=None`` is the machine's own install; otherwise a Debian root holding
    ``rabbitmq-server``.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"<RabbitInstall {self.label}>"

    @property
    def label(self) -> str:
        """``RabbitMQ 4.3.6 (root /opt/rmq43)``: for logs and skip or failure reasons."""
        where = "the machine's" if self.root is None else f"root {self.root}"
        return f"RabbitMQ {self.version() or '?'} ({where})"

    def _host(self, path: Path) -> Path:
        """Where a path of the install (as its programs see it) is on this machine."""
        return path if self.root is None else self.root / path.relative_to("/")

    def version(self) -> str | None:
        """The installed server's version (``3.10.8``, ``4.3.6``), from its library folder."""
        try:
            names = [p.name for p in self._host(_LIBRARY).iterdir()]
        except OSError:
            return None
        found = [m.group(1) for m in map(re.compile(r"rabbitmq_server-(\d[\w.]*)$").match,
                                         names) if m]
        return max(found, key=_version_key) if found else None

    def version_tuple(self) -> tuple[int, ...]:
        """:meth:`version` as numbers (``(4, 3, 6)``); ``()`` when unknown."""
        version = self.version()
        return _version_key(version) if version else ()

    @property
    def khepri_only(self) -> bool:
        """Whether the nodes keep their metadata in Khepri (Raft), with no Mnesia.

        RabbitMQ 4.2 made Khepri the default store of a new cluster and 4.3 removed Mnesia,
        and with it the partition handling modes (``cluster_partition_handling`` is still
        parsed but does nothing). Before 4.2 a new cluster is on Mnesia.
        """
        return self.version_tuple() >= (4, 2)

    def missing_reason(self) -> str | None:
        """Why private nodes cannot run from this install, or ``None`` when they can."""
        if not self._host(SCRIPTS / "rabbitmq-server").exists():
            return f"rabbitmq-server is not installed ({self._host(SCRIPTS)}/rabbitmq-server " \
                   "is missing)" + ("" if self.root is None else
                                    ": build the root with scripts/ensure-rabbitmq4.sh")
        if self.root is None:
            return None if shutil.which("epmd") else "epmd (Erlang) is not on PATH"
        if os.geteuid() != 0:
            return f"running RabbitMQ from the root {self.root} needs chroot, so root"
        if shutil.which("chroot") is None:
            return "chroot is not on PATH"
        if not os.path.ismount(self.root / "proc"):
            return (f"/proc is not mounted in {self.root} (Erlang reads it): "
                    "scripts/ensure-rabbitmq4.sh mounts it")
        return None

    def make_dir(self, prefix: str) -> Path:
        """A new private directory for a node's files, inside the root when there is one."""
        parent = None if self.root is None else self.root / "tmp"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))

    def seen(self, path: Path) -> str:
        """``path`` (of :meth:`make_dir`) as the install's programs see it."""
        if self.root is None:
            return str(path)
        return "/" + str(path.relative_to(self.root))

    def command(
        self, program: str, *args: str, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """Argument list and environment that run ``program`` of ``SCRIPTS`` with ``env``.

        ``env`` holds the node's variables (paths as :meth:`seen` gives them); on the
        machine's install they are added to this process's environment, without
        ``ERL_FLAGS``; in a root they are all the program gets.
        """
        if self.root is None:
            base = {k: v for k, v in os.environ.items() if k != "ERL_FLAGS"}
            return [str(SCRIPTS / program), *args], {**base, **env}
        variables = [f"{k}={v}" for k, v in {**_ROOT_BASE_ENV, **env}.items()]
        argv = ["chroot", str(self.root), "env", "-i", *variables, str(SCRIPTS / program),
                *args]
        return argv, dict(os.environ)

    def epmd_command(self, port: int) -> list[str]:
        """An epmd of its own on 127.0.0.1:``port`` (the PID Popen returns is epmd's)."""
        argv = ["epmd", "-port", str(port), "-address", "127.0.0.1"]
        if self.root is None:
            return argv
        return ["chroot", str(self.root), "/usr/bin/epmd", *argv[1:]]


HOST = RabbitInstall(None)


def requested_install() -> RabbitInstall:
    """The install this test run asked for: ``TASKQ_TEST_RABBITMQ_ROOT``, else the machine's.

    Read at each call: the project's autouse fixture leaves ``TASKQ_TEST_*`` variables alone.
    """
    root = os.environ.get(ROOT_ENV, "").strip()
    return RabbitInstall(Path(root)) if root else HOST


def unusable(install: RabbitInstall) -> None:
    """Skip (the machine's install is missing) or fail (a requested root is unusable).

    A run that asked for a root must not pass on another broker, so a root that cannot be
    used is a failure naming the reason; the machine's RabbitMQ missing skips, as before.
    """
    reason = install.missing_reason()
    if reason is None:
        return
    import pytest

    print(f"private RabbitMQ nodes: {reason}")  # shown with -s, and in the reason
    if install.root is None:
        pytest.skip(reason)
    pytest.fail(f"{ROOT_ENV}={install.root}: {reason}", pytrace=False)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])
