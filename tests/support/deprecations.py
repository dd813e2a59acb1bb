"""Did a run use a deprecated RabbitMQ feature? The 4.x node's own log says so.

RabbitMQ 4.x writes ``Deprecated features: `<name>`: ...`` to its log when something uses a
deprecated feature (global QoS, transient non-exclusive queues, ...), at warning level while
the feature is still permitted, at error level once it is not. Nothing else reports a use:
``rabbitmqctl list_deprecated_features --used`` stays empty.

It writes that line only once per feature in 24 hours of a node's life (*measured* on 4.3.6,
``rabbit_deprecated_features:should_log_warning/1``: the time of the last warning is kept in
a ``persistent_term`` keyed ``{rabbit_deprecated_features, Feature}``). A use after an
earlier one, by an earlier run on the same node, would leave no line. So a check first
forgets those times (:func:`forget_warnings`), then notes where the log ends
(:func:`open_window`), and at its end reads what was added (:func:`close_window`). The node
writes its log with a delay (seconds, *measured*), so the end of a window is a line the check
has the node log itself, awaited before the window is read.

``tests/conftest.py`` does that around a whole session whose broker is the 4.x node of
``tests/support/rabbitmq4.py``; a test of the check itself uses a window of its own and
:func:`excuse` for the lines it caused on purpose, so the session does not count them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.rabbitmq4 import ROOT, Rabbit4
from tests.support.waiting import wait_until

MARK = "Deprecated features"
_FLUSH_TIMEOUT_S = 60.0

# Lines a test caused on purpose (exact text, timestamp and Erlang PID included): every
# check leaves them out, also that of another session on the same node at the same time
# (so they are kept in a file beside the node, not only in this process).
_excused: set[str] = set()
EXCUSED_FILE = ROOT / "tmp" / "taskq-deprecations-excused.txt"


def node_log() -> Path:
    """The 4.x node's log file inside its root (``RMQ4_ROOT``, ``RMQ4_NODE``)."""
    node = os.environ.get("RMQ4_NODE", "r43@localhost")
    return ROOT / "var" / "log" / "rabbitmq" / f"{node}.log"


@dataclass(frozen=True)
class LogWindow:
    """The part of a log written after :func:`open_window`: its file, inode and start."""

    path: Path
    inode: int
    start: int


def open_window(path: Path | None = None) -> LogWindow:
    """Note where ``path`` (default: the 4.x node's log) ends now.

    Raises:
        FileNotFoundError: there is no such log (the node's root is elsewhere: RMQ4_ROOT).
    """
    path = path or node_log()
    stat = path.stat()
    return LogWindow(path, stat.st_ino, stat.st_size)


def new_lines(window: LogWindow) -> list[str]:
    """Every line written to the window's log since it was opened.

    A log that was replaced or truncated meanwhile (rotation) is read from its beginning.
    """
    stat = window.path.stat()
    start = window.start
    if stat.st_ino != window.inode or stat.st_size < start:
        start = 0
    with open(window.path, "rb") as log:
        log.seek(start)
        data = log.read()
    return data.decode("utf-8", errors="replace").splitlines()


def deprecated_lines(window: LogWindow) -> list[str]:
    """The lines of the window that report a deprecated feature used, less excused ones."""
    excused = _excused | _excused_elsewhere()
    return [line for line in new_lines(window) if MARK in line and line not in excused]


def _excused_elsewhere() -> set[str]:
    try:
        return set(EXCUSED_FILE.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return set()


def close_window(window: LogWindow, node: Rabbit4 | None = None) -> list[str]:
    """:func:`deprecated_lines` of ``window`` once the node has written all it logged so far.

    Raises:
        RuntimeError: the node's ``rabbitmqctl`` failed.
        AssertionError: the node's own line did not reach its log within a minute.
    """
    token = f"taskq deprecated-feature check: end of window {uuid.uuid4().hex}"
    (node or Rabbit4()).ctl("eval", f'logger:notice("~ts", ["{token}"]).')
    wait_until(lambda: any(token in line for line in new_lines(window)),
               timeout_s=_FLUSH_TIMEOUT_S, interval_s=0.2,
               message=f"the node to write {token!r} to {window.path}")
    return deprecated_lines(window)


def excuse(lines: list[str]) -> None:
    """Leave ``lines`` (caused on purpose by a test) out of every later check."""
    _excused.update(lines)
    with open(EXCUSED_FILE, "a", encoding="utf-8") as file:
        file.writelines(f"{line}\n" for line in lines)


def forget_warnings(node: Rabbit4 | None = None) -> None:
    """Make the node log the next use of every deprecated feature again (module docstring).

    Only the node's note of when it last warned is erased; nothing it does changes.

    Raises:
        RuntimeError: the node's ``rabbitmqctl`` failed.
    """
    (node or Rabbit4()).ctl(
        "eval",
        "[persistent_term:erase(K) || {K = {rabbit_deprecated_features, _}, _} "
        "<- persistent_term:get()], ok.",
    )
