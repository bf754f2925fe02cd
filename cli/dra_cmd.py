"""``vfioctl dra-plugin``: run the DRA kubelet plugin (what the DRA DaemonSet runs).

Thin: parses flags (each also from ``VFIOCTL_<FLAG>``; ``--node-name`` also from
``NODE_NAME``; the node core's flags and every default come from
:func:`cli.common.front_end_options` and :mod:`vfio_dp.dra.options`), then hands over to
:func:`vfio_dp.dra.plugin.run`. gRPC and the Kubernetes
client are imported only inside the command body: no other vfioctl command pays for them.
"""

from __future__ import annotations

import click

from cli.common import (
    FiniteFloatRange,
    configure_logging,
    default_of,
    dir_option,
    existing_dir,
    front_end_options,
    option,
    run_guarded,
    single_instance,
)
from vfio_dp.dra.options import DraOptions


@click.command("dra-plugin")
@option(
    "--driver-name",
    default=default_of(DraOptions, "driver_name"),
    show_default=True,
    help="The DRA driver name: a lowercase DNS subdomain you own, at most 63 characters, "
    "starting with a letter. It names the sockets, the ResourceSlices' spec.driver, the "
    "attributes' domain, the claims' CDI kind and the DeviceClass selector (device.driver).",
)
@option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    default=None,
    help="kubeconfig for the API server; absent: $KUBECONFIG, then ~/.kube/config, then the pod's service account (kubectl's order).",
)
@option(
    "--binding-conditions",
    type=bool,
    default=default_of(DraOptions, "binding_conditions"),
    show_default=True,
    help="Publish bindingConditions <driver>/ready and bindingFailureConditions <driver>/failed "
    "on devices offered in two personalities, and watch the claims allocated from this node's "
    "pool to switch their devices before the pod is bound (KEP-5007). Left out anyway where "
    "the API server drops them (Prepare switches then); false: never.",
)
@option(
    "--claim-check-seconds",
    "claim_check",
    type=FiniteFloatRange(min=0),
    default=default_of(DraOptions, "claim_check"),
    show_default=True,
    help="Seconds in which each prepared claim is read again from the API server, spread over "
    "the resyncs: a claim deleted or deallocated that kubelet never unprepared is released "
    "within this (every claim is read at start, before kubelet can call); 0: every claim at "
    "every resync.",
)
@dir_option(
    "--kubelet-registry-dir",
    DraOptions,
    "registry_dir",
    "kubelet's plugin registry dir as this process sees it (never joined with --root).",
)
@dir_option(
    "--kubelet-plugins-dir",
    DraOptions,
    "plugins_dir",
    "kubelet's plugins dir (the service socket <dir>/<driver>/dra.sock; never joined with --root).",
)
@dir_option(
    "--cdi-dir",
    DraOptions,
    "cdi_dir",
    "Where Prepare writes one CDI spec per claim (a path as the plugin sees it; never joined "
    "with --root).",
)
@front_end_options(
    DraOptions,
    node_help="This node's name (the pool and the slices' nodeName); in a pod: NODE_NAME from "
    "spec.nodeName.",
    config_help="YAML selectors (reloaded when it changes); only path: dra selectors are "
    "published. Default: every device already on a VFIO driver.",
    resync_help="Seconds between full rescans of sysfs and checks of the published slices.",
    metrics_help="Port for /metrics and /healthz; 0 disables both (the device plugin holds 9109).",
    wait_help="Seconds to wait for another DRA plugin of ours for this driver to exit before "
    "failing.",
)
def dra_plugin(
    driver_name: str,
    node_name: str | None,
    kubeconfig: str | None,
    binding_conditions: bool,
    claim_check: float,
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
    log_format: str,
) -> None:
    """Publish this node's VFIO devices as DRA ResourceSlices (one device per IOMMU group)
    and serve the kubelet's DRA plugin API.

    Exits 0 on SIGTERM after removing both sockets (the slices stay; kubelet removes them
    30 s after the driver is gone); exits 2 on a bad config, driver name or missing node name.
    NodePrepareResources binds a `bind: onPrepare` group, writes one CDI spec and the KEP-5304
    device metadata per claim; NodeUnprepareResources gives back what the claim bound.
    """
    configure_logging(log_level, log_format, node_name)

    def body() -> int:
        import gc

        # start-up (the imports, the first scan, the pool) makes ~250,000 objects that live
        # as long as the process, and no garbage cycles: the collector only walked them again
        # and again (~0.15 s of CPU before the first slices at 4,096 devices). Off until the
        # plugin has started; DraPlugin.start then freezes them out of it and turns it on.
        gc.disable()

        from vfio_dp.errors import UsageError

        if not node_name:
            raise UsageError(
                "--node-name is required (or NODE_NAME, e.g. from the pod's spec.nodeName)"
            )
        from vfio_dp.dra.apiserver.publisher import api_client
        from vfio_dp.dra.plugin import run
        from vfio_dp.host.root import Root

        options = DraOptions(
            node_name=node_name,
            driver_name=driver_name,
            registry_dir=kubelet_registry_dir,
            plugins_dir=kubelet_plugins_dir,
            cdi_dir=cdi_dir,
            binding_conditions=binding_conditions,
            claim_check=claim_check,
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
            # Stopped: sockets removed, calls in flight answered or cut off (every API call
            # ends by its deadline, and stopping shuts the sockets of those under way), so
            # no thread is left to wait for: the process exits as the kubelet expects.
            return run(options, client)
        finally:
            lock.release()

    run_guarded(body)
