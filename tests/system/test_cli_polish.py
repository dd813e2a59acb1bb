"""What the CLI shows a newcomer (issue 28, item 6), through the real commands.

Help lists every command's description whole; tables keep their columns in line whatever a
cron schedule or a task name spans; the worker counts "1 process"; ``taskq db --help`` names
every table of ``taskq.metadata``; the metrics and health server binds loopback unless
``--metrics-host`` says otherwise.
"""

from __future__ import annotations

import re
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from taskq import App, metadata
from taskq.cli import main
from tests.conftest import BROKER_URL
from tests.support.rabbitmq_nodes import free_port
from tests.support.waiting import wait_until
from tests.system.cli_user import run_taskq, write_module

SCHEDULED = """
    import taskq

    app = taskq.App("cols", database_url="sqlite:///cols.sqlite3")


    @app.task
    def send_the_weekly_digest_to_every_subscriber() -> None:
        print("digest")


    @app.task
    def tick() -> None:
        print("tick")


    app.add_periodic_task(
        taskq.crontab("*/5 9-17 * * mon-fri", timezone="Europe/Berlin"),
        send_the_weekly_digest_to_every_subscriber, name="weekly-digest-for-subscribers",
    )
    app.add_periodic_task(60, tick, name="tick")
"""


def _groups() -> list[tuple[str, click.Group]]:
    groups: list[tuple[str, click.Group]] = [("", main)]
    groups += [(name, command) for name, command in main.commands.items()
               if isinstance(command, click.Group)]
    return groups


@pytest.mark.parametrize(("name", "group"), _groups(), ids=lambda v: v or "taskq")
def test_help_lists_each_command_description_whole(name: str, group: click.Group) -> None:
    result = CliRunner().invoke(main, [*([name] if name else []), "--help"])

    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:", 1)[1].strip().splitlines()
    assert len(listed) == len(group.commands)
    for line in listed:
        assert not line.rstrip().endswith("..."), line


def test_db_help_names_every_table_taskq_keeps() -> None:
    result = CliRunner().invoke(main, ["db", "--help"])

    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for table in metadata.sorted_tables:
        assert table.name in text
    assert "taskq_workflows" in text and "taskq_workflow_members" in text


def _cells(line: str) -> list[tuple[int, int]]:
    """Spans of the cells of a table line (cells are separated by two spaces or more)."""
    return [match.span() for match in re.finditer(r"\S+(?: \S+)*", line)]


def _columns_in_line(lines: list[str], header: str) -> None:
    """Every cell of the rows under ``header`` lines up with its header's cell, on the left
    (text) or on the right (numbers)."""
    top = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
    heads = _cells(lines[top])
    for line in lines[top + 1:top + 3]:
        cells = _cells(line)
        assert len(cells) == len(heads), (lines[top], line)
        for (start, end), (head_start, head_end) in zip(cells, heads, strict=True):
            assert start == head_start or end == head_end, (lines[top], line)


def test_beat_list_keeps_its_columns_in_line_with_a_cron_schedule(tmp_path: Path) -> None:
    write_module(tmp_path, "colapp.py", SCHEDULED)
    assert run_taskq(tmp_path, "db", "create", "-A", "colapp:app").returncode == 0

    result = run_taskq(tmp_path, "beat", "list", "-A", "colapp:app")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "cron */5 9-17 * * mon-fri Europe/Berlin" in result.stdout
    _columns_in_line(lines, "schedule")


def test_status_keeps_its_columns_in_line_with_a_cron_schedule_and_a_long_queue(
    tmp_path: Path, make_app: Callable[..., App], namespace: str
) -> None:
    long_queue = f"{namespace}.a-queue-name-longer-than-thirty-two-characters"
    make_app().queue(long_queue)  # its finaliser deletes what the status declared
    write_module(tmp_path, "colapp.py", SCHEDULED + f"    app.queue({long_queue!r})\n")
    env = {"TASKQ_BROKER_URL": BROKER_URL, "TASKQ_NAMESPACE": namespace,
           "TASKQ_DEFAULT_QUEUE": f"{namespace}.default"}
    assert run_taskq(tmp_path, "db", "create", "-A", "colapp:app", env=env).returncode == 0

    result = run_taskq(tmp_path, "status", "-A", "colapp:app", env=env)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    _columns_in_line(lines, "queue")
    _columns_in_line(lines, "schedule")


def _listening_address(port: int) -> str | None:
    """The local address of the socket listening on TCP ``port`` (from /proc/net/tcp)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                if len(address) == 8:
                    return ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
                return address
    return None


def _healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@pytest.mark.parametrize(("given", "bound"), [((), "127.0.0.1"), (("0.0.0.0",), "0.0.0.0")])
def test_the_metrics_server_binds_loopback_unless_told(
    start_worker: Callable[..., Any], given: tuple[str, ...], bound: str
) -> None:
    port = free_port()
    host_option = ("--metrics-host", *given) if given else ()

    worker = start_worker("-c", "1", "--metrics-port", str(port), *host_option,
                          loglevel="INFO")

    wait_until(lambda: f"metrics on http://{bound}:{port}/metrics" in worker.log(),
               timeout_s=30, message=lambda: f"the metrics line; log:\n{worker.log()}")
    assert _listening_address(port) == bound
    wait_until(lambda: _healthz(port) in (200, 503), timeout_s=10)
    assert "taskq worker for app taskq-tests: 1 process consuming" in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_metrics_host_is_in_the_worker_help() -> None:
    result = CliRunner().invoke(main, ["worker", "--help"])

    assert "--metrics-host HOST" in result.output
    assert "[default: 127.0.0.1]" in " ".join(result.output.split())
