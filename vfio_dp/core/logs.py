"""Log lines of the long-running processes (``vfioctl plugin``, ``dra-plugin``, ``webhook``):
plain text for people, or JSON lines (``--log-format json``) as Kubernetes components write
them for a log pipeline::

    2026-11-27 12:00:00,123 INFO vfio_dp.dra.claimpath.prepare: prepared claim vms/gpu ...
    {"ts": "2026-11-27T12:00:00.123Z", "level": "info", "logger": "vfio_dp.dra.claimpath.prepare",
     "msg": "prepared claim vms/gpu ...", "node": "node-1", "claim": "vms/gpu",
     "uid": "6f0c...", "device": "pci-0000-3b-00-0"}

Fields (JSON keys; but ``node``, the same on every line, also appended as ``key=value`` to a
text line): :data:`FIELDS`. ``node`` is the process's own (:func:`configure`); the others come from a call's
``extra={"device": ...}`` or from :func:`claim_context`, which a claim's worker task sets
once so every line it logs -- the bind in its worker thread included (``asyncio.to_thread``
copies the context) -- names the claim.

Every line is bounded: a message (which may quote foreign text: an API server's error body,
a kubelet's registration error, a client's claim name) is cut to :data:`MAX_MESSAGE`
characters, a traceback to :data:`MAX_TRACEBACK` (its head and its tail), a field to
:data:`MAX_FIELD`, each cut saying how long the text was.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

#: the structured fields, in the order they are written
FIELDS = ("node", "claim", "uid", "device", "resource")
MAX_MESSAGE = 4096
MAX_TRACEBACK = 8192
MAX_FIELD = 512
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "vfio_dp_log_fields", default=None
)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(cut: {len(text)} characters)"


def _clip_traceback(text: str) -> str:
    """Head and tail of a traceback (the tail names the exception and its message)."""
    if len(text) <= MAX_TRACEBACK:
        return text
    half = MAX_TRACEBACK // 2
    return f"{text[:half]}\n...({len(text) - 2 * half} characters cut)...\n{text[-half:]}"


def claim_context(namespace: str, name: str, uid: str) -> None:
    """Name this claim in every line the current task (and the threads it hands work to)
    logs from now on. Call it first in a task of its own (one per claim): the task's
    context ends with it."""
    _context.set({**(_context.get() or {}), "claim": f"{namespace}/{name}", "uid": uid})


def fields_of(record: logging.LogRecord, node: str | None) -> dict[str, str]:
    """The record's structured fields: its ``extra=``, else the task's claim, else ours."""
    context = _context.get() or {}
    out: dict[str, str] = {}
    for key in FIELDS:
        value = getattr(record, key, None)
        if value is None:
            value = context.get(key)
        if value is None and key == "node":
            value = node
        if value is not None:
            out[key] = clip(value if isinstance(value, str) else str(value), MAX_FIELD)
    return out


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> [key=value ...]``, bounded."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = clip(record.message, MAX_MESSAGE)
        line = super().formatMessage(record)
        extra = fields_of(record, None)  # the node is the same on every line: not repeated
        return line + "".join(f" {k}={v}" for k, v in extra.items())

    def formatException(self, ei: Any) -> str:
        return _clip_traceback(super().formatException(ei))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, RFC 3339), ``level``, ``logger``, ``msg``, the
    :data:`FIELDS` that apply, ``exc`` (a traceback). Bounded as the module says."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, str] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": clip(record.getMessage(), MAX_MESSAGE),
            **fields_of(record, self.node),
        }
        if record.exc_info:
            line["exc"] = _clip_traceback(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, fmt: str = "text", node: str | None = None) -> None:
    """The root logger of a long-running command: ``level`` (``debug`` ... ``error``),
    ``fmt`` ``text`` or ``json``, ``node`` the node's name for every JSON line."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(node) if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
