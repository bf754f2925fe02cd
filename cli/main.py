"""The ``vfioctl`` entry point: a click group whose subcommands live in small modules.

Import-light by design (design principle 10): this module and the command modules import
only click at load time; each command imports what it needs (gRPC, the Kubernetes client,
lxml) inside its body, so ``vfioctl list`` never pays for gRPC.
"""

from __future__ import annotations

import click

from cli import host_cmds


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="vfio-dp", prog_name="vfioctl")
def vfioctl() -> None:
    """Safe VFIO PCI passthrough for Kubernetes and KubeVirt."""


for _cmd in host_cmds.COMMANDS:
    vfioctl.add_command(_cmd)

try:  # the daemon command (issue 3)
    from cli import plugin_cmd

    vfioctl.add_command(plugin_cmd.plugin)
except ImportError:  # pragma: no cover - while the module does not exist yet
    pass

try:  # webhook / translate / hostdev (issue 4)
    from cli import vm_cmds

    for _cmd in vm_cmds.COMMANDS:
        vfioctl.add_command(_cmd)
except ImportError:  # pragma: no cover
    pass


def main() -> None:
    vfioctl(prog_name="vfioctl")
