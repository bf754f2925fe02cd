"""The lazy ``vfioctl`` group: every subcommand resolves, and none is imported before use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cli.main import LAZY_COMMANDS, SUMMARIES, vfioctl


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
        "print([m for m in ('cli.host_cmds', 'cli.inventory_cmds', 'cli.deviceplugin_cmd', 'cli.vm_cmds', 'vfio_dp.host')"
        " if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_each_summary_is_the_first_paragraph_of_its_commands_help(name: str) -> None:
    cmd = vfioctl.get_command(click.Context(vfioctl), name)
    assert cmd is not None and cmd.help
    assert SUMMARIES[name] == " ".join(cmd.help.split("\n\n")[0].split())


def test_help_lists_what_click_would_without_importing_the_commands() -> None:
    code = (
        "import sys, click\n"
        "from click.testing import CliRunner\n"
        "from cli.main import LazyGroup, vfioctl\n"
        "fast = CliRunner().invoke(vfioctl, ['--help']).output\n"
        "print([m for m in ('cli.host_cmds', 'cli.deviceplugin_cmd', 'cli.dra_cmd',"
        " 'cli.vm_cmds') if m in sys.modules])\n"
        "LazyGroup.format_commands = click.Group.format_commands  # click's own: imports all\n"
        "slow = CliRunner().invoke(vfioctl, ['--help']).output\n"
        "print(fast == slow and 'Commands:' in fast and 'hostdev' in fast)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout + out.stderr


def _list_loads(root: Path, check: str, modules: tuple[str, ...]) -> list[str]:
    """Run ``vfioctl list -o json`` on ``root`` in a fresh interpreter; ``check`` asserts on
    ``devices`` (the parsed output). Which of ``modules`` it loaded."""
    code = (
        "import sys, json, io, contextlib\n"
        "from cli.main import main\n"
        "sys.argv = ['vfioctl', 'list', '--root', sys.argv[1], '-o', 'json']\n"
        "out = io.StringIO()\n"
        "try:\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "devices = json.loads(out.getvalue())\n"
        f"{check}\n"
        f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_a_read_only_list_loads_nothing_that_changes_a_machine(tmp_path: Path) -> None:
    # start-up is most of `vfioctl list` on a small host: the binder, the ledger, the
    # operations, the check rules and the DRA checkpoint (nothing on vfio-pci, no checkpoint)
    # stay out
    from tests.sysfs_tree import Dev, SysfsTree

    tree = SysfsTree(tmp_path)
    tree.add(Dev("0000:00:1f.6", "8086", "15bb", "020000", driver="e1000e", group=1))
    tree.add(Dev("0000:01:00.0", "10de", "1eb8", "030200", driver="nvidia", group=2))
    modules = (
        "vfio_dp.host.bind", "vfio_dp.host.ledger", "vfio_dp.host.operations", "vfio_dp.model.plan",
        "vfio_dp.dra.claimpath.checkpoint", "cli.host_cmds", "queue",
    )  # fmt: skip
    assert _list_loads(tree.root, "assert devices, 'no devices listed'", modules) == []


def test_the_dra_view_of_list_loads_neither_the_slice_format_nor_openssl(tmp_path: Path) -> None:
    # a group on vfio-pci: `list` shows what the DRA plugin would publish (its health rules)
    # without the slices' format, the metadata format or hashlib (OpenSSL: ~4 ms to load)
    from tests.sysfs_tree import Dev, SysfsTree

    tree = SysfsTree(tmp_path)
    tree.add(Dev("0000:01:00.0", "10de", "1eb8", "030200", driver="vfio-pci", group=2))
    check = "assert devices[0]['dra_health'] == 'HEALTHY', devices"
    modules = ("vfio_dp.dra.slices", "vfio_dp.model.dra_metadata", "_hashlib")
    assert _list_loads(tree.root, check, modules) == []


def test_list_without_mdevs_or_modules_alias_loads_no_mdev_model_nor_logging(
    tmp_path: Path,
) -> None:
    # start-up of `vfioctl list -o json` (issue 34, bench row list_small): a host without
    # mdevs loads no mdev model (the scan's parent marking only lists /sys/class/mdev_bus), no
    # config loads the mdev entries' model, and the missing modules.alias is said on stderr
    # as logging's last resort would say it, without loading logging (~3 ms with traceback)
    from tests.sysfs_tree import Dev, SysfsTree

    tree = SysfsTree(tmp_path)
    tree.add(Dev("0000:00:1f.6", "8086", "15bb", "020000", driver="e1000e", group=1))
    tree.add(Dev("0000:01:00.0", "10de", "1eb8", "030200", driver="vfio-pci", group=2))
    check = "assert devices[1]['vfioDriver']['driver'] == 'vfio-pci', devices"
    modules = ("vfio_dp.model.mdev", "vfio_dp.model.mdev_config", "logging")
    assert _list_loads(tree.root, check, modules) == []
    out = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "list", "--root",
         str(tree.root), "-o", "json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    alias = tree.root / "lib" / "modules" / "unknown" / "modules.alias"
    assert out.stderr == (
        f"{alias} cannot be read (No such file or directory): vfio-pci is used for every device\n"
    )
