"""``did you mean ...?``: the names closest to one a user mistyped (pure, no I/O)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, candidates: Iterable[str], *, limit: int = 3) -> list[str]:
    """The candidates ``name`` most likely meant, best first (none when nothing is close).

    A task name given without its module (``send`` for ``shop.tasks.send``) matches by its
    last dotted parts (all of them, the name being ambiguous); otherwise spelling decides
    (``difflib``) and only the best match is offered.
    """
    pool = sorted(set(candidates))
    tail = [c for c in pool if c != name and c.endswith("." + name)]
    if tail:
        return tail[:limit]
    return difflib.get_close_matches(name, pool, n=1, cutoff=0.6)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidates, or ``""``."""
    matches = closest(name, candidates)
    if not matches:
        return ""
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)"
