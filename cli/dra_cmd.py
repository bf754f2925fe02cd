"""``vfioctl dra-plugin``: run the DRA kubelet plugin (what the DRA DaemonSet runs).

Thin: parses flags (each also from ``VFIOCTL_<FLAG>``; ``--node-name`` also from
``NODE_NAME``), then hands over to :func:`vfio_dp.dra.driver.run`. gRPC and the Kubernetes
client are imported only inside the command body: no other vfioctl command pays for them.
"""

from __future__ import annotations

import click

from cli.common import (
    envvar_for,
    existing_dir,
    option,
    root_option,
    run_guarded,
    single_instance,
)

DEFAULT_DRIVER = "vfio.dra.vfio-dp.io"  # = vfio_dp.dra.driver.DEFAULT_DRIVER (not imported: light)


@click.command("dra-plugin")
@option(
    "--driver-name",
    default=DEFAULT_DRIVER,
    show_default=True,
    help="The DRA driver name: a lowercase DNS subdomain you own. It names the sockets, "
    "the ResourceSlices' spec.driver, the attributes' domain and the DeviceClass "
    "selector (device.driver).",
)
@option(
    "--node-name",
    envvar=[envvar_for("--node-name"), "NODE_NAME"],
    default=None,
    help="This node's name (the pool and the slices' nodeName); in a pod: NODE_NAME from "
    "spec.nodeName.",
)
@option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="kubeconfig for the API server; absent: $KUBECONFIG, then ~/.kube/config, then the pod's service account (kubectl's order).",
)
@option(
    "--kubelet-registry-dir",
    default="/var/lib/kubelet/plugins_registry",
    show_default=True,
    type=click.Path(file_okay=False),
    help="kubelet's plugin registry dir as this process sees it (never joined with --root).",
)
@option(
    "--kubelet-plugins-dir",
    default="/var/lib/kubelet/plugins",
    show_default=True,
    type=click.Path(file_okay=False),
    help="kubelet's plugins dir (the service socket <dir>/<driver>/dra.sock; never joined "
    "with --root).",
)
@option(
    "--cdi-dir",
    default="/var/run/cdi",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where Prepare writes one CDI spec per claim (a path as the plugin sees it; never joined with --root).",
)
@option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML selectors (reloaded when it changes); only path: dra selectors are "
    "published. Default: every device already on vfio-pci.",
)
@root_option
@option(
    "--resync",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Seconds between full rescans of sysfs and checks of the published slices.",
)
@option(
    "--metrics-port",
    default=9110,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port for /metrics and /healthz; 0 disables both (the device plugin holds 9109).",
)
@option("--metrics-host", default="", help="Address for the metrics port (default: all).")
@option(
    "--create-dirs",
    is_flag=True,
    help="Create missing kubelet directories instead of refusing them (a typo is otherwise "
    "created and waited on forever).",
)
@option(
    "--wait-for-other",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0, 3600),
    help="Seconds to wait for another DRA plugin of ours for this driver to exit before failing.",
)
@option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def dra_plugin(
    driver_name: str,
    node_name: str | None,
    kubeconfig: str | None,
    kubelet_registry_dir: str,
    kubelet_plugins_dir: str,
    cdi_dir: str,
    config_path: str | None,
    root: str,
    resync: float,
    metrics_port: int,
    metrics_host: str,
    create_dirs: bool,
    wait_for_other: float,
    log_level: str,
) -> None:
    """Publish this node's VFIO devices as DRA ResourceSlices (one device per IOMMU group)
    and serve the kubelet's DRA plugin API.

    Exits 0 on SIGTERM after removing both sockets (the slices stay; kubelet removes them
    30 s after the driver is gone); exits 2 on a bad config, driver name or missing node name.
    NodePrepareResources binds a `bind: onPrepare` group, writes one CDI spec and the KEP-5304
    device metadata per claim; NodeUnprepareResources gives back what the claim bound.
    """
    import logging

    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    def body() -> int:
        from vfio_dp.errors import UsageError

        if not node_name:
            raise UsageError(
                "--node-name is required (or NODE_NAME, e.g. from the pod's spec.nodeName)"
            )
        from vfio_dp.dra.driver import DraOptions, run
        from vfio_dp.dra.publisher import api_client
        from vfio_dp.host.root import Root

        options = DraOptions(
            node_name=node_name,
            driver_name=driver_name,
            registry_dir=kubelet_registry_dir,
            plugins_dir=kubelet_plugins_dir,
            cdi_dir=cdi_dir,
            config_path=config_path,
            root=root,
            resync=resync,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
        try:
            client = api_client(kubeconfig)
        except ValueError as e:  # names the source tried, in kubectl's order
            raise UsageError(str(e)) from e
        Root(root)  # a missing --root is named first
        existing_dir(
            "--kubelet-registry-dir", kubelet_registry_dir, create_dirs,
            "the kubelet watches it for plugin registration sockets",
        )  # fmt: skip
        existing_dir(
            "--kubelet-plugins-dir", kubelet_plugins_dir, create_dirs,
            "the kubelet's plugins directory holds each driver's dra.sock directory",
        )  # fmt: skip
        lock = single_instance(root, "dra-plugin", driver_name, wait_for_other)
        try:
            return run(options, client)
        finally:
            lock.release()

    run_guarded(body)
