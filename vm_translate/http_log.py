"""The webhook's HTTP server logger (aiohttp's ``logger=``): malformed requests counted and
reported at most every few seconds, never a traceback per request."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError


class HttpLog(logging.Logger):
    """aiohttp's server logger. A malformed request from a client (bad request line, too many
    or too long headers) is the client's fault: one WARNING line at most every
    ``every`` seconds with a count, never aiohttp's ERROR with a traceback per request (a
    hostile client could fill the log). Other exceptions keep their traceback: they are bugs."""

    def __init__(self, parent: logging.Logger, every: float = 10.0) -> None:
        super().__init__(f"{parent.name}.http")
        self.parent = parent
        self.every = every
        self.malformed = 0
        self._since = 0
        self._last_report = -every

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if not isinstance(exc, HttpProcessingError):
            super().exception(msg, *args, **kwargs)
            return
        self.malformed += 1
        self._since += 1
        now = time.monotonic()
        if now - self._last_report >= self.every:
            self.warning(
                "%d malformed HTTP request(s) answered 400 in the last %gs; last: %s",
                self._since,
                self.every,
                str(exc.message)[:200],
            )
            self._since, self._last_report = 0, now
