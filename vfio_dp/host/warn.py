"""The host layer's warnings (a device left out of a scan, ``modules.alias`` unreadable), said
through the ``vfio_dp.host`` logger -- without loading :mod:`logging` where nothing can read
it through logging.

A process that never imported :mod:`logging` cannot have configured it, so logging would
hand the record to its last-resort handler, which writes the bare message and a newline to
``sys.stderr``: :func:`warning` writes exactly that itself. A one-shot ``vfioctl list`` on a
host without ``modules.alias`` then prints the same line without paying ~3 ms for
:mod:`logging` (and :mod:`traceback`, :mod:`string`, :mod:`textwrap` with it); the daemons,
whose handlers and ``--log-format`` are set up through logging, get the record as before.
"""

from __future__ import annotations

import contextlib
import sys

LOGGER = "vfio_dp.host"


def warning(text: str) -> None:
    """Say ``text`` as a warning of the ``vfio_dp.host`` logger (see the module docstring)."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(LOGGER).warning("%s", text)
        return
    stream = sys.stderr
    if stream is None:  # no stderr at all (logging's last resort says nothing either)
        return
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr, as logging
        stream.write(text + "\n")
        stream.flush()
