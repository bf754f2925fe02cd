"""The only code that touches ``/sys``, ``/dev`` and ``/proc`` — always under a root path."""

from vfio_dp.host.bind import BindResult, Step
from vfio_dp.host.host import CheckReport, Host

__all__ = ["BindResult", "CheckReport", "Host", "Step"]
