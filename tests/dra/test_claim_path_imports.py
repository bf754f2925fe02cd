"""Importing the DRA claim path loads no gRPC: a tool, a bench or a test that prepares claims
pays neither for ``grpc`` (~70 ms, 30-50x more in the emulated guest) nor for the generated
code; only the kubelet shell (:mod:`vfio_dp.dra.kubeletapi.server`) imports them."""

from __future__ import annotations

import subprocess
import sys

CLAIM_PATH = [
    "vfio_dp.dra.claimpath.claims",
    "vfio_dp.dra.claimpath.resolve",
    "vfio_dp.dra.claimpath.edits",
    "vfio_dp.dra.claimpath.prepare",
    "vfio_dp.dra.claimpath.reconcile",
    "vfio_dp.dra.claimpath.checkpoint",
    "vfio_dp.dra.claimpath.cdi",
    "vfio_dp.dra.claimpath.metadata",
    "vfio_dp.dra.slices",
]


def _loaded_after(imports: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {imports!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_claim_path_loads_no_grpc() -> None:
    loaded = _loaded_after(CLAIM_PATH)
    assert "vfio_dp.dra.claimpath.prepare" in loaded and "vfio_dp.dra.claimpath.reconcile" in loaded
    assert "grpc" not in loaded
    assert not {m for m in loaded if m.startswith(("grpc.", "google.protobuf", "vfio_dp.dra._pb"))}
    assert "vfio_dp.dra.kubeletapi.server" not in loaded


def test_the_check_can_fail() -> None:
    """The same check sees grpc once the kubelet shell is imported (the test is not blind)."""
    loaded = _loaded_after(["vfio_dp.dra.kubeletapi.server"])
    assert "grpc" in loaded and "vfio_dp.dra._pb.dra.v1.api_pb2" in loaded
