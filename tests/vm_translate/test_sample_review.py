"""docs/examples/admission-review.json, sent to the real webhook as the README's curl line
does (issue 38.3): the webhook started with --self-signed answers it over HTTPS, verified
with the CA it wrote, with the JSON Patch that canonicalises both device names."""

from __future__ import annotations

import base64
import json
import re
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "docs/examples/admission-review.json"


def test_the_readme_sends_the_sample() -> None:
    readme = (REPO / "README.md").read_text()
    assert "--data @docs/examples/admission-review.json https://localhost:8443/mutate" in readme


def test_the_webhook_answers_the_sample_as_the_readme_shows(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "webhook", "--self-signed",
         "--cert-dir", str(certs), "--address", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:  # the webhook says where it serves once it does
            m = re.match(r"serving https://127\.0\.0\.1:(\d+)/mutate", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "the webhook never said it serves"
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mutate",
            data=SAMPLE.read_bytes(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=ctx, timeout=30) as r:
            answer = json.loads(r.read())
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    sent = json.loads(SAMPLE.read_text())
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"] and response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {(op["path"], op["value"]) for op in patch} == {
        ("/spec/domain/devices/gpus/0/deviceName", "devices.kubevirt.io/10de_1eb8"),
        ("/spec/domain/devices/hostDevices/0/deviceName", "devices.kubevirt.io/8086_10d3"),
    }
