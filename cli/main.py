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
    "list": "cli.host_cmds:list_cmd",
    "groups": "cli.host_cmds:groups_cmd",
    "bind": "cli.host_cmds:bind_cmd",
    "unbind": "cli.host_cmds:unbind_cmd",
    "check": "cli.host_cmds:check_cmd",
    "sriov": "cli.sriov_cmd:sriov",
    "plugin": "cli.deviceplugin_cmd:plugin",
    "dra-plugin": "cli.dra_cmd:dra_plugin",
    "deviceclasses": "cli.deviceclass_cmd:deviceclasses",
    "webhook": "cli.vm_cmds:webhook",
    "webhook-certs": "cli.certs_cmd:webhook_certs",
    "translate": "cli.vm_cmds:translate",
    "hostdev": "cli.vm_cmds:hostdev",
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
