"""The Kubernetes API calls the webhook makes: list nodes, DeviceClasses, ResourceSlices.

Imports the ``kubernetes`` client lazily (~220 ms) — only a webhook started with the
node check pays for it, and only in the child process of :class:`ChildNodeLister`. In-cluster config first (the webhook's ServiceAccount needs
``get/list`` on ``nodes``, and ``list`` on ``deviceclasses`` and ``resourceslices`` for names
DRA serves), else ``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

from vm_translate.errors import NodeCheckError
from vm_translate.nodes import NodeResources, dra_capacity, nodes_from_list, with_dra


def list_nodes() -> list[NodeResources]:
    """``GET /api/v1/nodes`` → :class:`NodeResources` (blocking; run it in a thread)."""
    from kubernetes import client, config

    try:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        # _preload_content=False: the raw JSON, skipping the slow model deserialization
        resp: Any = client.CoreV1Api().list_node(_preload_content=False, _request_timeout=5)
        data: Any = json.loads(resp.data)
    except Exception as e:  # the client raises many unrelated types; all mean "cannot ask"
        raise NodeCheckError(
            f"cannot list nodes for the capacity check: {e}; give the webhook's ServiceAccount "
            "list on nodes, or run without --check-nodes"
        ) from e
    nodes = nodes_from_list(data.get("items") or [])
    classes, slices = _dra_objects(client)
    counts, unchecked = dra_capacity(classes, slices)
    return with_dra(nodes, counts, unchecked)


def _dra_objects(client: Any) -> tuple[list[Any], list[Any]]:
    """DeviceClasses and ResourceSlices (``resource.k8s.io/v1``); none on a cluster without
    that API (404: Kubernetes < 1.34)."""
    from kubernetes.client.exceptions import ApiException

    api = client.ResourceV1Api()
    try:
        classes = json.loads(api.list_device_class(_preload_content=False, _request_timeout=5).data)
        slices = json.loads(
            api.list_resource_slice(_preload_content=False, _request_timeout=5).data
        )
    except ApiException as e:
        if e.status == 404:
            return [], []
        raise NodeCheckError(
            f"cannot list DeviceClasses and ResourceSlices for the capacity check: {e.reason}; "
            "give the webhook's ServiceAccount list on deviceclasses and resourceslices "
            "(deploy/components/check-nodes), or run without --check-nodes"
        ) from e
    except Exception as e:
        raise NodeCheckError(
            f"cannot list DeviceClasses and ResourceSlices for the capacity check: {e}"
        ) from e
    return list(classes.get("items") or []), list(slices.get("items") or [])


class ChildNodeLister:
    """:func:`list_nodes` in ONE child process (``python -m vm_translate.kube_adapter``,
    started at the first list and kept): the webhook's node fetch. Decoding the lists and
    reducing them (100 nodes and 6,400 DRA devices: ~35 ms of CPU) in a thread of the
    serving process held its GIL: every socket call of the event loop then waited up to the
    5 ms switch interval for it, and a review answered during a relist took ~150 ms (p99 at
    500 reviews/s). Over the child's stdin, one line per list; on its stdout, one line of
    JSON: the reduced nodes (a few KB), or the NodeCheckError's text::

        {"nodes": [{"name": "node-a", "allocatable": {"cpu": 8}, "unchecked": []}]}
        {"error": "cannot list nodes for the capacity check: ..."}

    A child that dies (OOM-killed) fails that fetch with NodeCheckError; the next fetch
    starts a new one. The child exits when its stdin closes (the webhook stopped or died)."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self.started = 0  #: child processes started so far

    async def __call__(self) -> list[NodeResources]:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            proc = self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vm_translate.kube_adapter",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=_LINE_LIMIT,
            )  # fmt: skip
            self.started += 1
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"list\n")
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        except (OSError, ValueError) as e:  # a broken pipe; a line over the limit
            line = f"{e}".encode() or b"?"
        except BaseException:  # cancelled mid-answer: the next answer would be this one's
            await self.close()
            raise
        if not line.endswith(b"\n"):
            await self.close()
            raise NodeCheckError(
                "the process listing nodes for the capacity check died "
                f"({line.decode(errors='replace')[:200] or 'no answer'}); a new one is "
                "started at the next list (is the webhook's memory limit too low?)"
            )
        return nodes_of_line(line)

    async def close(self) -> None:
        """Stop the child (it also exits by itself when this process dies: its stdin closes)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def nodes_of_line(line: bytes) -> list[NodeResources]:
    """The nodes of one answer line of :class:`ChildNodeLister`'s protocol, or its
    NodeCheckError."""
    got = json.loads(line)
    if "error" in got:
        raise NodeCheckError(str(got["error"]))
    return [
        NodeResources(n["name"], n["allocatable"], frozenset(n["unchecked"])) for n in got["nodes"]
    ]


def line_of_nodes(nodes: list[NodeResources] | NodeCheckError) -> bytes:
    """One answer line of :class:`ChildNodeLister`'s protocol (its child's, and the
    supervisor's to its workers: :mod:`vm_translate.workers`)."""
    if isinstance(nodes, NodeCheckError):
        return (json.dumps({"error": str(nodes)}) + "\n").encode()
    out = {"nodes": [
        {"name": n.name, "allocatable": dict(n.allocatable), "unchecked": sorted(n.unchecked)}
        for n in nodes
    ]}  # fmt: skip
    return (json.dumps(out) + "\n").encode()


#: the longest answer line of the child (100,000 nodes of 100 resources fit)
_LINE_LIMIT = 256 * 1024 * 1024


def _serve_lists() -> None:
    """The child of :class:`ChildNodeLister`: one answer line per line read on stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the webhook's to handle
    for _ in sys.stdin:
        try:
            line = line_of_nodes(list_nodes())
        except NodeCheckError as e:
            line = line_of_nodes(e)
        sys.stdout.buffer.write(line)
        sys.stdout.flush()


if __name__ == "__main__":
    _serve_lists()
