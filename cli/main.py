"""The ``vfioctl`` entry point: a click group whose subcommands live in small modules.

Import-light by design (design principle 10): this module and the command modules import
only click at load time; each command imports what it needs (gRPC, the Kubernetes client,
lxml) inside its body, so ``vfioctl list`` never pays for gRPC.
"""

from __future__ import annotations

import click

from cli import host_cmds, plugin_cmd, vm_cmds


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="vfio-dp", prog_name="vfioctl")
def vfioctl() -> None:
    """Safe VFIO PCI passthrough for Kubernetes and KubeVirt."""


for _cmd in [*host_cmds.COMMANDS, plugin_cmd.plugin, *vm_cmds.COMMANDS]:
    vfioctl.add_command(_cmd)


def main() -> None:
    vfioctl(prog_name="vfioctl")
