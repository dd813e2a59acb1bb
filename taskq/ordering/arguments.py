"""Which argument of a call is its ordering key (``@app.task(ordering_key="account_id")``).

The position of the named parameter is found once per task, so each call costs a dict lookup
or an index, not an ``inspect.Signature.bind``. Pure: no I/O.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from taskq.errors import ConfigurationError

_MISSING = object()


class KeyArgument:
    """Reads the ordering key of a call from the argument named ``name``.

    Args:
        fn: The task function (``bind=True``: without its first, ``self``, parameter).
        name: The parameter holding the key.
        task: Task name, for errors.
        bound: The task is ``bind=True``: skip the function's first parameter.

    Raises:
        ConfigurationError: the function has no parameter ``name``.
    """

    def __init__(self, fn: Callable[..., Any], name: str, *, task: str, bound: bool) -> None:
        parameters = list(inspect.signature(fn).parameters.values())[1 if bound else 0:]
        by_name = {p.name: (i, p) for i, p in enumerate(parameters)}
        if name not in by_name or by_name[name][1].kind in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
        ):
            raise ConfigurationError(
                f"task {task!r}: ordering_key={name!r} names no parameter of the function; "
                f"use one of {', '.join(by_name) or '(none)'}, or give the key per call with "
                "apply_async(..., ordering_key=...)",
                task=task,
            )
        index, parameter = by_name[name]
        self.name = name
        self._task = task
        positional = parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        self._index = index if positional else -1
        self._default = (
            _MISSING if parameter.default is inspect.Parameter.empty else parameter.default
        )

    def of(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> Any:
        """The value of the key argument in this call.

        Raises:
            ConfigurationError: the call does not give it and it has no default.
        """
        if kwargs and self.name in kwargs:
            return kwargs[self.name]
        if 0 <= self._index < len(args):
            return args[self._index]
        if self._default is not _MISSING:
            return self._default
        raise ConfigurationError(
            f"task {self._task!r}: the call gives no {self.name!r} argument, which is its "
            "ordering key",
            task=self._task,
        )
