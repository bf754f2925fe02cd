"""The ``vfioctl`` entry point: a click group whose subcommands live in small modules.

Import-light by design (design principle 10): this module imports only click; a subcommand's
module is imported when that subcommand runs (click's documented lazy-group pattern), and
each command imports what it needs (gRPC, the Kubernetes client, lxml) inside its body, so
``vfioctl unbind`` loads neither the webhook's options nor gRPC.
"""

from __future__ import annotations

import importlib

import click

#: subcommand -> "module:attribute" of its click command, in help order
LAZY_COMMANDS = {
    "list": "cli.inventory_cmds:list_cmd",
    "groups": "cli.inventory_cmds:groups_cmd",
    "bind": "cli.host_cmds:bind_cmd",
    "unbind": "cli.host_cmds:unbind_cmd",
    "check": "cli.host_cmds:check_cmd",
    "sriov": "cli.sriov_cmd:sriov",
    "mdev": "cli.mdev_cmd:mdev",
    "plugin": "cli.deviceplugin_cmd:plugin",
    "dra-plugin": "cli.dra_cmd:dra_plugin",
    "deviceclasses": "cli.deviceclass_cmd:deviceclasses",
    "webhook": "cli.webhook_cmd:webhook",
    "webhook-certs": "cli.certs_cmd:webhook_certs",
    "translate": "cli.vm_cmds:translate",
    "hostdev": "cli.vm_cmds:hostdev",
    "completion": "cli.completion_cmd:completion",
    "fake-node": "cli.fake_node_cmd:fake_node",
}


#: subcommand -> the first paragraph of its help, which ``vfioctl --help`` shortens and lists
#: without importing any subcommand module (tests/cli/test_main.py checks each against the
#: command's own help)
SUMMARIES = {
    "list": "Every PCI device: IDs, driver, IOMMU group, NUMA node, host use, and exactly what each path would serve: the resource, the path serving it (devicePlugin, or dra through the DeviceClass whose extendedResourceName it is) and the DRA device (null: not served).",
    "groups": "Every IOMMU group: members, viability with reasons, the kernel's own verdict, and which path serves it under which resource name (a group split between paths is served by neither: why).",
    "bind": "Move devices to their VFIO driver (recording their drivers for unbind).",
    "unbind": "Give devices back to the driver they had before `vfioctl bind`.",
    "check": "Is each device ready for passthrough now? Every reason and its fix, and the VFIO driver a bind would choose; exit 1 if not.",
    "plugin": "Serve vfio-pci devices to the kubelet (device plugin API v1beta1), one socket per resource.",
    "dra-plugin": "Publish this node's VFIO devices as DRA ResourceSlices (one device per IOMMU group) and serve the kubelet's DRA plugin API.",
    "deviceclasses": "Print a DeviceClass per resource the config's `path: dra` selectors produce.",
    "webhook": "Serve the mutating admission webhook: POST /mutate (AdmissionReview v1), GET /healthz.",
    "webhook-certs": "Create (or keep, while good) the webhook's TLS Secret and set the caBundle.",
    "translate": "Translate a VMI / VM / annotated Pod offline, as the webhook would (FILE or - for stdin).",
    "hostdev": "Allocated PCI_RESOURCE_* addresses and DRA claims → libvirt <hostdev> XML (printed, merged or defined).",
    "sriov": "SR-IOV PFs: VF counts (total, now, wanted by the config), who made them, which VFs are held and by whom, and why a count is not what the config wants.",
    "mdev": "Mediated devices (vGPU-style slices): each parent's types (name, instances available, device API) and the instances made of them, with their IOMMU group and VFIO node.",
    "completion": "Print the completion script for SHELL (source it, or save it where SHELL loads it).",
    "fake-node": "Build a fake node (sys/, dev/, proc/ of a realistic host) in DIRECTORY for --root.",
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when the subcommand is looked up."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *(n for n in super().list_commands(ctx) if n not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command) or cmd.name != cmd_name:
            raise RuntimeError(f"{target} is not the click command {cmd_name!r}")
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list as click writes it, from :data:`SUMMARIES` (``vfioctl --help``
        would otherwise import every subcommand's module: ~30 ms)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            summary = SUMMARIES.get(name)
            cmd = click.Command(name, help=summary) if summary else self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="vfio-dp", prog_name="vfioctl")
def vfioctl() -> None:
    """Safe VFIO PCI passthrough for Kubernetes and KubeVirt."""


def main() -> None:
    vfioctl(prog_name="vfioctl")
