"""Every node at once, pure: what ``kubectl vfio`` merges and summarises (no I/O, no client).

``kubectl vfio --all-nodes list`` runs ``vfioctl list`` in the DaemonSet pod of each node and
hands the outputs here: tables get a ``NODE`` column in front, JSON lists get a ``"node"``
field in each item. ``kubectl vfio status`` needs no exec at all: it summarises, per node, what
the cluster's API objects already say —

- the DaemonSet pods of ours on the node (``Running`` and Ready, of all);
- device-plugin devices: the node's ``status.allocatable`` entries in the resource domain
  (``devices.kubevirt.io/8086_10d3: "2"``);
- DRA devices: the devices of the node's ResourceSlices of our DRA driver, newest pool
  generation only (as the scheduler reads them), how many carry a taint (our plugin taints a
  prepared group that went bad: design.md's table) and how many are allocated to a claim
  (``status.allocation.devices.results[]`` naming our driver and the node's pool).

``held`` reads ``vfioctl groups -o json``: a group a process holds open has ``in_use: true``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vm_translate.errors import FleetError

#: what ``--all-nodes`` may run: commands that only read the node (never bind, unbind, serve)
READ_COMMANDS = ("check", "groups", "list", "sriov")


def read_command(args: Sequence[str]) -> list[str]:
    """``args`` as a ``vfioctl`` read command, or :class:`FleetError` naming what to run instead.

    ``sriov set`` writes: it is refused like ``bind``."""
    if not args:
        raise FleetError(f"name a vfioctl read command: one of {', '.join(READ_COMMANDS)}")
    if args[0] not in READ_COMMANDS or (args[0] == "sriov" and "set" in args[1:]):
        shown = " ".join(args[:2])
        raise FleetError(
            f"{shown!r} is not a read command; kubectl vfio runs only "
            f"{', '.join(READ_COMMANDS)} (to change a node, use kubectl exec on its pod)"
        )
    return ["vfioctl", *args]


def wants_json(args: Sequence[str]) -> bool:
    """Did the command ask for ``-o json`` / ``--output json`` / ``-ojson``?"""
    for i, a in enumerate(args):
        if a in ("-o", "--output") and i + 1 < len(args) and args[i + 1] == "json":
            return True
        if a in ("-ojson", "--output=json"):
            return True
    return False


def merge_tables(outputs: Sequence[tuple[str, str]]) -> str:
    """One table from each node's table: the first header once, ``NODE`` in front of every row.

    A node whose output has no rows adds nothing; text that is not a table (a one-line message)
    is kept as a row under its node."""
    width = max([len("NODE"), *(len(n) for n, _ in outputs)])
    header: str | None = None
    rows: list[str] = []
    for node, text in outputs:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            continue
        first, *rest = lines
        if first.split()[0].isupper():  # a table's header: its first column is a capital word
            header = header or first
        else:
            rest = lines
        rows.extend(f"{node:<{width}}  {ln}" for ln in rest)
    out = [f"{'NODE':<{width}}  {header}"] if header else []
    return "\n".join(out + rows) + ("\n" if out or rows else "")


def merge_json(outputs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """One JSON list: each item of each node's list (or its one object) with ``"node"``."""
    merged: list[dict[str, Any]] = []
    for node, text in outputs:
        try:
            doc = json.loads(text) if text.strip() else []
        except ValueError as e:
            raise FleetError(f"node {node}: the command's output is not JSON: {e}") from e
        for item in doc if isinstance(doc, list) else [doc]:
            merged.append(
                {"node": node, **item} if isinstance(item, dict) else {"node": node, "value": item}
            )
    return merged


def held_groups(node: str, groups_json: str) -> list[dict[str, Any]]:
    """The groups of ``vfioctl groups -o json`` that a process holds open (``in_use: true``)."""
    return [
        {"node": node, "group": g.get("group"), "devices": g.get("devices") or []}
        for g in merge_json([(node, groups_json)])
        if g.get("in_use") is True
    ]


@dataclass(frozen=True)
class NodeStatus:
    """One node's line of ``kubectl vfio status``."""

    node: str
    pods_ready: int
    pods: int
    device_plugin: int  # allocatable devices in the resource domain
    dra: int  # published DRA devices (newest generation)
    allocated: int  # of those, allocated to a claim
    tainted: int  # of those, carrying a taint

    def as_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "pods": {"ready": self.pods_ready, "total": self.pods},
            "devicePlugin": self.device_plugin,
            "dra": {"published": self.dra, "allocated": self.allocated, "tainted": self.tainted},
        }


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return status.get("phase") == "Running" and ready


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0  # a quantity such as "1k" is not a device count a plugin advertises


def node_status(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    *,
    domain: str,
    driver: str,
) -> list[NodeStatus]:
    """Per node (every node with a pod of ours, a resource of ``domain`` or a slice of
    ``driver``), sorted by name. Plain API dicts in, as the client's ``to_dict`` or the JSON
    wire gives them (camelCase keys)."""
    prefix = domain.rstrip("/") + "/"
    names: set[str] = set()
    dp: dict[str, int] = {}
    for n in nodes:
        name = (n.get("metadata") or {}).get("name") or ""
        alloc = (n.get("status") or {}).get("allocatable") or {}
        ours = [v for k, v in alloc.items() if k.startswith(prefix)]
        if ours:
            names.add(name)
            dp[name] = sum(_count(v) for v in ours)
    ready: dict[str, int] = {}
    total: dict[str, int] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node:
            names.add(node)
            total[node] = total.get(node, 0) + 1
            ready[node] = ready.get(node, 0) + _pod_ready(p)
    newest: dict[tuple[str, str], int] = {}
    mine = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    for s in mine:
        pool = s["spec"].get("pool") or {}
        key = (s["spec"].get("nodeName") or "", pool.get("name") or "")
        newest[key] = max(newest.get(key, 0), _count(pool.get("generation", 0)))
    taken = {
        (r.get("pool"), r.get("device"))
        for c in claims
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
        if r.get("driver") == driver
    }
    dra: dict[str, int] = {}
    allocated: dict[str, int] = {}
    tainted: dict[str, int] = {}
    for s in mine:
        spec = s["spec"]
        node = spec.get("nodeName") or ""
        pool = spec.get("pool") or {}
        if not node or _count(pool.get("generation", 0)) != newest[(node, pool.get("name") or "")]:
            continue
        names.add(node)
        for d in spec.get("devices") or []:
            dra[node] = dra.get(node, 0) + 1
            allocated[node] = allocated.get(node, 0) + ((pool.get("name"), d.get("name")) in taken)
            tainted[node] = tainted.get(node, 0) + bool(d.get("taints"))
    names.discard("")
    return [
        NodeStatus(
            n,
            ready.get(n, 0),
            total.get(n, 0),
            dp.get(n, 0),
            dra.get(n, 0),
            allocated.get(n, 0),
            tainted.get(n, 0),
        )
        for n in sorted(names)
    ]


def status_table(rows: Sequence[NodeStatus]) -> str:
    """``kubectl vfio status`` for a person."""
    head = ("NODE", "PODS", "DEVICE-PLUGIN", "DRA", "ALLOCATED", "TAINTED")
    cells = [
        (r.node, f"{r.pods_ready}/{r.pods}", str(r.device_plugin), str(r.dra),
         str(r.allocated), str(r.tainted))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in [head, *cells]
    )
