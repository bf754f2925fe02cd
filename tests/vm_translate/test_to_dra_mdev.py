"""``translate --dra`` with mediated devices (issue 35 item 5): a ``gpus[]``/``hostDevices[]``
entry naming a type an ``mdev:`` entry with ``path: dra`` serves becomes a request of that
type's DeviceClass (``<type>.mdev.<driver>``); the template is strictly valid and the class
selects the plugin's mdev entries of that type and nothing else."""

from __future__ import annotations

from typing import Any

from tests.deploy.k8s_schema import check_object, deserialize_errors
from tests.vm_translate.test_to_dra import DRIVER
from vfio_dp.dra.deviceclasses import mdev_class_name, mdev_device_classes
from vfio_dp.model.config import DRA, load_config_text
from vm_translate.to_dra import to_dra

CONFIG = """
selectors:
  - vendor: "10de"
    device: "1eb8"
    path: dra
mdev:
  - parent: "0000:3b:00.0"
    type: nvidia-222
    resourceName: nvidia.com/GRID_T4-1Q
    create: onPrepare
    count: all
    path: dra
  - parent: mtty
    type: mtty-2
    path: dra
"""


def _vmi() -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns"},
        "spec": {"domain": {"devices": {
            "gpus": [{"name": "vgpu", "deviceName": "nvidia.com/GRID_T4-1Q"},
                     {"name": "pgpu", "deviceName": "10de:1eb8"}],
            "hostDevices": [{"name": "tty", "deviceName": "mtty-2"}],
        }}},
    }  # fmt: skip


def test_mdev_entries_become_requests_of_their_types_class() -> None:
    config = load_config_text(CONFIG, "c.yaml")
    moved = to_dra(_vmi(), config, DRIVER)
    assert moved.template is not None
    requests = {
        r["name"]: r["exactly"] for r in moved.template["spec"]["spec"]["devices"]["requests"]
    }
    assert requests["vgpu"] == {
        "deviceClassName": mdev_class_name(DRIVER, "nvidia-222"),
        "count": 1,
    }
    assert requests["tty"] == {"deviceClassName": f"mtty-2.mdev.{DRIVER}", "count": 1}
    assert requests["pgpu"]["deviceClassName"] == DRIVER  # the whole GPU: as before
    devices = moved.obj["spec"]["domain"]["devices"]
    assert devices["gpus"][0] == {"name": "vgpu", "claimName": "vfio", "requestName": "vgpu"}
    assert devices["hostDevices"][0] == {"name": "tty", "claimName": "vfio", "requestName": "tty"}
    verdicts = {v.name: v for v in moved.verdicts}
    assert verdicts["vgpu"].path == DRA and "mdev: entry" in verdicts["vgpu"].why
    assert check_object(dict(moved.template)) == []
    assert deserialize_errors(dict(moved.template)) == []
    names = {c["metadata"]["name"] for c in mdev_device_classes(config, DRIVER)}
    assert {requests["vgpu"]["deviceClassName"], requests["tty"]["deviceClassName"]} <= names
