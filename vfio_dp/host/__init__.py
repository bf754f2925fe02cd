"""The only code that touches ``/sys``, ``/dev`` and ``/proc`` — always under a root path.

Its names are imported on first use (PEP 562): ``from vfio_dp.host.files import load_config``
or a read-only ``vfioctl list`` does not load the binder, the ledger or the operations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vfio_dp.host.bind import BindResult, Step
    from vfio_dp.host.host import Host
    from vfio_dp.model.plan import CheckReport

__all__ = ["BindResult", "CheckReport", "Host", "Step"]

_WHERE = {
    "BindResult": "vfio_dp.host.bind",
    "Step": "vfio_dp.host.bind",
    "CheckReport": "vfio_dp.model.plan",
    "Host": "vfio_dp.host.host",
}


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value
