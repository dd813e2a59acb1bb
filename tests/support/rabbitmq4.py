"""The private RabbitMQ 4.x node beside the machine's 3.10: its URL, its CLI, a test's vhosts.

The node (built by ``scripts/ensure-rabbitmq4.sh``, or started by hand: see
``/work/shared/notes/rabbitmq-4.md``) runs in a root of its own with its own epmd, so its
``rabbitmqctl`` is the root's, run through ``chroot``. Tests never stop or reconfigure it:
each works in a vhost of its own, created and deleted here.

Settings (environment):

- ``TASKQ_TEST_RABBITMQ4_URL``: the node's AMQP URL, default
  ``amqp://guest:guest@127.0.0.1:5673/%2F`` (its vhost part is replaced by the test's vhost);
- ``TASKQ_TEST_RABBITMQ4_CTL``: the whole ``rabbitmqctl`` command for the node, else it is
  built from ``RMQ4_ROOT`` (``/opt/rmq43``), ``RMQ4_NODE`` (``r43@localhost``) and
  ``RMQ4_EPMD_PORT`` (``4373``), the names ``scripts/ensure-rabbitmq4.sh`` uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import pika

from tests.support.rabbitmq_nodes import speaks_amqp

URL = os.environ.get("TASKQ_TEST_RABBITMQ4_URL", "amqp://guest:guest@127.0.0.1:5673/%2F")
ROOT = Path(os.environ.get("RMQ4_ROOT", "/opt/rmq43"))
_CTL_TIMEOUT_S = 120.0


def ctl_command() -> list[str]:
    """The ``rabbitmqctl`` command that reaches the 4.x node (module docstring)."""
    explicit = os.environ.get("TASKQ_TEST_RABBITMQ4_CTL")
    if explicit:
        return shlex.split(explicit)
    return [
        "chroot", str(ROOT), "env", "HOME=/var/lib/rabbitmq",
        f"ERL_EPMD_PORT={os.environ.get('RMQ4_EPMD_PORT', '4373')}",
        "rabbitmqctl", "-n", os.environ.get("RMQ4_NODE", "r43@localhost"),
    ]


class Rabbit4:
    """The 4.x node: its version, its CLI, and vhosts of a test's own."""

    def __init__(self, url: str = URL) -> None:
        self.url = url
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 5672
        self.userinfo = parsed.netloc.rsplit("@", 1)[0]

    def unavailable_reason(self) -> str | None:
        """Why the node cannot be used here, or ``None`` when it can."""
        if not speaks_amqp(self.port):
            return (f"no RabbitMQ 4.x node answers at {self.host}:{self.port} "
                    "(TASKQ_TEST_RABBITMQ4_URL; scripts/ensure-rabbitmq4.sh starts one)")
        try:
            version = self.version()
        except (OSError, pika.exceptions.AMQPError) as exc:
            return f"the RabbitMQ node at {self.host}:{self.port} refused us: {exc}"
        if not version.startswith("4."):
            return f"the node at {self.host}:{self.port} runs RabbitMQ {version}, not 4.x"
        try:
            self.ctl("status")
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            return f"its rabbitmqctl does not answer ({' '.join(ctl_command())}): {exc}"
        return None

    def version(self) -> str:
        """The server's ``version`` property."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            value = (connection._impl.server_properties or {}).get("version", b"?")
        finally:
            connection.close()
        return value.decode() if isinstance(value, bytes) else str(value)

    def vhost_url(self, vhost: str) -> str:
        """The node's AMQP URL for ``vhost``."""
        return f"amqp://{self.userinfo}@{self.host}:{self.port}/{quote(vhost, safe='')}"

    def ctl(self, *args: str) -> str:
        """Run the node's ``rabbitmqctl args...``; return its standard output."""
        done = subprocess.run(
            [*ctl_command(), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=_CTL_TIMEOUT_S, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on the 4.x node exited {done.returncode}: "
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        return done.stdout

    @contextlib.contextmanager
    def vhost(self, prefix: str) -> Iterator[str]:
        """A fresh vhost that guest may use; deleted (with all in it) afterwards."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.ctl("add_vhost", name)
        try:
            self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
            yield name
        finally:
            self.ctl("delete_vhost", name)

    def import_topology(self, definitions: dict[str, Any], vhost: str) -> None:
        """Import the queues, exchanges and bindings of ``definitions`` into ``vhost``.

        Users, permissions, parameters and policies of the file are left out: the node is
        shared, and guest's password must stay what it is.
        """
        moved: dict[str, Any] = {
            kind: [{**item, "vhost": vhost} for item in definitions.get(kind, [])]
            for kind in ("queues", "exchanges", "bindings")
        }
        # A file inside the root: the root's rabbitmqctl (Erlang 29) crashes reading stdin.
        path = ROOT / "tmp" / f"taskq-definitions-{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(moved))
        try:
            self.ctl("import_definitions", f"/tmp/{path.name}")
        finally:
            path.unlink(missing_ok=True)

    def queues(self, vhost: str) -> dict[str, dict[str, Any]]:
        """``{name: {"type": ..., "arguments": {...}}}`` of every queue in ``vhost``."""
        return list_queues(self.ctl("list_queues", "-p", vhost, "--formatter", "json",
                                    "name", "type", "arguments"))


def list_queues(json_text: str) -> dict[str, dict[str, Any]]:
    """Parse ``rabbitmqctl list_queues --formatter json name type arguments`` output."""
    rows = json.loads(json_text or "[]")
    return {row["name"]: {"type": row["type"], "arguments": _arguments(row["arguments"])}
            for row in rows}


def _arguments(value: Any) -> dict[str, Any]:
    # 4.x prints a table as a JSON object, 3.10 as a list of [name, type, value].
    if isinstance(value, dict):
        return value
    return {item[0]: item[-1] for item in value}
