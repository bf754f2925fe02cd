"""``--check-nodes`` at cluster scale (issue 39 row 4): the node lists are fetched and reduced
in a child process of the webhook (vm_translate.kube_adapter.ChildNodeLister), never in the
serving process (whose GIL the reviews need), against the API-server stand-in with the real
Kubernetes client, over real TLS; a review with the list cached awaits nothing for it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.config import kube_config

from tests.dra.apiserver_standin import NODES, ApiServerStandin
from tests.vm_translate.test_webhook import GPU, VMI, post, review, start
from tests.waiting import wait_until, wait_until_async
from vfio_dp.model.config import Config
from vm_translate import kube_adapter
from vm_translate.errors import NodeCheckError
from vm_translate.kube_adapter import ChildNodeLister
from vm_translate.nodes import NodeResources
from vm_translate.webhook_limits import NODE_CHECK_RSS, WebhookSettings, worst_case_rss_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServerStandin]:
    server = ApiServerStandin(str(tmp_path / "api"))
    server.start()
    for name in ("n1", "n2"):  # neither advertises the VMI's 10de_1eb8: the review is denied
        server.seed(NODES, {"metadata": {"name": name},
                            "status": {"allocatable": {"example.com/mlx": "2"}}})  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", server.kubeconfig)  # the child inherits it
    # this process's client read KUBECONFIG at its import (a node list made here finds it)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", server.kubeconfig)
    yield server
    server.stop()


def node_lists(api: ApiServerStandin) -> int:
    return sum(1 for r in list(api.requests) if r.method == "GET" and r.path == "/api/v1/nodes")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def children(pid: int, marker: str = "vm_translate.kube_adapter") -> list[int]:
    """Child processes of ``pid`` whose command line holds ``marker`` (the pool's worker, not
    other children)."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for k in kids:
            try:
                if marker in Path(f"/proc/{k}/cmdline").read_text():
                    out.append(int(k))
            except OSError:
                continue
    return out


async def test_node_lists_are_read_outside_the_serving_process(
    tmp_path: Path, config: Config, api: ApiServerStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review is denied from the stand-in's nodes, and the node lists this process
    decoded are 0 (in a thread of this process they held its GIL: ~150 ms p99 at 500/s)."""
    here: list[int] = []
    real = kube_adapter.nodes_from_list

    def counted(items: Any) -> Any:
        here.append(1)
        return real(items)

    monkeypatch.setattr(kube_adapter, "nodes_from_list", counted)
    s = await start(tmp_path, config, check_nodes=True)
    try:

        async def denied() -> Any:
            status, answer = await post(s, json.dumps(review(VMI)).encode())
            assert status == 200, answer
            return answer["response"] if not answer["response"]["allowed"] else None

        got = await wait_until_async(denied, what="a review checked against the nodes")
        assert "no schedulable node advertises" in got["status"]["message"]
        assert (node_lists(api), len(here)) == (1, 0)
        assert s.hook.lister is not None and s.hook.lister.started == 1
    finally:
        await s.hook.stop()


async def test_a_dead_child_fails_one_fetch_and_the_next_starts_another(
    api: ApiServerStandin,
) -> None:
    lister = ChildNodeLister()
    try:
        assert [n.name for n in await lister()] == ["n1", "n2"]
        (child,) = children(os.getpid())
        rss = rss_bytes(child)  # within what the webhook's worst case counts for it
        assert rss <= NODE_CHECK_RSS, f"the node-list child holds {rss / 2**20:.0f} MiB"
        assert (
            worst_case_rss_bytes(WebhookSettings("c", "k", check_nodes=True))
            - worst_case_rss_bytes(WebhookSettings("c", "k"))
            == NODE_CHECK_RSS
        )
        os.kill(child, signal.SIGKILL)  # as the OOM killer does
        with pytest.raises(NodeCheckError, match=r"process listing nodes .* died"):
            await lister()
        assert [n.name for n in await lister()] == ["n1", "n2"]
        assert (lister.started, node_lists(api)) == (2, 2)
    finally:
        await lister.close()


async def test_the_child_dies_with_a_killed_webhook(tmp_path: Path, api: ApiServerStandin) -> None:
    """SIGKILL of the real ``vfioctl webhook`` leaves no node-list child behind (it waited on
    its pipe for ever without ``PR_SET_PDEATHSIG``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "webhook", "--self-signed",
         "--address", "127.0.0.1", "--port", "0", "--cert-dir", str(tmp_path / "certs"),
         "--check-nodes", "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, "VFIOCTL_CONFIG": ""},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.readline()
        url = proc.stderr.readline().split()[1]
        ctx = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        async with aiohttp.ClientSession() as session:

            async def denied() -> Any:
                async with session.post(url, json=review(VMI), ssl=ctx) as r:
                    got = (await r.json())["response"]
                    return got if not got["allowed"] else None

            await wait_until_async(denied, what="a review checked against the nodes")
        (child,) = children(proc.pid)
    finally:
        proc.kill()
        proc.communicate()
    wait_until(lambda: not Path(f"/proc/{child}").exists()
               or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2],
               what=f"the node-list child {child} gone after its webhook was killed")  # fmt: skip


async def test_a_review_with_the_node_list_cached_awaits_no_fetch(
    tmp_path: Path, config: Config
) -> None:
    """With the list cached, a review neither starts the shielded fetch task nor waits: the
    fetch tasks started for 5 reviews are 0 (they were 5: ~0.1 ms of CPU a review)."""
    fetches: list[int] = []

    async def fetch() -> list[NodeResources]:
        fetches.append(1)
        return [NodeResources("n1", {GPU: 1})]

    loop = asyncio.get_running_loop()
    started: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        started.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kw)

    s = await start(tmp_path, config, check_nodes=True, node_fetch=fetch)
    try:
        await wait_until_async(lambda: fetches, what="the first node list")
        loop.set_task_factory(factory)
        for _ in range(5):
            status, answer = await post(s, json.dumps(review(VMI)).encode())
            assert status == 200 and answer["response"]["allowed"] is True, answer
            assert "warnings" not in answer["response"], answer  # checked, not skipped
    finally:
        loop.set_task_factory(None)
        await s.hook.stop()
    assert ([q for q in started if "nodes_or_error" in q], len(fetches)) == ([], 1)
