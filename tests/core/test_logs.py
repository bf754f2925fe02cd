"""The log formats (vfio_dp.core.logs): JSON lines with the claim's fields, and bounds on
every line, through a real logger and handler writing to a buffer."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from vfio_dp.core.logs import (
    MAX_MESSAGE,
    MAX_TRACEBACK,
    JsonFormatter,
    TextFormatter,
    claim_context,
)


@pytest.fixture
def out() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter("node-1"))
    log = logging.getLogger("vfio_dp.test_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log, buf, handler
    log.removeHandler(handler)


def lines(buf: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


async def test_each_claims_lines_name_it_also_from_its_worker_thread(
    out: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    log, buf, _ = out

    async def one(ns: str, name: str, uid: str) -> None:
        claim_context(ns, name, uid)
        log.info("reading %s", name)
        await asyncio.sleep(0)  # the other claim runs meanwhile
        await asyncio.to_thread(log.info, "binding in a worker thread")

    await asyncio.gather(one("vms", "a", "uid-a"), one("vms", "b", "uid-b"))
    log.info("not a claim's", extra={"device": "pci-0000-3b-00-0"})
    got = lines(buf)
    assert {(o["claim"], o["uid"], o["msg"]) for o in got[:4]} == {
        ("vms/a", "uid-a", "reading a"),
        ("vms/b", "uid-b", "reading b"),
        ("vms/a", "uid-a", "binding in a worker thread"),
        ("vms/b", "uid-b", "binding in a worker thread"),
    }
    assert got[4] == {
        "ts": got[4]["ts"],
        "level": "info",
        "logger": "vfio_dp.test_logs",
        "msg": "not a claim's",
        "node": "node-1",
        "device": "pci-0000-3b-00-0",
    }
    assert got[4]["ts"].endswith("Z") and "T" in got[4]["ts"]


def test_foreign_text_is_bounded_in_message_field_and_traceback(
    out: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    """An API server's 1 MB error body, quoted in a message, a field or an exception, makes
    a line of a few KB that still says how long the text was and ends with the exception."""
    log, buf, handler = out
    body = "x" * 1_000_000
    log.error("the API server said: %s", body, extra={"claim": body})
    try:
        raise RuntimeError("HTTP 500: " + body + " END")
    except RuntimeError:
        log.exception("publishing failed")
    first, second = lines(buf)
    assert len(first["msg"]) < MAX_MESSAGE + 100 and "1000021 characters" in first["msg"]
    assert len(first["claim"]) < 600
    assert len(second["exc"]) < MAX_TRACEBACK + 100 and second["exc"].endswith("END")
    assert all(len(line) < 3 * MAX_TRACEBACK for line in buf.getvalue().splitlines())

    handler.setFormatter(TextFormatter())
    buf.truncate(0)
    buf.seek(0)
    log.warning("the kubelet said: %s", body, extra={"device": "d0"})
    (text,) = buf.getvalue().splitlines()
    assert text.endswith(" device=d0") and len(text) < MAX_MESSAGE + 200
