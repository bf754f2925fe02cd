"""The shared wait helper: returns what the condition found, fails naming what it waited for."""

from __future__ import annotations

import asyncio

import pytest

from tests.waiting import wait_until, wait_until_async


def test_returns_the_first_truthy_value() -> None:
    seen = iter([None, 0, "", "ready"])
    assert wait_until(lambda: next(seen), what="ready", interval=0) == "ready"


def test_fails_with_what_and_the_state_at_the_deadline() -> None:
    with pytest.raises(AssertionError) as e:
        wait_until(lambda: False, what="the moon", timeout=0.05, state=lambda: {"moon": "no"})
    assert str(e.value) == "timed out after 0.05 s waiting for the moon; state: {'moon': 'no'}"


def test_a_broken_state_callback_does_not_hide_the_timeout() -> None:
    with pytest.raises(AssertionError, match=r"waiting for x; state\(\) raised KeyError"):
        wait_until(lambda: False, what="x", timeout=0.01, state=lambda: {}["k"])


async def test_async_awaits_coroutine_predicates_and_retries_listed_errors() -> None:
    calls: list[int] = []

    async def probe() -> int | None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return len(calls)

    assert await wait_until_async(probe, what="probe", retry_on=(ConnectionError,)) == 3
    with pytest.raises(ValueError):  # an error not listed is the test's failure, not a retry
        await wait_until_async(lambda: int("x"), what="never")


async def test_async_lets_other_tasks_run_between_polls() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, done.set)
    assert await wait_until_async(done.is_set, what="the timer", timeout=5)
    with pytest.raises(AssertionError, match=r"timed out after 0\.02 s waiting for nothing"):
        await wait_until_async(lambda: None, what="nothing", timeout=0.02)
