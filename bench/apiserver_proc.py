#!/usr/bin/env python3
"""The API-server stand-in (tests/dra/apiserver_standin.py) in a process of its own, as the
real API server is: never in the plugin's process, never under its GIL.

The bench rows that run the DRA plugin in their own process (bench/fleet.py rows 1 and 3c)
start it with :class:`ApiServerProcess`; its child is this script::

    python3 bench/apiserver_proc.py --dir DIR

which prints the stand-in's kubeconfig path, then answers one JSON line on stdout for each
JSON line read on stdin, until stdin closes:
``{"op": "seed", "plural": "resourceclaims", "objects": [...]}`` → ``{"seeded": [...]}``
(each object stored as :meth:`ApiServerStandin.seed` does: status kept, validated).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class ApiServerProcess:
    """The stand-in in a child process: :attr:`kubeconfig`, :meth:`client`, :meth:`seed`,
    :attr:`pid` (its CPU is not the bench process's)."""

    def __init__(self, directory: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--dir", directory],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.kubeconfig = self.proc.stdout.readline().strip()
        if not self.kubeconfig:
            self.proc.wait()
            raise RuntimeError(f"the API-server stand-in exited {self.proc.returncode}")
        self.pid = self.proc.pid

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"the API-server stand-in: {answer['error']}")
        return answer

    def seed(self, kind: Any, *objects: dict[str, Any]) -> list[dict[str, Any]]:
        """Store ``objects`` of ``kind`` (a stand-in ``Kind``) as created: what was stored."""
        seeded: list[dict[str, Any]] = self._ask(
            {"op": "seed", "plural": kind.plural, "objects": list(objects)}
        )["seeded"]
        return seeded

    def client(self) -> Any:
        """A real ``kubernetes.client.ApiClient`` loaded from :attr:`kubeconfig`."""
        import kubernetes.config

        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(directory: str) -> None:
    sys.path.insert(0, str(REPO))
    from tests.dra.apiserver_standin import KINDS, ApiServerStandin

    kinds = {k.plural: k for k in KINDS}
    api = ApiServerStandin(directory)
    api.start()
    print(api.kubeconfig, flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                if request["op"] != "seed":
                    raise ValueError(f"unknown op {request['op']!r}")
                kind = kinds[request["plural"]]
                answer: dict[str, Any] = {"seeded": [api.seed(kind, o) for o in request["objects"]]}
            except Exception as e:  # said to the parent, which raises it
                answer = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
    finally:
        api.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="the stand-in's directory (its kubeconfig)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    serve(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
