"""What Prepare gives a container for a claim the scheduler made for a pod's extended-resource
limit (KEP-5004): the variables the device plugin's Allocate gives. Pure.

Such a claim carries the annotation ``resource.kubernetes.io/extended-resource-claim: "true"``
and one request per (container, resource); a request's name is NOT part of the API (never
parsed): its resource is found through the request's ``deviceClassName`` and that class's
``extendedResourceName`` (:func:`vfio_dp.dra.deviceclasses.extended_resource_name`: the
implicit ``deviceclass.resource.kubernetes.io/<class>`` without one)::

    metadata: {annotations: {resource.kubernetes.io/extended-resource-claim: "true"}}
    spec.devices.requests: [{name: container-0-request-0,
                             exactly: {deviceClassName: 8086-10d3.devices.kubevirt.io, count: 2}}]
    → request container-0-request-0 is devices.kubevirt.io/8086_10d3:
      PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3=0000:65:00.0,0000:66:00.0
      PCIDEVICE_DEVICES_KUBEVIRT_IO_8086_10D3=0000:65:00.0,0000:66:00.0

The value is what Allocate lists for that resource: the endpoints of the allocated groups
whose selector gives them the resource's name, primary functions first across the groups
(:func:`vfio_dp.model.device.primary_first`); companions (bound, covered by the group node)
are not listed. The kubelet gives each container the CDI devices of its own requests, and
runtimes apply CDI env last-wins, so EVERY device of a request carries the request's full
value, and no device carries another request's. Ordinary claims get no variables (they would
collide with the device-plugin variables of the same VM).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from vfio_dp.errors import ClaimError
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DRA, Config
from vfio_dp.model.device import Inventory, primary_first
from vfio_dp.model.serving import DraUnit

EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"

#: ``await read(class name)`` → the extended resource name it serves (explicit or implicit);
#: raises :class:`LookupError` when the class does not exist
ClassResource = Callable[[str], Awaitable[str]]


def is_extended(claim: Mapping[str, Any]) -> bool:
    """Was this claim made by the scheduler for a pod's extended-resource limits?"""
    meta = claim.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(EXTENDED_RESOURCE_CLAIM) == "true"


def request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """request name → its ``exactly.deviceClassName`` (requests without one are left out)."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: dict[str, str] = {}
    for r in requests if isinstance(requests, list) else []:
        exactly = r.get("exactly") if isinstance(r, Mapping) else None
        cls = exactly.get("deviceClassName") if isinstance(exactly, Mapping) else None
        if isinstance(r.get("name"), str) and isinstance(cls, str):
            out[r["name"]] = cls
    return out


async def request_resources(
    classes: Mapping[str, str], requests: Sequence[str], read_class: ClassResource, who: str
) -> dict[str, str]:
    """request → the extended resource it stands for, through its class (``classes``:
    :func:`request_classes`); a request without a class, or a class that cannot be read, is
    a :class:`ClaimError` naming both."""
    out: dict[str, str] = {}
    for request in requests:
        cls = classes.get(request)
        if cls is None:
            raise ClaimError(
                who,
                f"request {request} of this extended-resource claim names no deviceClassName, "
                "so its resource (and its PCI_RESOURCE_* variable) is unknown",
            )
        try:
            out[request] = await read_class(cls)
        except LookupError as e:
            raise ClaimError(
                who,
                f"DeviceClass {cls} of request {request} cannot be read ({e}); nothing was "
                "bound. It names the resource whose PCI_RESOURCE_* variable the container "
                "needs: create the class again (vfioctl deviceclasses) or delete the pod",
            ) from e
    return out


def resource_endpoints(unit: DraUnit, inventory: Inventory, config: Config) -> list[PciAddress]:
    """The group's endpoints the device plugin would list under the unit's resource: those
    whose ``path: dra`` selector gives them that name (companions are not listed)."""
    out: list[PciAddress] = []
    for a in unit.endpoints:
        dev = inventory.devices.get(a)
        sel = None if dev is None else config.select_for(dev, DRA)
        if dev is not None and sel is not None and config.name_for(sel, dev) == unit.resource_name:
            out.append(a)
    return out or [unit.primary]


def request_env(
    resources: Mapping[str, str], endpoints: Mapping[str, Sequence[PciAddress]]
) -> dict[str, list[str]]:
    """request → its ``NAME=value`` variables (KubeVirt's and the SR-IOV plugin's), the value
    listing every endpoint allocated to that request, primary functions first."""
    out: dict[str, list[str]] = {}
    for request, resource in resources.items():
        value = ",".join(str(a) for a in primary_first(list(endpoints.get(request, ()))))
        out[request] = [
            f"{naming.kubevirt_env_var(resource)}={value}",
            f"{naming.sriov_env_var(resource)}={value}",
        ]
    return out
