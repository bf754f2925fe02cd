"""``vfioctl completion bash|zsh|fish``: the shell completion script, to source or install.

    source <(vfioctl completion bash)                         # this shell
    vfioctl completion bash > /etc/bash_completion.d/vfioctl  # every new shell

click writes it; the script calls ``vfioctl`` back with ``_VFIOCTL_COMPLETE`` set.
"""

from __future__ import annotations

import click


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (source it, or save it where SHELL loads it)."""
    from click.shell_completion import get_completion_class

    from cli.main import vfioctl

    cls = get_completion_class(shell)
    assert cls is not None  # the choice above lists only shells click knows
    click.echo(cls(vfioctl, {}, "vfioctl", "_VFIOCTL_COMPLETE").source())
