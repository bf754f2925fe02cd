"""The kubelet's PodResources API, as a client: which devices running pods were allocated.

The kubelet serves ``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``
(the DaemonSet mounts that directory); ``List`` returns every active pod's containers with
each device plugin resource's ``device_ids``::

    pod_resources { name: "virt-launcher-vm-a" namespace: "default"
                    containers { name: "compute"
                                 devices { resource_name: "devices.kubevirt.io/nvme-vf"
                                           device_ids: "0000:01:00.1" } } }

The plugin API has no Deallocate, so this is how the daemon learns that a device it (or any
other plugin that names devices by PCI address) gave out is still in a pod: an SR-IOV count
change must never destroy such a VF. A gRPC client shell: the generated code stays here.
"""

from __future__ import annotations

import os

from vfio_dp.errors import AddressError, DevicePluginError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.mdev import is_uuid

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class PodResourcesError(DevicePluginError):
    """The kubelet's PodResources API could not be asked (the answer is unknown)."""


def allocated(socket: str, timeout: float = 2.0) -> dict[str, list[str]]:
    """Device ID -> who has it (``pod default/vm-a container compute (resource R)``), for
    every device of every running pod. Raises :class:`FileNotFoundError` when there is no
    socket (no kubelet here yet: nothing can have been allocated through it), else
    :class:`PodResourcesError` when the kubelet does not answer."""
    if not os.path.exists(socket):
        raise FileNotFoundError(socket)
    import grpc

    from vfio_dp.deviceplugin._pb.podresources.v1 import api_pb2, api_pb2_grpc

    out: dict[str, list[str]] = {}
    try:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            resp = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        raise PodResourcesError(
            f"the kubelet's PodResources API ({socket}) did not answer: {e.code().name} "
            f"{e.details() or ''}; which devices pods hold cannot be told, so nothing that "
            "could destroy one is done (retried on the next pass)"
        ) from e
    for pod in resp.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                who = (
                    f"pod {pod.namespace}/{pod.name} container {c.name} "
                    f"(resource {d.resource_name})"
                )
                for dev_id in d.device_ids:
                    out.setdefault(dev_id, []).append(who)
    return out


def holds(socket: str, timeout: float = 2.0) -> dict[PciAddress | str, list[str]]:
    """:func:`allocated`, by PCI address, and mdev instances by UUID (the node core's mdev
    pass never removes one a pod holds); other IDs are other plugins' devices. No socket:
    nothing; no answer: ``"*"`` (holds every device: refuse, retry)."""
    try:
        found = allocated(socket, timeout)
    except FileNotFoundError:
        return {}
    except PodResourcesError as e:
        return {"*": [str(e)]}
    out: dict[PciAddress | str, list[str]] = {}
    for dev_id, who in found.items():
        try:
            out.setdefault(PciAddress.parse(dev_id), []).extend(who)
        except AddressError:
            if is_uuid(dev_id):
                out.setdefault(dev_id, []).extend(who)
    return out
