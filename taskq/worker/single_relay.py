"""One outbox relay per SQLite database: the second one is refused, like a second scheduler.

On SQLite the relay cannot lock the rows it publishes (no ``SKIP LOCKED``), so two relays
read the same rows and publish each of them twice. The relay holds an exclusive ``flock`` on
a file beside the database (``<database>.relay-lock``) while it runs; the kernel releases it
when the process ends however it ends (SIGKILL included), so a dead relay never blocks the
next. The file names the holder (host and pid) for the refusal's message. PostgreSQL needs
none of this: its relays claim rows with ``SKIP LOCKED`` and any number may run.
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import TYPE_CHECKING

from taskq.errors import ConfigurationError
from taskq.settings import redact_url

if TYPE_CHECKING:
    from taskq.app import App

LOCK_SUFFIX = ".relay-lock"


class RelayLock:
    """The relay lock of one app's SQLite database file (nothing to hold on PostgreSQL).

    Args:
        app: The relay's app.
    """

    def __init__(self, app: App) -> None:
        self._app = app
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or refuse.

        Raises:
            ConfigurationError: another relay holds it; the message names that relay.
        """
        path = _lock_path(self._app)
        if path is None:
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigurationError(
                f"another outbox relay already runs on the SQLite database "
                f"{redact_url(self._app.settings.database_url)} ({holder}; lock file "
                f"{path}). SQLite supports one relay (a second would publish every row "
                "twice): stop that one, or use PostgreSQL to run several"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the next relay take the database (closing the file releases the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lock_path(app: App) -> str | None:
    url = app.engine.url
    database: str | None = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):  # a URI filename (sqlite:///file:x.db?uri=true)
        database = database[len("file:"):].split("?", 1)[0]
    return os.path.abspath(database) + LOCK_SUFFIX
