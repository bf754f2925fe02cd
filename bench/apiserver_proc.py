#!/usr/bin/env python3
"""The API-server stand-in (tests/dra/apiserver_standin.py) in a process of its own, as the
real API server is: never in the plugin's process, never under its GIL.

The bench rows that run the DRA plugin in their own process (bench/fleet.py rows 1 and 3c)
start it with :class:`ApiServerProcess`; its child is this script::

    python3 bench/apiserver_proc.py --dir DIR

which prints the stand-in's kubeconfig path, then answers one JSON line on stdout for each
JSON line read on stdin, until stdin closes:
``{"op": "seed", "plural": "resourceclaims", "objects": [...]}`` → ``{"seeded": [...]}``
(each object stored as :meth:`ApiServerStandin.seed` does: status kept, validated);
``{"op": "wait_pool", "node": ..., "devices": N, "timeout": S}`` → ``{"at": T}``: when the
node's newest pool generation is complete (``resourceSliceCount`` slices) and holds ``N``
devices, ``T`` its ``time.monotonic()`` (one clock for every process of the machine),
judged at each request the stand-in serves, as it stores it: no copy, no polling.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
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

    def pool_complete(
        self, node: str, devices: int, timeout: float, alive: Callable[[], None]
    ) -> float:
        """The ``time.monotonic()`` at which ``node``'s pool became complete with ``devices``
        devices (the child judges it as it stores each write); ``alive()`` is called every
        50 ms meanwhile (it raises to give up: the daemon under test exited)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        ask = {"op": "wait_pool", "node": node, "devices": devices, "timeout": timeout}
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        while not select.select([self.proc.stdout], [], [], 0.05)[0]:
            alive()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"the API-server stand-in: {answer['error']}")
        return float(answer["at"])

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


def _pool_complete(api: Any, node: str, devices: int, timeout: float) -> float:
    """When ``node``'s newest pool is complete with ``devices`` devices (monotonic time)."""
    from bench.dra_bench import pool_of

    at: list[float] = []

    def complete(standin: Any) -> bool:
        slices = [
            o
            for (plural, _, _), o in standin.store.objects.items()
            if plural == "resourceslices" and o["spec"].get("nodeName") == node
        ]
        if pool_of(slices)[1] == devices:
            at.append(time.monotonic())
            return True
        return False

    api.wait_for(f"{devices} devices published for {node}", complete, timeout)
    return at[0]


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
                answer: dict[str, Any]
                if request["op"] == "wait_pool":
                    answer = {"at": _pool_complete(
                        api, request["node"], request["devices"], request["timeout"])}  # fmt: skip
                elif request["op"] == "seed":
                    kind = kinds[request["plural"]]
                    answer = {"seeded": [api.seed(kind, o) for o in request["objects"]]}
                else:
                    raise ValueError(f"unknown op {request['op']!r}")
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
