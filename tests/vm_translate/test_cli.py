"""``vfioctl translate | hostdev | webhook`` end to end (click runner; the webhook as a real
subprocess over real TLS)."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli.main import vfioctl
from tests.vm_translate.conftest import CONFIG_YAML

VMI_YAML = """\
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm1, namespace: ns}
spec:
  domain:
    devices:
      gpus: [{name: gpu1, deviceName: "10DE:1EB8"}]
      hostDevices: [{name: audio, deviceName: "10de:10f8"}]
"""

ENV = {
    "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8": "0000:65:00.0",
    "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_10F8": "0000:65:00.1",
}


@pytest.fixture()
def files(tmp_path: Path) -> Path:
    (tmp_path / "vmi.yaml").write_text(VMI_YAML)
    (tmp_path / "config.yaml").write_text(CONFIG_YAML)
    return tmp_path


def run(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> tuple[int, str, str]:
    result = CliRunner().invoke(vfioctl, list(args), env=env, input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_translate_prints_yaml(files: Path) -> None:
    code, out, _ = run("translate", str(files / "vmi.yaml"), "--config", str(files / "config.yaml"))
    assert code == 0
    obj = yaml.safe_load(out)
    assert (
        obj["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] == "devices.kubevirt.io/10de_1eb8"
    )


def test_translate_patch_from_stdin_and_config_from_env(files: Path) -> None:
    code, out, _ = run(
        "translate",
        "-",
        "--patch",
        env={"VFIOCTL_CONFIG": str(files / "config.yaml")},
        stdin=VMI_YAML,
    )
    assert code == 0
    assert [op["path"] for op in json.loads(out)] == [
        "/spec/domain/devices/hostDevices/0/deviceName",
        "/spec/domain/devices/gpus/0/deviceName",
    ]


def test_translate_errors_exit_1(files: Path) -> None:
    (files / "bad.yaml").write_text(VMI_YAML.replace("10DE:1EB8", "8086:0a54"))
    code, out, err = run(
        "translate", str(files / "bad.yaml"), "--config", str(files / "config.yaml")
    )
    assert code == 1 and out == ""
    assert "gpus[0] (name 'gpu1').deviceName: '8086:0a54'" in err and "ambiguous" in err


def test_translate_unreadable_input_exit_2(files: Path) -> None:
    (files / "x.yaml").write_text("a: [")
    assert run("translate", str(files / "x.yaml"))[0] == 2
    assert run("translate", str(files / "missing.yaml"))[0] == 2


def test_hostdev_prints_and_merges(files: Path) -> None:
    code, out, _ = run("hostdev", str(files / "vmi.yaml"), env=ENV)
    assert code == 0
    assert out.count("<hostdev ") == 2 and 'alias name="ua-gpu-gpu1"' in out
    base = Path(__file__).parent / "data" / "domain_base.xml"
    code, merged, _ = run(
        "hostdev", str(files / "vmi.yaml"), "--domain-xml", str(base), "--multifunction", env=ENV
    )
    assert code == 0
    assert 'slot="0x11" function="0x0" multifunction="on"' in merged


def test_hostdev_pod_annotation_from_env(files: Path) -> None:
    env = {**ENV, "VFIOCTL_POD_ANNOTATION": '[{"name": "g", "vendor": "10de", "device": "1eb8"}]'}
    code, out, _ = run("hostdev", env=env)
    assert code == 0 and 'alias name="ua-hostdevice-g"' in out


def test_hostdev_missing_env_exit_1_names_variable(files: Path) -> None:
    code, _, err = run(
        "hostdev", str(files / "vmi.yaml"), env={"PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8": ""}
    )
    assert code == 1
    assert "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_10F8 is not set" in err


def test_hostdev_usage_errors_exit_2(files: Path) -> None:
    assert run("hostdev")[0] == 2
    assert run("hostdev", str(files / "vmi.yaml"), "--live")[0] == 2
    assert run("hostdev", str(files / "vmi.yaml"), "--guest-slot", "zz")[0] == 2


def test_hostdev_connect_defines_in_test_driver(files: Path) -> None:
    base = Path(__file__).parent / "data" / "domain_base.xml"
    code, out, err = run(
        "hostdev",
        str(files / "vmi.yaml"),
        "--domain-xml",
        str(base),
        "--connect",
        "test:///default",
        env=ENV,
    )
    assert code == 0, err
    assert out.strip() == "defined vm1: ua-hostdevice-audio, ua-gpu-gpu1"
    # by name: the test driver's built-in domain "test" (its memballoon sits on guest 00:02.0)
    code, out, err = run(
        "hostdev", str(files / "vmi.yaml"), "--connect", "test:///default", "--domain", "test",
        "--multifunction", "--guest-slot", "0x02", env=ENV,
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == "defined test: ua-hostdevice-audio, ua-gpu-gpu1"


def test_webhook_command_self_signed_over_tls(tmp_path: Path) -> None:
    """The real command as the Deployment runs it, minus the flags that name files."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from cli.main import main; main()",
            "webhook",
            "--self-signed",
            "--address",
            "127.0.0.1",
            "--port",
            "0",
            "--cert-dir",
            str(tmp_path),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[2]),
        env={**os.environ, "VFIOCTL_CONFIG": ""},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith("# CA:")
        ca_bundle = proc.stdout.readline().strip()
        ca = base64.b64decode(ca_bundle)
        assert ca == (tmp_path / "ca.crt").read_bytes()
        line = proc.stderr.readline()
        assert line.startswith("serving https://127.0.0.1:"), line
        url = line.split()[1].rsplit("/", 1)[0]
        ctx = ssl.create_default_context(cadata=ca.decode())
        deadline = time.monotonic() + 10
        with urllib.request.urlopen(
            url + "/healthz", context=ctx, timeout=deadline - time.monotonic()
        ) as r:
            assert r.read() == b"ok"
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "1", "operation": "CREATE", "object": yaml.safe_load(VMI_YAML)},
        }
        req = urllib.request.Request(
            url + "/mutate", data=json.dumps(review).encode(), method="POST"
        )
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            assert json.loads(r.read())["response"]["patchType"] == "JSONPatch"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err


def test_webhook_needs_certificates() -> None:
    code, _, err = run("webhook")
    assert code == 2 and "--tls-cert and --tls-key, or --self-signed" in err


def test_commands_module_is_import_light() -> None:
    """``vfioctl list`` loads cli.vm_cmds; it must not drag in the heavy libraries."""
    heavy = ["aiohttp", "lxml", "libvirt", "kubernetes", "cryptography", "yaml"]
    code = (
        "import sys, cli.vm_cmds, vm_translate, vm_translate.errors\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(Path(__file__).parents[2]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr  # the child's assert names what it loaded
