"""The two front-end commands (``vfioctl plugin``, ``vfioctl dra-plugin``) share the node
core's flags and the instance/directory flags (cli.common.front_end_options), and every
default is the library's own."""

from __future__ import annotations

import dataclasses

import click
import pytest

from cli.deviceplugin_cmd import plugin
from cli.dra_cmd import dra_plugin
from vfio_dp.core.options import CoreFlags
from vfio_dp.deviceplugin.options import Options
from vfio_dp.dra.options import DraOptions

CORE_FLAGS = ["--config", "--root", "--resync", "--metrics-port", "--metrics-host", "--node-name"]
SHARED_FLAGS = [*CORE_FLAGS, "--create-dirs", "--wait-for-other", "--log-level", "--log-format"]


def _params(cmd: click.Command) -> dict[str, click.Parameter]:
    return {p.opts[0]: p for p in cmd.params if isinstance(p, click.Option)}


def test_both_commands_take_the_core_flags_the_same_way() -> None:
    dp, dra = _params(plugin), _params(dra_plugin)
    for flag in SHARED_FLAGS:
        a, b = dp[flag], dra[flag]
        assert (a.name, type(a.type), a.envvar, a.default) == (
            b.name,
            type(b.type),
            b.envvar,
            b.default,
        ) or flag == "--metrics-port", flag
    # one flag per core setting (uevents are off only in tests)
    assert {f.name for f in dataclasses.fields(CoreFlags)} - {"uevents"} == {
        dp[f].name for f in CORE_FLAGS
    }


@pytest.mark.parametrize(
    ("cmd", "options", "flags"),
    [
        (
            plugin,
            Options,
            {
                "--kubelet-dir": "kubelet_dir",
                "--cdi-dir": "cdi_dir",
                "--config": "config_path",
                "--root": "root",
                "--resync": "resync",
                "--metrics-port": "metrics_port",
                "--metrics-host": "metrics_host",
            },
        ),
        (
            dra_plugin,
            DraOptions,
            {
                "--driver-name": "driver_name",
                "--binding-conditions": "binding_conditions",
                "--claim-check-seconds": "claim_check",
                "--kubelet-registry-dir": "registry_dir",
                "--kubelet-plugins-dir": "plugins_dir",
                "--cdi-dir": "cdi_dir",
                "--config": "config_path",
                "--root": "root",
                "--resync": "resync",
                "--metrics-port": "metrics_port",
                "--metrics-host": "metrics_host",
            },
        ),
    ],
)
def test_every_default_is_the_options_own(
    cmd: click.Command, options: type, flags: dict[str, str]
) -> None:
    params = _params(cmd)
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    for flag, field in flags.items():
        assert params[flag].default == defaults[field], flag
    assert (Options().metrics_port, DraOptions(node_name="n").metrics_port) == (9109, 9110)


@pytest.mark.parametrize("cmd", [plugin, dra_plugin], ids=["plugin", "dra-plugin"])
@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--wait-for-other", "nan"),
        ("--wait-for-other", "NaN"),
        ("--resync", "nan"),
        ("--resync", "inf"),
    ],
)
def test_non_finite_seconds_are_refused_before_anything_runs(
    cmd: click.Command, how: str, flag: str, value: str, tmp_path: object
) -> None:
    """``nan`` compares false with every bound, so a plain FloatRange let ``--wait-for-other
    nan`` through and the command waited for the other instance forever (issue 37.17)."""
    from click.testing import CliRunner

    from cli.common import envvar_for

    args = ["--root", str(tmp_path)]
    env = {}
    if how == "flag":
        args += [flag, value]
    else:
        env[envvar_for(flag)] = value
    result = CliRunner().invoke(cmd, args, env=env)
    assert result.exit_code == 2, result.output
    assert "not a finite number" in result.output
    assert repr(value) in result.output
