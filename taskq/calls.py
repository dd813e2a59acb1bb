"""Whether a call fits a task function's signature, checked when it is enqueued.

A call that the function could not accept (a missing argument, one too many, an unknown
keyword) would be accepted by the broker and fail in a worker, later and elsewhere. The road
(:mod:`taskq.road`) checks every new message here first and raises the ``TypeError`` that
calling the function would raise, naming the task. Pure: no I/O.

Enqueueing is a hot path, so the common shape (positional-or-keyword parameters, with or
without defaults) is checked with a few set and length operations prepared once per task;
only a call that fails that check, or a function with positional-only, keyword-only or
variadic parameters, goes through :meth:`inspect.Signature.bind`, which also writes
Python's own message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_SIMPLE = inspect.Parameter.POSITIONAL_OR_KEYWORD


class CallShape:
    """The parameters of one task function, prepared to check calls quickly.

    Args:
        fn: The task function.
        task: The task's registered name, for the error.
        bound: ``bind=True``: the function's first parameter is the task itself and is not
            part of a call.
        injected: Parameters the worker passes itself (``session`` of a transactional
            task), which a call must not need.
    """

    def __init__(
        self, fn: Callable[..., Any], *, task: str, bound: bool, injected: tuple[str, ...] = ()
    ) -> None:
        self._task = task
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin or C function without a signature
            self._signature: inspect.Signature | None = None
            self._simple = False
            return
        parameters = [
            p for p in list(signature.parameters.values())[1 if bound else 0:]
            if p.name not in injected
        ]
        self._signature = signature.replace(parameters=parameters)
        self._simple = all(p.kind is _SIMPLE for p in parameters)
        self._names = tuple(p.name for p in parameters)
        self._known = frozenset(self._names)
        # In a simple signature every required parameter comes before the defaulted ones.
        self._required = tuple(
            p.name for p in parameters if p.default is inspect.Parameter.empty
        )
        self._most = len(parameters)

    def check(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> None:
        """Raise ``TypeError`` if the function could not be called with ``args, kwargs``.

        Raises:
            TypeError: the message Python gives for that call, prefixed with the task name.
        """
        if self._simple and self._fits(args, kwargs):
            return
        if self._signature is None:
            return
        try:
            self._signature.bind(*args, **(kwargs or {}))
        except TypeError as exc:
            raise TypeError(
                f"task {self._task!r} cannot be called with these arguments: {exc} "
                f"(its signature is {self._signature}); nothing was enqueued"
            ) from None

    def _fits(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> bool:
        given = len(args)
        if not kwargs:
            return len(self._required) <= given <= self._most
        if given > self._most or not self._known.issuperset(kwargs):
            return False
        for name in self._names[:given]:
            if name in kwargs:
                return False  # given twice, positionally and by keyword
        for name in self._required[given:]:
            if name not in kwargs:
                return False
        return True
