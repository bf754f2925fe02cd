"""The tests' temp trees: a real sysfs tree for a described PCI topology (not a mock).

The builder is the library's (:mod:`vfio_dp.host.fake_node`, which ``vfioctl fake-node`` uses
too), and so are the realistic hosts (:mod:`vfio_dp.host.fake_profiles`): one copy. A tree
does NOT react to writes; :mod:`tests.kernel_sim` applies the kernel's reaction.
"""

from __future__ import annotations

from vfio_dp.host.fake_node import Dev, SysfsTree
from vfio_dp.host.fake_profiles import gpu_host

__all__ = ["Dev", "SysfsTree", "gpu_host"]
