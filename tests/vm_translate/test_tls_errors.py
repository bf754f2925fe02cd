"""The webhook's TLS files: which file, and what is wrong with it (issue 21 item 13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vm_translate.tls import self_signed

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    b = self_signed(["localhost"])
    cert, key = b.write(tmp_path / "good")
    other = self_signed(["localhost"]).write(tmp_path / "other")[1]
    return cert, key, other


def _webhook(cert: Path, key: Path) -> str:
    p = subprocess.run(
        [*VFIOCTL, "webhook", "--address", "127.0.0.1", "--port", "0",
         "--tls-cert", str(cert), "--tls-key", str(key)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr
    return p.stderr


def test_missing_file(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    cert, _, _ = pair
    assert f"--tls-key {tmp_path}/nope.key: no such file" in _webhook(cert, tmp_path / "nope.key")


def test_swapped_files(pair: tuple[Path, Path, Path]) -> None:
    cert, key, _ = pair
    assert "the two files are swapped" in _webhook(key, cert)


def test_mismatched_key(pair: tuple[Path, Path, Path]) -> None:
    cert, _, other = pair
    assert f"--tls-key {other} is not the private key of --tls-cert {cert}" in _webhook(cert, other)


def test_not_pem(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, key, _ = pair
    junk = tmp_path / "junk.crt"
    junk.write_text("hello")
    assert f"--tls-cert {junk} holds no PEM certificate" in _webhook(junk, key)
