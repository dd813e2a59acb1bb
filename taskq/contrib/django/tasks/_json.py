"""Arguments and return values that JSON holds exactly, as ``django.tasks`` requires.

Django's ``normalize_json`` turns tuples into lists and UTF-8 bytes into str and refuses
other types (TypeError). Two things it lets through would not survive JSON, and taskq's
msgpack would carry them unchanged, so a value would differ between the worker and a
JSON-based backend: dict keys that are not strings (JSON makes ``1`` into ``"1"``) and
NaN or infinite floats (not JSON at all; PostgreSQL's jsonb refuses them). They are refused.
"""

from __future__ import annotations

import math
from typing import Any


def json_value(value: Any, *, what: str) -> Any:
    """``normalize_json(value)``, refusing what JSON would change.

    Args:
        value: Arguments (a list or dict) or a return value.
        what: Names the value in the error, e.g. ``"task shop.tasks.send args"``.

    Raises:
        TypeError: a type JSON cannot hold, or a dict key that is not a str.
        ValueError: NaN or an infinite float, or bytes that are not UTF-8.
    """
    from taskq.contrib.django.tasks._api import normalize_json

    normalized = normalize_json(value)
    _check(normalized, what)
    return normalized


def _check(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path} is {value!r}, which JSON cannot hold")
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{path} has the key {key!r}: JSON object keys are strings; use "
                    f"{str(key)!r}"
                )
            _check(item, f"{path}[{key!r}]")
