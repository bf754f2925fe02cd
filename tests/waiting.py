"""Waiting for a condition, never for a fixed time: what tests use instead of ``sleep``.

::

    record = wait_until(lambda: path.exists(), what=f"{path} written")            # plain code
    await wait_until_async(lambda: k.devices(NIC) == want, what="the NIC listed")  # asyncio

Both call ``predicate()`` every ``interval`` seconds until it returns something truthy and
return that value. At the deadline they raise an AssertionError that says what was awaited,
for how long, and what ``state()`` (when given) reports then::

    AssertionError: timed out after 10 s waiting for the NIC listed; state: {...}

The deadline only bounds a hang (the machine running the tests may be slow and shared), so it
is generous, and a test never asserts on how long a wait took: time and size targets are
``bench/``'s. Where the thing awaited can notify (an ``asyncio.Condition``, an ``Event``),
wait on that instead, as the kubelet stand-ins' ``wait_for`` do.

A sleep that stays in ``tests/`` is part of the scenario (a slow peer, a device busy for a
while, time that must pass for a debounce or a grace period) and says so in a comment.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds: long enough for a loaded 2-core machine, short against the per-test timeout.
DEFAULT_TIMEOUT = 10.0
DEFAULT_INTERVAL = 0.01


def _failure(what: str, timeout: float, state: Callable[[], object] | None) -> AssertionError:
    detail = ""
    if state is not None:
        try:
            detail = f"; state: {state()!r}"
        except Exception as e:  # the message must not hide the timeout
            detail = f"; state() raised {e!r}"
    return AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")


def wait_until(
    predicate: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it is truthy (its value is returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, state)
        time.sleep(interval)  # the poll period, not a wait for something to happen


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T | None] | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    state: Callable[[], object] | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_until` on the event loop: other tasks run between two polls.

    ``predicate`` may be a coroutine function (a request per poll); an exception listed in
    ``retry_on`` counts as "not yet" (e.g. ``ssl.SSLError`` until a certificate rotates)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except retry_on:
            value = None
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, state)
        await asyncio.sleep(interval)  # the poll period, not a wait for something to happen
