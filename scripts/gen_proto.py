#!/usr/bin/env python3
"""Regenerate the committed kubelet API code (device plugin, plugin registration, DRA, DRA health) from ``proto/``.

    python3 scripts/gen_proto.py            # writes vfio_dp/deviceplugin/_pb/... and vfio_dp/dra/_pb/...
    python3 scripts/gen_proto.py --out DIR  # writes DIR/vfio_dp/deviceplugin/_pb/... (drift test)

The generator is pinned (``grpcio-tools==1.76.0`` in the ``test`` extra); the generated
modules check the runtime ``grpcio``/``protobuf`` versions at import, so the floors in
pyproject.toml's dependencies must match what this generator emits. Refuses to run with any
other grpcio-tools version, so a drift is never silently "fixed" by a different generator.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PROTOS = [
    "vfio_dp/deviceplugin/_pb/deviceplugin/v1beta1/api.proto",
    # vendored verbatim from kubernetes/kubelet pkg/apis/... (see each file's header)
    "vfio_dp/deviceplugin/_pb/podresources/v1/api.proto",
    "vfio_dp/dra/_pb/pluginregistration/v1/api.proto",
    "vfio_dp/dra/_pb/dra/v1/api.proto",
    "vfio_dp/dra/_pb/dra/v1beta1/api.proto",
    "vfio_dp/dra/_pb/dra_health/v1/api.proto",
    "vfio_dp/dra/_pb/dra_health/v1alpha1/api.proto",
]
GENERATOR = "grpcio-tools"
GENERATOR_VERSION = "1.76.0"


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpc_tools) for every proto; return the files written under ``out``."""
    have = metadata.version(GENERATOR)
    if have != GENERATOR_VERSION:
        raise SystemExit(f"{GENERATOR}=={GENERATOR_VERSION} is pinned, found {have}")
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *(str(PROTO_ROOT / p) for p in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed: " + " ".join(args))
    written: list[Path] = []
    for p in PROTOS:
        stem = Path(p).with_suffix("")
        for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"):
            written.append(out / (str(stem) + suffix))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="output root (default: repo)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
