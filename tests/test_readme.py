"""The README against reality, where that is cheap to check.

- The one example that runs through it -- the selectors config, the KubeVirt CR, the VMI and the
  annotated Pod -- agrees with itself, checked with the real config parser and translator: the
  CR permits exactly the names the config gives its pairs, the VMI and Pod end up asking only
  for permitted names, and every ``# becomes NAME`` comment is what the webhook writes.
- Every ``vfioctl <command> --option`` it shows exists in the real CLI.
- Every path it names exists; every ``kubectl ... -k DIR`` names a kustomization; the shell
  blocks never leave the reader in another directory (a bare ``cd``), since every command is
  meant to run from the checkout root.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cli.main import vfioctl
from vfio_dp.model.config import Config, load_config_text
from vm_translate.spec import resolve_device_name
from vm_translate.translate import translate

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _yaml_doc(kind: str) -> dict[str, Any]:
    docs = [d for b in _blocks("yaml") if (d := yaml.safe_load(b)) and d.get("kind") == kind]
    assert len(docs) == 1, f"expected one {kind} example in the README, found {len(docs)}"
    doc: dict[str, Any] = docs[0]
    return doc


def _config() -> Config:
    (text,) = [b for b in _blocks("yaml") if re.search(r"(?m)^selectors:", b)]
    return load_config_text(text, "README.md")


def _permitted() -> dict[str, str]:
    """resourceName -> pciVendorSelector of the KubeVirt CR example."""
    cr = _yaml_doc("KubeVirt")
    entries = cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert all(e.get("externalResourceProvider") is True for e in entries)
    return {e["resourceName"]: e["pciVendorSelector"] for e in entries}


def test_kubevirt_cr_permits_the_names_the_config_gives() -> None:
    config = _config()
    for name, pair in _permitted().items():
        assert resolve_device_name(pair, config) == name, (
            f"the CR maps {pair} to {name}, the config to {resolve_device_name(pair, config)}"
        )


def test_vmi_asks_only_for_permitted_resources_and_the_comments_are_true() -> None:
    vmi = _yaml_doc("VirtualMachineInstance")
    result = translate(vmi, _config())
    devices = result.obj["spec"]["domain"]["devices"]
    asked = [e["deviceName"] for key in ("hostDevices", "gpus") for e in devices.get(key, [])]
    assert asked and set(asked) <= set(_permitted()), f"{asked} vs the CR's {set(_permitted())}"
    (block,) = [b for b in _blocks("yaml") if "kind: VirtualMachineInstance" in b]
    comments = re.findall(r'deviceName: "?([^"\s]+)"?\s+# becomes (\S+)', block)
    assert comments, "the VMI example explains what the webhook writes"
    for written, becomes in comments:
        assert resolve_device_name(written, _config()) == becomes


def test_pod_example_asks_only_for_permitted_resources() -> None:
    pod = _yaml_doc("Pod")
    result = translate(pod, _config())
    assert result.requests and set(result.requests) <= set(_permitted()), result.requests


# ------------------------------------------------------------------ commands and options


def _code() -> list[str]:
    """Inline code spans and lines of fenced blocks (comments cut)."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", README, flags=re.S))
    lines = [
        ln.split(" # ")[0]
        for b in re.findall(r"```\w*\n(.*?)```", README, re.S)
        for ln in b.splitlines()
    ]
    return spans + lines


def _mentions() -> set[tuple[str, str | None]]:
    """(command, option or None) for every ``vfioctl <command> [--option ...]`` shown."""
    found: set[tuple[str, str | None]] = set()
    for code in _code():
        for m in re.finditer(r"(?:^|[\s(])vfioctl ([a-z][a-z-]*)((?:\\\||[^|;&])*)", code):
            found.add((m.group(1), None))
            for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)):
                found.add((m.group(1), opt))
    return found


def _command(name: str) -> click.Command | None:
    with click.Context(vfioctl) as ctx:
        cmd: click.Command | None = vfioctl.get_command(ctx, name)  # type: ignore[attr-defined]
        return cmd


def test_every_vfioctl_command_shown_exists() -> None:
    commands = {c for c, _ in _mentions()}
    assert {"list", "bind", "unbind", "hostdev"} <= commands, commands
    missing = sorted(c for c in commands if _command(c) is None)
    assert not missing, f"the README shows vfioctl commands that do not exist: {missing}"


@pytest.mark.parametrize("command,option", sorted((c, o) for c, o in _mentions() if o is not None))
def test_every_vfioctl_option_shown_exists(command: str, option: str) -> None:
    cmd = _command(command)
    assert cmd is not None
    cmds = [cmd, *getattr(cmd, "commands", {}).values()]  # a group: its subcommands' too
    opts = {o for c in cmds for p in c.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    assert option in opts, f"`vfioctl {command}` has no {option} (it has {sorted(opts)})"


# ------------------------------------------------------------------------ paths, kustomize


def test_every_path_named_exists() -> None:
    # (``kubectl logs deploy/<name>`` names a Deployment, not a path)
    pattern = r"(?<![\w/.])(?<!logs )((?:deploy|tests|bench|scripts|demo)/[\w./-]*\w)"
    paths = set(re.findall(pattern, README))
    assert "deploy/overlays/cert-manager" in paths
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"the README names paths that do not exist: {missing}"


def test_every_kustomize_target_is_a_kustomization() -> None:
    targets = set(
        re.findall(
            r"kubectl (?:apply|delete|kustomize)(?: -k)? (deploy/[\w/.-]*\w)(?![\w/<])", README
        )
    )
    targets |= set(re.findall(r"\(cd (deploy/[\w/.-]+) && kustomize", README))
    assert {"deploy/overlays/cert-manager", "deploy/overlays/self-signed", "deploy/base"} <= targets
    for t in targets:
        assert (REPO / t / "kustomization.yaml").is_file(), t


def test_shell_steps_never_leave_the_checkout_root() -> None:
    for block in _blocks("sh"):
        for line in block.splitlines():
            assert not re.match(r"\s*cd\b", line), (
                f"`{line.strip()}` leaves the reader elsewhere; the next steps run from the "
                "checkout root (use a subshell: `(cd DIR && ...)`)"
            )


def test_image_step_names_the_base_images_entry() -> None:
    (name,) = re.findall(r"kustomize edit set image ([\w.-]+)=", README)
    base = yaml.safe_load((REPO / "deploy/base/kustomization.yaml").read_text())
    assert name in [i["name"] for i in base["images"]]
    assert name in (REPO / "deploy/base/daemonset.yaml").read_text()


def test_the_dra_vmi_fragment_is_the_shipped_example() -> None:
    """The abridged VMI on DRA is the example file's own claims and host devices."""
    (block,) = [b for b in _blocks("yaml") if "deploy/examples/dra/vmi.yaml" in b]
    shown = yaml.safe_load(block)["spec"]
    example = yaml.safe_load((REPO / "deploy/examples/dra/vmi.yaml").read_text())["spec"]
    assert shown["resourceClaims"] == example["resourceClaims"]
    devices = shown["domain"]["devices"]["hostDevices"]
    assert devices == example["domain"]["devices"]["hostDevices"]
    assert any("claimName" in d for d in devices) and any("deviceName" in d for d in devices)
