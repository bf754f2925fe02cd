"""The README and the pages of ``docs/`` against reality, where that is cheap to check.

Every check runs over every page (``README.md`` and ``docs/*.md``, see :mod:`tests.docs_pages`):

- The README is a front door: under 12 KB, it shows the two commands (``make demo``, ``make
  test``: Makefile targets), and it links every page of ``docs/``; the pages the structure
  issue asks for exist; every relative link of every page resolves, anchors included.
- The one example that runs through the docs -- the selectors config of
  ``docs/configuration.md``, the KubeVirt CR, the VMI and the annotated Pod of
  ``docs/kubevirt.md`` -- agrees with itself, checked with the real config parser and
  translator: the CR permits exactly the names the config gives its pairs, the VMI and Pod end
  up asking only for permitted names, and every ``# becomes NAME`` comment is what the webhook
  writes.
- Every YAML block parses; every config shown loads with the real parser; every Kubernetes
  object shown with its kind is structurally valid against the client's models; every
  abridged copy of a shipped file (a block opening with ``# <path>, abridged``) is that file's
  content.
- Every ``vfioctl <command> --option`` shown exists in the real CLI; every ``vfioctl`` command
  line of a shell block is accepted by the real command's parser; the JSON fields the CLI
  reference lists for ``list`` and ``groups`` are exactly the ones they print.
- Every path named exists; every dotted name of our packages (``vfio_dp.host.host.Host.bind``)
  imports; every ``kubectl ... -k DIR`` names a kustomization; every ``logs ds/NAME`` names a
  shipped workload; the shell blocks never leave the reader in another directory (a bare
  ``cd``), since every command is meant to run from the checkout root.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import kubernetes.client as k8s
import pytest
import yaml

from cli.main import vfioctl
from tests.deploy.k8s_schema import BUILTIN_KINDS, check_model
from tests.docs_pages import (
    DOCS,
    PAGES,
    README,
    REPO,
    Page,
    anchors,
    links,
    page,
)
from tests.sysfs_tree import gpu_host
from vfio_dp.model.config import Config, load_config_text
from vm_translate.entries import resolve_device_name
from vm_translate.translate import translate

#: the pages of docs/ the README must lead to (issue 19, item 6)
REQUIRED_DOCS = {
    "install",
    "configuration",
    "cli",
    "kubevirt",
    "dra",
    "troubleshooting",
    "comparison",
    "performance",
    "architecture",
    "development",
}
README_LIMIT = 12_000  # bytes: "under 12 KB" by either reading of KB

IDS = [p.name for p in PAGES]


# ------------------------------------------------------------------ the front door


def test_readme_is_a_front_door_under_12_kb() -> None:
    size = len(README.text.encode())
    assert size < README_LIMIT, (
        f"README.md is {size:,} bytes; keep it under {README_LIMIT:,} (move detail to docs/)"
    )


def test_the_pages_the_structure_asks_for_exist() -> None:
    have = {p.path.stem for p in DOCS}
    missing = sorted(REQUIRED_DOCS - have)
    assert not missing, f"docs/ lacks {missing}"


def test_readme_links_every_docs_page() -> None:
    linked = {
        (README.path.parent / target).resolve()
        for target, _ in (split_link(t) for t in links(README))
        if target
    }
    missing = sorted(p.name for p in DOCS if p.path.resolve() not in linked)
    assert not missing, f"README.md does not link {missing}"


def test_readme_shows_the_two_commands_and_the_makefile_has_them() -> None:
    blocks = "\n".join(README.blocks("sh"))
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"(?m)^make {target}\b", blocks), f"the README shows `make {target}`"
        assert re.search(rf"(?m)^{target}:", makefile), f"the Makefile has no {target} target"


def split_link(target: str) -> tuple[str, str]:
    path, _, anchor = target.partition("#")
    return path, anchor


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_link_resolves(doc: Page) -> None:
    problems = []
    for target in links(doc):
        if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto: -- not followed here
            continue
        path, anchor = split_link(target)
        dest = (doc.path.parent / path).resolve() if path else doc.path
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(page(dest)):
            problems.append(f"{target}: no heading with that anchor in {dest.name}")
        elif not dest.is_relative_to(REPO):
            problems.append(f"{target}: outside the checkout")
    assert not problems, f"{doc.name}: " + "; ".join(problems)


# ------------------------------------------------------------------ the running example


def _yaml_doc(doc: Page, kind: str) -> dict[str, Any]:
    found = [d for b in doc.blocks("yaml") if (d := yaml.safe_load(b)) and d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} example in {doc.name}, found {len(found)}"
    one: dict[str, Any] = found[0]
    return one


def _config() -> Config:
    doc = page(REPO / "docs/configuration.md")
    blocks = [b for b in doc.blocks("yaml") if re.search(r"(?m)^selectors:", b)]
    assert blocks, "docs/configuration.md shows the example config"
    return load_config_text(blocks[0], doc.name)


def _kubevirt() -> Page:
    return page(REPO / "docs/kubevirt.md")


def _permitted() -> dict[str, str]:
    """resourceName -> pciVendorSelector of the KubeVirt CR example."""
    cr = _yaml_doc(_kubevirt(), "KubeVirt")
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
    vmi = _yaml_doc(_kubevirt(), "VirtualMachineInstance")
    result = translate(vmi, _config())
    devices = result.obj["spec"]["domain"]["devices"]
    asked = [e["deviceName"] for key in ("hostDevices", "gpus") for e in devices.get(key, [])]
    assert asked and set(asked) <= set(_permitted()), f"{asked} vs the CR's {set(_permitted())}"
    (block,) = [b for b in _kubevirt().blocks("yaml") if "kind: VirtualMachineInstance" in b]
    comments = re.findall(r'deviceName: "?([^"\s]+)"?\s+# becomes (\S+)', block)
    assert comments, "the VMI example explains what the webhook writes"
    for written, becomes in comments:
        assert resolve_device_name(written, _config()) == becomes


def test_pod_example_asks_only_for_permitted_resources() -> None:
    pod = _yaml_doc(_kubevirt(), "Pod")
    result = translate(pod, _config())
    assert result.requests and set(result.requests) <= set(_permitted()), result.requests


# ------------------------------------------------------------------ every example valid


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_yaml_block_parses_and_every_config_loads(doc: Page) -> None:
    for block in doc.blocks("yaml"):
        list(yaml.safe_load_all(block))  # raises on a broken example
        if re.search(r"(?m)^selectors:", block):
            load_config_text(block, doc.name)  # raises ConfigError listing every problem


def _model_for(obj: dict[str, Any]) -> type | None:
    key = (obj.get("apiVersion"), obj.get("kind"))
    name = {**BUILTIN_KINDS, ("v1", "Pod"): "V1Pod"}.get(key)  # type: ignore[call-overload]
    return getattr(k8s, name) if name else None


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_kubernetes_object_shown_is_valid(doc: Page) -> None:
    problems: list[str] = []
    for block in doc.blocks("yaml"):
        for obj in yaml.safe_load_all(block):
            if not isinstance(obj, dict) or "kind" not in obj:
                continue  # a fragment (its file is checked below, if it names one)
            model = _model_for(obj)
            if model is not None:
                out: list[Any] = []
                check_model(obj, model, "", out)
                problems += [f"{obj['kind']}: {p}" for p in out]
            if obj["kind"] in ("VirtualMachineInstance", "VirtualMachine", "Pod"):
                translate(obj, _config())  # raises SpecError naming every wrong entry
    assert not problems, f"{doc.name}: " + "; ".join(problems)


def _abridges(shown: object, full: object, at: str = "") -> list[str]:
    """Where ``shown`` is not ``full`` with parts left out (dicts may drop keys)."""
    if isinstance(shown, dict):
        if not isinstance(full, dict):
            return [f"{at or '.'}: not a mapping in the file"]
        return [
            p
            for k, v in shown.items()
            for p in (_abridges(v, full[k], f"{at}.{k}") if k in full else [f"{at}.{k}: absent"])
        ]
    if isinstance(shown, list):
        if not isinstance(full, list) or len(full) != len(shown):
            return [f"{at}: the file's list differs in length"]
        return [
            p
            for i, (s, f) in enumerate(zip(shown, full, strict=True))
            for p in _abridges(s, f, f"{at}[{i}]")
        ]
    return [] if shown == full else [f"{at}: {shown!r} vs the file's {full!r}"]


def _abridged_copies() -> list[tuple[Page, str, str]]:
    return [
        (doc, m.group(1), block)
        for doc in PAGES
        for block in doc.blocks("yaml")
        if (m := re.match(r"# ((?:deploy|demo|tests)/\S+\.ya?ml), abridged", block))
    ]


def test_every_abridged_copy_is_the_shipped_file() -> None:
    copies = _abridged_copies()
    assert any(path == "deploy/examples/dra/vmi.yaml" for _, path, _ in copies)
    for doc, path, block in copies:
        shown = yaml.safe_load(block)
        full = yaml.safe_load((REPO / path).read_text())
        problems = _abridges(shown, full)
        assert not problems, f"{doc.name} abridges {path} wrongly: {problems}"


def test_the_dra_vmi_fragment_shows_both_kinds_of_entry() -> None:
    ((_, _, block),) = [c for c in _abridged_copies() if c[1] == "deploy/examples/dra/vmi.yaml"]
    devices = yaml.safe_load(block)["spec"]["domain"]["devices"]["hostDevices"]
    assert any("claimName" in d for d in devices) and any("deviceName" in d for d in devices)


# ------------------------------------------------------------------ commands and options


def _mentions(doc: Page) -> set[tuple[str, str | None]]:
    """(command, option or None) for every ``vfioctl <command> [--option ...]`` shown."""
    found: set[tuple[str, str | None]] = set()
    for code in doc.code():
        for m in re.finditer(r"(?:^|[\s(])vfioctl ([a-z][a-z-]*)((?:\\\||[^|;&])*)", code):
            found.add((m.group(1), None))
            for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)):
                found.add((m.group(1), opt))
        for m in re.finditer(r"(?:^|[\s(])vfioctl (--[a-z][a-z-]*)", code):
            found.add(("", m.group(1)))
    return found


ALL_MENTIONS = sorted({(d.name, c, o) for d in PAGES for c, o in _mentions(d)}, key=str)


def _command(name: str) -> click.Command | None:
    if not name:
        return vfioctl
    with click.Context(vfioctl) as ctx:
        cmd: click.Command | None = vfioctl.get_command(ctx, name)  # type: ignore[attr-defined]
        return cmd


def test_every_vfioctl_command_shown_exists() -> None:
    commands = {c for _, c, _ in ALL_MENTIONS}
    assert {"list", "bind", "unbind", "hostdev", "plugin", "dra-plugin"} <= commands, commands
    missing = sorted({(d, c) for d, c, _ in ALL_MENTIONS if _command(c) is None})
    assert not missing, f"the docs show vfioctl commands that do not exist: {missing}"


@pytest.mark.parametrize("page_name,command,option", [m for m in ALL_MENTIONS if m[2] is not None])
def test_every_vfioctl_option_shown_exists(page_name: str, command: str, option: str) -> None:
    cmd = _command(command)
    assert cmd is not None, f"{page_name}: no command {command!r}"
    cmds = [cmd, *getattr(cmd, "commands", {}).values()]  # a group: its subcommands' too
    opts = {o for c in cmds for p in c.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    assert option in opts, (
        f"{page_name}: `vfioctl {command}` has no {option} (it has {sorted(opts)})"
    )


# ------------------------------------------------------------------------ paths, names, kustomize


_PATH = re.compile(
    r"(?<![\w/.<-])(?<!logs )(?<!logs\n)"
    r"((?:deploy|tests|bench|scripts|demo|docs|proto|vfio_dp|vm_translate|cli)/[\w./-]*\w)"
)


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_path_named_exists(doc: Page) -> None:
    # (``kubectl logs deploy/<name>`` names a Deployment, not a path)
    paths = set(_PATH.findall(doc.text))
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_the_install_names_its_overlays() -> None:
    paths = set(_PATH.findall(page(REPO / "docs/install.md").text))
    assert {"deploy/overlays/cert-manager", "deploy/overlays/self-signed"} <= paths


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_dotted_name_of_ours_imports(doc: Page) -> None:
    names = {
        n
        for code in doc.code()
        for n in re.findall(r"(?<![\w.])((?:vfio_dp|vm_translate|cli)(?:\.\w+)+)", code)
    }
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"{doc.name} names what the code does not have (renamed?): {missing}"


def test_the_architecture_page_names_every_module() -> None:
    """A newcomer finds each job's room from docs/architecture.md alone: every module of
    ours (generated ``_pb`` code aside) is named there, in a room's row or a rule's."""
    import pkgutil

    text = page(REPO / "docs/architecture.md").text
    missing = []
    for top in ("vfio_dp", "vm_translate", "cli"):
        pkg = importlib.import_module(top)
        for m in pkgutil.walk_packages(pkg.__path__, f"{top}."):
            if m.ispkg or "._" in m.name:
                continue
            if not re.search(rf"(?<![\w.]){re.escape(m.name)}(?!\w)", text):
                missing.append(m.name)
    assert not missing, f"docs/architecture.md names no room for {missing}"


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_kustomize_target_is_a_kustomization(doc: Page) -> None:
    targets = set(
        re.findall(
            r"kubectl (?:apply|delete|kustomize)(?: -k)? (deploy/[\w/.-]*\w)(?![\w/<])", doc.text
        )
    )
    targets |= set(re.findall(r"\(cd (deploy/[\w/.-]+) && kustomize", doc.text))
    for t in targets:
        assert (REPO / t / "kustomization.yaml").is_file(), f"{doc.name}: {t}"


def test_the_install_applies_each_tls_route_and_sets_the_image_in_the_base() -> None:
    text = page(REPO / "docs/install.md").text
    for t in ("deploy/overlays/cert-manager", "deploy/overlays/self-signed"):
        assert re.search(rf"(?:-k |\(cd ){re.escape(t)}\b", text), t
    # the image: the operator's own overlay (rendered in tests/deploy/test_image_setting.py)
    # or the base's one images: entry
    assert "deploy/base/kustomization.yaml" in text and "my-site/kustomization.yaml" in text


def _workloads() -> set[str]:
    names: set[str] = set()
    for f in (REPO / "deploy").rglob("*.yaml"):
        for obj in yaml.safe_load_all(f.read_text()):
            if isinstance(obj, dict) and obj.get("kind") in ("DaemonSet", "Deployment"):
                prefix = "ds" if obj["kind"] == "DaemonSet" else "deploy"
                names.add(f"{prefix}/{obj['metadata']['name']}")
    return names


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_every_workload_whose_logs_are_shown_is_shipped(doc: Page) -> None:
    shown = set(re.findall(r"\blogs\s((?:ds|deploy)/[\w-]+)", doc.text))
    missing = sorted(shown - _workloads())
    assert not missing, f"{doc.name} shows logs of workloads deploy/ does not ship: {missing}"


@pytest.mark.parametrize("doc", PAGES, ids=IDS)
def test_shell_steps_never_leave_the_checkout_root(doc: Page) -> None:
    for block in doc.blocks("sh"):
        for line in block.splitlines():
            assert not re.match(r"\s*cd\b", line), (
                f"{doc.name}: `{line.strip()}` leaves the reader elsewhere; the next steps run "
                "from the checkout root (use a subshell: `(cd DIR && ...)`)"
            )


def test_image_step_names_the_base_images_entry() -> None:
    """The docs set the image in the operator's own overlay, by the name the base renders
    (its one images: entry's newName), and never call the standalone ``kustomize``, which
    setup does not install (issue 38.4: the README did); ``kubectl kustomize`` is fine."""
    base = yaml.safe_load((REPO / "deploy/base/kustomization.yaml").read_text())
    (entry,) = base["images"]
    assert entry["name"] in (REPO / "deploy/base/daemonset.yaml").read_text()
    shown = [n for d in PAGES for n in re.findall(r"images:\n\s*- name: ([\w./-]+)", d.text)]
    assert shown, "the docs show how to set the image"
    assert set(shown) == {entry["newName"]}
    for d in PAGES:
        for block in d.blocks("sh"):
            for line in block.splitlines():
                assert not re.match(r"\s*(?:\(cd [^)]*&& )?kustomize\b", line), (d.name, line)


def _shell_invocations() -> list[tuple[str, str]]:
    """(page, line) for every ``vfioctl ...`` run in a shell block (``sudo`` allowed)."""
    return [
        (doc.name, line)
        for doc in PAGES
        for block in doc.blocks("sh")
        for raw in block.splitlines()
        if re.match(r"(?:sudo )?vfioctl ", line := raw.split(" # ")[0].strip())
    ]


@pytest.mark.parametrize("page_name,line", _shell_invocations())
def test_every_vfioctl_command_line_shown_is_accepted(page_name: str, line: str) -> None:
    """Parsed by the real command (options, types, arguments), not run."""
    words = shlex.split(re.split(r"\s[|&;]", line)[0])
    words = words[words.index("vfioctl") + 1 :]
    cmd = _command(words[0])
    assert cmd is not None, f"{page_name}: no command in `{line}`"
    try:
        cmd.make_context(f"vfioctl {words[0]}", words[1:])
    except click.ClickException as e:
        pytest.fail(f"{page_name}: `{line}` is refused: {e.format_message()}")


# ------------------------------------------------------------------------ JSON fields


def _documented_fields(command: str) -> set[str]:
    """The field names the CLI reference lists for ``vfioctl <command> -o json`` (names in
    parentheses are values or sub-fields, not fields)."""
    text = page(REPO / "docs/cli.md").prose()
    m = re.search(rf"JSON fields of `{command}`:(.*?)(?:\n\n|$)", text, re.S)
    assert m, f"docs/cli.md lists the JSON fields of `{command}`"
    para = m.group(1)
    while (cut := re.sub(r"\([^()]*\)", "", para)) != para:
        para = cut
    return set(re.findall(r"`([a-z][A-Za-z_]*)`", para))


@pytest.mark.parametrize("command", ["list", "groups"])
def test_the_json_fields_listed_are_the_json_fields(command: str, tmp_path: Path) -> None:
    tree = gpu_host(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    args = [command, "-o", "json", "--root", str(tree.root)]
    p = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows, f"vfioctl {command} printed no rows on the test host"
    actual = set(rows[0])
    documented = _documented_fields(command)
    assert documented == actual, (
        f"docs/cli.md lists for `{command}`: missing {sorted(actual - documented)}, "
        f"not printed {sorted(documented - actual)}"
    )


def test_sections_the_code_points_to_exist() -> None:
    """A comment elsewhere that sends the reader to ``README.md ("Heading")`` or
    ``docs/page.md ("Heading")`` finds that heading there (headings may be longer)."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    pointers = []
    for name in files:
        path = REPO / name
        if path.suffix == ".md" or path == Path(__file__) or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for target, heading in re.findall(r"((?:docs/)?[\w-]+\.md) \(\"([^\"]+)\"\)", text):
            pointers.append((name, target, heading))
    assert pointers, "the Vagrantfile points to the README's Vagrant section"
    for name, target, heading in pointers:
        doc = page(REPO / target)
        headings = re.findall(r"(?m)^#{1,6} (.+)$", doc.prose())
        assert any(h.startswith(heading) for h in headings), (
            f"{name} sends the reader to {target} ({heading!r}), which has no such heading"
        )


def test_the_install_shows_the_shipped_command_lines() -> None:
    """ "What gets installed" quotes each base workload's command line exactly as shipped."""
    shown = {
        " ".join(span.split())
        for span in re.findall(r"`(vfioctl\s[^`]+)`", page(REPO / "docs/install.md").prose())
    }
    for f in ("daemonset.yaml", "webhook-deployment.yaml"):
        obj = yaml.safe_load((REPO / "deploy/base" / f).read_text())
        (ctr,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c.get("args")]
        line = " ".join([*ctr["command"], *map(str, ctr["args"])])
        assert line in shown, f"docs/install.md does not show {f}'s command line: {line}"


def test_the_architecture_page_states_every_import_contract() -> None:
    """Its table of contracts names each ``[tool.importlinter]`` contract by its name."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    text = page(REPO / "docs/architecture.md").text.replace("\\|", "|")
    missing = [c["name"] for c in contracts if c["name"] not in text]
    assert contracts and not missing, f"docs/architecture.md does not state the contracts {missing}"
