"""Test layers switched on by an environment variable: the fault suite and the cluster tests.

A developer's ``make test`` collects them with their markers and skips them; CI (``.ci/run``)
sets the variables. Each layer prints one counts line per scenario, gathered here and shown
in a section of pytest's summary.
"""

from __future__ import annotations

import pytest


def skip_unless_enabled(
    config: pytest.Config, items: list[pytest.Item], *, marker: str, enabled: bool, how: str
) -> None:
    """Skip the items marked ``marker`` unless ``enabled`` or selected with ``-m marker``."""
    markexpr = config.getoption("markexpr", "") or ""
    if enabled or (marker in markexpr and f"not {marker}" not in markexpr):
        return
    skip = pytest.mark.skip(reason=how)
    for item in items:
        if item.get_closest_marker(marker) is not None:
            item.add_marker(skip)


def record_line(config: pytest.Config, key: pytest.StashKey[list[str]], line: str) -> None:
    """Keep ``line`` for the summary section of ``key``."""
    config.stash.setdefault(key, []).append(line)


def write_summary(
    reporter: pytest.TerminalReporter, key: pytest.StashKey[list[str]], title: str
) -> None:
    """Write the lines kept under ``key`` in a section named ``title`` (none: nothing)."""
    lines = reporter.config.stash.get(key, [])
    if lines:
        reporter.section(title)
        for line in lines:
            reporter.write_line(line)
