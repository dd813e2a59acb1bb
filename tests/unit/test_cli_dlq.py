"""`taskq dlq` argument parsing (CliRunner); the commands' effects are system-tested."""

from __future__ import annotations

from click.testing import CliRunner

from taskq.cli import main


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["dlq", *args])
    return result.exit_code, result.output


def test_the_dlq_group_offers_list_replay_and_purge() -> None:
    code, output = run("--help")

    assert code == 0
    assert all(command in output for command in ("list", "replay", "purge"))


def test_a_queue_or_unroutable_is_required_before_anything_connects() -> None:
    code, output = run("list", "-A", "tests.tasks:app")

    assert code == 2
    assert "Error: give the work queue" in output


def test_an_invalid_queue_name_is_a_usage_error() -> None:
    code, output = run("purge", "bad queue!", "-A", "tests.tasks:app", "--yes")

    assert code == 2
    assert "queue name 'bad queue!' is invalid" in output


def test_limits_must_be_positive() -> None:
    code, output = run("replay", "emails", "-A", "tests.tasks:app", "--limit", "0")

    assert code == 2
    assert "--limit" in output
