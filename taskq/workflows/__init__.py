"""Workflows: chains, groups and chords whose joins are counted exactly once.

See :mod:`taskq.workflows.canvas` for building them, :mod:`taskq.workflows.store` for the
tables and the join, :mod:`taskq.workflows.completion` for the worker's side, and
docs/workflows.md for the guarantees.
"""

from __future__ import annotations

from taskq.workflows.canvas import Chain, Chord, Group, Signature, chain, chord, group
from taskq.workflows.result import WorkflowResult
from taskq.workflows.store import MemberState, WorkflowState

__all__ = [
    "Chain",
    "Chord",
    "Group",
    "MemberState",
    "Signature",
    "WorkflowResult",
    "WorkflowState",
    "chain",
    "chord",
    "group",
]
