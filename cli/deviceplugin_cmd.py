"""``vfioctl plugin``: run the device-plugin daemon (what the DaemonSet runs).

Thin: parses flags (each also from ``VFIOCTL_<FLAG>``; the node core's flags and every
default come from :func:`cli.common.front_end_options` and :mod:`vfio_dp.deviceplugin.options`),
then hands over to :func:`vfio_dp.deviceplugin.app.run`. gRPC is imported only inside the
command body.
"""

from __future__ import annotations

import click

from cli.common import (
    configure_logging,
    default_of,
    dir_option,
    existing_dir,
    front_end_options,
    option,
    run_guarded,
    single_instance,
)
from vfio_dp.deviceplugin.options import Options


@click.command("plugin")
@dir_option(
    "--kubelet-dir",
    Options,
    "kubelet_dir",
    "The kubelet's device-plugin dir as this process sees it (never joined with --root).",
)
@option(
    "--pod-resources-socket",
    default=default_of(Options, "pod_resources_socket"),
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The kubelet's PodResources API socket as this process sees it: which devices "
    "running pods hold (an SR-IOV VF count change never destroys one).",
)
@dir_option(
    "--cdi-dir",
    Options,
    "cdi_dir",
    "Also answer Allocate with CDI device names (cdi_devices), writing one CDI spec per "
    "advertised device here (the host's /var/run/cdi as this process sees it; never joined "
    "with --root). Needs kubelet >= 1.31 and a runtime with CDI on (containerd 1.7 with "
    "enable_cdi = true, default from 2.0; CRI-O >= 1.24). Envs and device nodes are "
    "unchanged. Default: off.",
)
@front_end_options(
    Options,
    node_help="This node's name, for selectors limited to nodes (nodes:); in a pod: NODE_NAME "
    "from spec.nodeName. Without it such selectors are skipped.",
    config_help="YAML selectors (a ConfigMap file; reloaded when it changes). "
    "Default: every device already on a VFIO driver as devices.kubevirt.io/<vendor>_<device>.",
    resync_help="Seconds between full rescans of sysfs (uevents trigger rescans in between).",
    metrics_help="Port for /metrics (Prometheus) and /healthz; 0 disables both.",
    wait_help="Seconds to wait for another instance of ours on this node to exit before failing.",
)
def plugin(
    node_name: str | None,
    config_path: str | None,
    root: str,
    kubelet_dir: str,
    pod_resources_socket: str,
    cdi_dir: str | None,
    resync: float,
    metrics_port: int,
    metrics_host: str,
    create_dirs: bool,
    wait_for_other: float,
    log_level: str,
    log_format: str,
) -> None:
    """Serve vfio-pci devices to the kubelet (device plugin API v1beta1), one socket per resource.

    Exits 0 on SIGTERM after sending every resource an empty list and removing its sockets;
    exits 2 with every problem listed when the config is invalid. Never unbinds anything.
    """
    configure_logging(log_level, log_format, node_name)

    def body() -> int:
        from vfio_dp.deviceplugin.app import run
        from vfio_dp.host.root import Root

        Root(root)  # a missing --root is named first
        existing_dir(
            "--kubelet-dir", kubelet_dir, create_dirs,
            "the kubelet's device-plugin directory holds kubelet.sock",
        )  # fmt: skip
        lock = single_instance(root, "device-plugin", None, wait_for_other)
        try:
            return run(
                Options(
                    root=root,
                    kubelet_dir=kubelet_dir,
                    pod_resources_socket=pod_resources_socket,
                    cdi_dir=cdi_dir,
                    config_path=config_path,
                    resync=resync,
                    metrics_port=metrics_port,
                    metrics_host=metrics_host,
                    node_name=node_name,
                )
            )
        finally:
            lock.release()

    run_guarded(body)
