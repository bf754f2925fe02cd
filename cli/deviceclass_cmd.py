"""``vfioctl deviceclasses``: print the DeviceClasses that let DRA serve ``deviceName`` VMs.

Thin: reads the config (the same ConfigMap file the node processes read), calls
:func:`vfio_dp.dra.deviceclasses.device_classes`, prints YAML (``kubectl apply -f -``) or
JSON. One class per resource a ``path: dra`` selector produces, with
``extendedResourceName`` = the name KubeVirt asks for (KEP-5004), then the class of the
container entries (``native.<driver>``).
"""

from __future__ import annotations

import sys

import click

from cli.common import option, run_guarded
from vfio_dp.model.naming import DEFAULT_DRA_DRIVER


@click.command("deviceclasses")
@option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="The node's YAML config (the ConfigMap file); without: the default selector.",
)
@option(
    "--driver-name",
    default=DEFAULT_DRA_DRIVER,
    show_default=True,
    help="The DRA driver name (vfioctl dra-plugin --driver-name).",
)
@option(
    "--device",
    "devices",
    multiple=True,
    metavar="VENDOR:DEVICE",
    help="IDs of devices a selector without device IDs (vendor: 10de, class: 0108) takes: "
    "such a selector names each device after its IDs. Repeatable.",
)
@option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="yaml for kubectl apply -f -, json for machines.",
)
def deviceclasses(
    config_path: str | None, driver_name: str, devices: tuple[str, ...], output: str
) -> None:
    """Print a DeviceClass per resource the config's `path: dra` selectors produce.

    Each class's CEL selects exactly the driver's VFIO devices published under that
    resource; its extendedResourceName is the resource name, so a pod (a VM's virt-launcher)
    asking for it on a node where no device plugin advertises it gets a DRA claim instead.
    Then native.<driver>: the class of the container entries (personalities: [vm, container]);
    last, <type>.mdev.<driver> for each mdev type the config's path: dra entries name.
    """

    def body() -> int:
        import json
        import re

        from vfio_dp.dra.deviceclasses import (
            device_classes,
            mdev_device_classes,
            native_device_class,
        )
        from vfio_dp.model import naming
        from vm_translate.errors import InputError
        from vm_translate.inputs import load_config

        naming.check_dra_driver_name(driver_name)
        ids: list[tuple[str, str]] = []
        for value in devices:
            m = re.fullmatch(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})", value)
            if not m:
                raise InputError("--device", f"{value!r} is not VENDOR:DEVICE, e.g. 10de:1eb8")
            ids.append((m.group(1), m.group(2)))
        config = load_config(config_path)
        classes = device_classes(config, driver_name, ids, config_path or "<default config>")
        classes.append(native_device_class(driver_name))  # the container entries' class
        classes += mdev_device_classes(config, driver_name)  # one per mdev type (path: dra)
        if output == "json":
            sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": classes}))
            sys.stdout.write("\n")
            return 0
        import yaml

        sys.stdout.write("---\n".join(yaml.safe_dump(c, sort_keys=False) for c in classes))
        return 0

    run_guarded(body)
