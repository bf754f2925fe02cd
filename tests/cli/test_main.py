"""The lazy ``vfioctl`` group: every subcommand resolves, and none is imported before use."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from cli.main import LAZY_COMMANDS, vfioctl


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_each_subcommand_resolves_to_its_command(name: str) -> None:
    ctx = click.Context(vfioctl)
    cmd = vfioctl.get_command(ctx, name)
    assert isinstance(cmd, click.Command) and cmd.name == name
    assert cmd.help, f"{name} has no help text"


def test_help_lists_every_subcommand_in_order() -> None:
    ctx = click.Context(vfioctl)
    assert vfioctl.list_commands(ctx) == list(LAZY_COMMANDS)
    assert vfioctl.get_command(ctx, "no-such-command") is None


def test_importing_the_group_imports_no_subcommand_module() -> None:
    code = (
        "import sys, cli.main\n"
        "print([m for m in ('cli.host_cmds', 'cli.deviceplugin_cmd', 'cli.vm_cmds', 'vfio_dp.host')"
        " if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
