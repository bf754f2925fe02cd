"""Helpers shared by the deploy tests: reading the real click commands, walking pod specs."""

from __future__ import annotations

import importlib
import posixpath
from typing import Any

import click
import pytest

Obj = dict[str, Any]


def command(module: str, attr: str) -> click.Command:
    """The click command the manifests run, imported from the real CLI (fail clearly if absent)."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is not importable ({e}); the manifests run `vfioctl` from it")
    cmd = getattr(mod, attr, None)
    if not isinstance(cmd, click.Command):
        pytest.fail(f"{module}.{attr} is not a click command; the manifests run it")
    return cmd


def parse_cli_args(cmd: click.Command, args: list[str]) -> dict[str, Any]:
    """Map each ``--flag value`` in ``args`` to its click parameter name, strictly.

    Every flag must be an option of ``cmd``; values are converted with the option's own type
    (paths are left alone: they name files inside the container, not on this machine).
    """
    options: dict[str, click.Option] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for flag in (*p.opts, *p.secondary_opts):
                options[flag] = p
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        token = args[i]
        assert token.startswith("-"), (
            f"{token!r}: positional argument, but `vfioctl {cmd.name}` is given only options here"
        )
        flag, eq, value = token.partition("=")
        opt = options.get(flag)
        assert opt is not None, (
            f"{flag} is not an option of `vfioctl {cmd.name}` (known: {sorted(options)})"
        )
        assert opt.name is not None
        if opt.is_flag:
            assert not eq, f"{flag} is a flag and takes no value"
            out[opt.name] = flag not in opt.secondary_opts
            i += 1
            continue
        if not eq:
            assert i + 1 < len(args), f"{flag} needs a value"
            value = args[i + 1]
            i += 2
        else:
            i += 1
        assert opt.name not in out, f"{flag} given twice"
        if isinstance(opt.type, click.Path):
            out[opt.name] = value
        else:
            try:
                out[opt.name] = opt.type.convert(value, opt, None)
            except click.BadParameter as e:
                pytest.fail(f"{flag} {value!r} is rejected by `vfioctl {cmd.name}`: {e}")
    return out


def check_envvars(cmd: click.Command, env: list[Obj]) -> None:
    """A ``VFIOCTL_*`` env var in the pod must be the env var of one of the command's options."""
    known = {p.envvar for p in cmd.params if isinstance(p.envvar, str)}
    for item in env:
        name = item["name"]
        if name.startswith("VFIOCTL_"):
            assert name in known, f"env {name} sets no option of `vfioctl {cmd.name}`"


def container(pod_spec: Obj, name: str) -> Obj:
    hits = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(hits) == 1, f"expected one container {name!r}"
    return hits[0]


def volume_for_path(pod_spec: Obj, ctr: Obj, path: str) -> tuple[Obj, Obj]:
    """The (volumeMount, volume) whose mountPath is ``path`` exactly."""
    mounts = [m for m in ctr.get("volumeMounts", []) if posixpath.normpath(m["mountPath"]) == path]
    assert len(mounts) == 1, f"expected one volume mounted at {path}, found {len(mounts)}"
    volumes = [v for v in pod_spec.get("volumes", []) if v["name"] == mounts[0]["name"]]
    assert len(volumes) == 1, f"volume {mounts[0]['name']!r} is mounted but not defined"
    return mounts[0], volumes[0]


def container_port(ctr: Obj, port: int | str) -> int:
    """Resolve a probe/Service port (a number or a port name) to the container's port number."""
    if isinstance(port, int):
        return port
    hits = [p["containerPort"] for p in ctr.get("ports", []) if p.get("name") == port]
    assert len(hits) == 1, f"no container port named {port!r}"
    return int(hits[0])
