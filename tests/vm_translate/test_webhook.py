"""The webhook over REAL TLS on loopback: a real aiohttp server, a real HTTPS client,
real AdmissionReview JSON, malformed/oversized/slow bodies and certificate rotation."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deviceplugin.test_metrics import series_named_in
from tests.vm_translate.streams import close_streams
from tests.waiting import wait_until_async
from vfio_dp.model.config import Config
from vm_translate.config_watch import ConfigWatch
from vm_translate.errors import NodeCheckError, TlsError
from vm_translate.nodes import NodeResources
from vm_translate.tls import CertBundle, self_signed
from vm_translate.webhook import Webhook
from vm_translate.webhook_limits import WebhookSettings

GPU = "devices.kubevirt.io/10de_1eb8"


@dataclass
class Running:
    hook: Webhook
    url: str
    client_ctx: ssl.SSLContext
    cert: Path
    key: Path
    bundle: CertBundle


def client_context(ca: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.decode())


async def start(tmp_path: Path, config: Config | ConfigWatch, **kw: Any) -> Running:
    bundle = self_signed(["localhost", "127.0.0.1"])
    cert, key = bundle.write(tmp_path / "tls")
    fetch = kw.pop("node_fetch", None)
    settings = WebhookSettings(str(cert), str(key), host="127.0.0.1", port=0, **kw)
    hook = await Webhook.start(config, settings, node_fetch=fetch)
    return Running(
        hook, f"https://127.0.0.1:{hook.port}", client_context(bundle.ca), cert, key, bundle
    )


@pytest.fixture()
async def server(tmp_path: Path, config: Config) -> AsyncIterator[Running]:
    running = await start(tmp_path, config, max_body_bytes=64 * 1024, read_timeout=0.5)
    yield running
    await running.hook.stop()


def review(obj: dict[str, Any], uid: str = "uid-7") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "object": obj},
    }


VMI = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "metadata": {"name": "vm1", "namespace": "ns"},
    "spec": {"domain": {"devices": {"hostDevices": [{"name": "nic", "deviceName": "10DE:1EB8"}]}}},
}


async def post(s: Running, data: bytes, path: str = "/mutate") -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            s.url + path, data=data, ssl=s.client_ctx, headers={"Content-Type": "application/json"}
        ) as r,
    ):
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def test_healthz(server: Running) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + "/healthz", ssl=server.client_ctx) as r,
    ):
        assert r.status == 200 and await r.text() == "ok"


async def test_metrics_count_each_answer(server: Running) -> None:
    """GET /metrics (over the same TLS): reviews by result, refusals by status."""
    bad = json.loads(json.dumps(VMI))
    bad["spec"]["domain"]["devices"]["hostDevices"][0]["deviceName"] = "10de:zz"
    plain = {**VMI, "spec": {"domain": {"devices": {"disks": []}}}}
    for obj in (VMI, VMI, bad, plain):
        assert (await post(server, json.dumps(review(obj)).encode()))[0] == 200
    assert (await post(server, b"{{{"))[0] == 400
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + "/metrics", ssl=server.client_ctx) as r,
    ):
        assert r.status == 200
        text = await r.text()
    assert 'vfio_dp_webhook_reviews_total{result="patched"} 2' in text
    assert 'vfio_dp_webhook_reviews_total{result="denied"} 1' in text
    assert 'vfio_dp_webhook_reviews_total{result="allowed"} 1' in text
    assert 'vfio_dp_webhook_refused_total{code="400"} 1' in text
    assert "# TYPE vfio_dp_webhook_reviews_total counter" in text
    # as Prometheus parses it: every series the webhook's code names, and each POST timed
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    named = series_named_in("vm_translate")
    assert named >= {"vfio_dp_webhook_reviews_total", "vfio_dp_webhook_review_seconds"}
    assert all(n.removesuffix("_total") in parsed for n in named), (sorted(named), sorted(parsed))
    timed = {s.name: s.value for s in parsed["vfio_dp_webhook_review_seconds"].samples}
    assert timed["vfio_dp_webhook_review_seconds_count"] == 5


async def test_vmi_review_gets_patch(server: Running) -> None:
    status, answer = await post(server, json.dumps(review(VMI)).encode())
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "uid-7" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "replace", "path": "/spec/domain/devices/hostDevices/0/deviceName", "value": GPU}
    ]


async def test_pod_review_patch_escapes_slashes(server: Running) -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {
                "devices.kubevirt.io/passthrough": "- {name: g, vendor: '10de', device: '1eb8', count: 2}"
            },
        },
        "spec": {"containers": [{"name": "compute", "resources": {"limits": {"memory": "1Gi"}}}]},
    }
    status, answer = await post(server, json.dumps(review(pod)).encode())
    assert status == 200
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/devices.kubevirt.io~110de_1eb8",
        "value": "2",
    } in ops
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/requests",
        "value": {GPU: "2"},
    } in ops


async def test_bad_spec_denied_with_message(server: Running) -> None:
    bad = json.loads(json.dumps(VMI))
    bad["spec"]["domain"]["devices"]["hostDevices"][0]["deviceName"] = "10de:zz"
    status, answer = await post(server, json.dumps(review(bad, uid="x")).encode())
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "x" and response["allowed"] is False
    assert "hostDevices[0] (name 'nic').deviceName: '10de:zz'" in response["status"]["message"]
    assert "each ID is exactly 4 hex digits" in response["status"]["message"]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{{{", "body is not JSON"),
        (b"", "body is not JSON"),
        (b'{"kind": "Pod", "apiVersion": "v1"}', "kind is 'Pod'"),
        (
            json.dumps({**review(VMI), "request": {"object": VMI}}).encode(),
            "request.uid is missing",
        ),
        (b'"AdmissionReview"', "not a JSON object"),
    ],
)
async def test_malformed_bodies_get_400_with_reason(
    server: Running, data: bytes, reason: str
) -> None:
    status, answer = await post(server, data)
    assert status == 400
    assert reason in answer["error"]
    # and the server is still fine afterwards
    assert (await post(server, json.dumps(review(VMI)).encode()))[0] == 200


async def test_oversized_body_gets_413(server: Running) -> None:
    big = json.dumps(review({**VMI, "padding": "x" * (128 * 1024)})).encode()
    status, _ = await post(server, big)
    assert status == 413


async def test_get_on_mutate_is_405(server: Running) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + "/mutate", ssl=server.client_ctx) as r,
    ):
        assert r.status == 405


async def test_slow_body_times_out_with_408(server: Running) -> None:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.hook.port, ssl=server.client_ctx, server_hostname="127.0.0.1"
    )
    writer.write(
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readline(), timeout=5)
    assert head.startswith(b"HTTP/1.1 408"), head
    await close_streams([writer])


async def test_plain_http_is_not_served(server: Running) -> None:
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await session.post(f"http://127.0.0.1:{server.hook.port}/mutate", data=b"{}")


async def test_untrusted_client_fails_handshake(server: Running) -> None:
    other = self_signed(["localhost"])
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with aiohttp.ClientSession() as session:
            await session.get(server.url + "/healthz", ssl=client_context(other.ca))


async def _peer_fingerprint(s: Running, ctx: ssl.SSLContext) -> str:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", s.hook.port, ssl=ctx, server_hostname="127.0.0.1"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    await close_streams([writer])
    return hashlib.sha256(der).hexdigest()


async def test_certificate_reloaded_when_files_change(tmp_path: Path, config: Config) -> None:
    s = await start(tmp_path, config, reload_interval=0.05)
    try:
        before = await _peer_fingerprint(s, s.client_ctx)
        rotated = self_signed(["localhost", "127.0.0.1"])
        rotated.write(tmp_path / "tls")  # in place, like a Secret volume update
        new_ctx = client_context(rotated.ca)
        after = await wait_until_async(  # the old certificate fails the new CA's check
            lambda: _peer_fingerprint(s, new_ctx),
            what="the webhook to present the rotated certificate",
            interval=0.05,
            retry_on=(ssl.SSLError,),
        )
        assert after != before
        # a broken rotation (garbage key) keeps the working certificate
        (tmp_path / "tls" / "tls.key").write_text("garbage")
        assert not s.hook.tls.reload_if_changed()
        assert await _peer_fingerprint(s, new_ctx) == after
    finally:
        await s.hook.stop()


def test_missing_cert_files_named(tmp_path: Path) -> None:
    from vm_translate.tls import server_context

    with pytest.raises(
        TlsError, match=r"cannot load the TLS certificate: --tls-cert .*nope\.crt: no such file"
    ):
        server_context(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"))


async def test_node_check_over_tls(tmp_path: Path, config: Config) -> None:
    nodes = [NodeResources("n1", {"example.com/mlx": 2})]

    async def fetch() -> list[NodeResources]:
        return nodes

    s = await start(tmp_path, config, check_nodes=True, node_fetch=fetch)
    try:
        status, answer = await post(s, json.dumps(review(VMI)).encode())
        assert status == 200 and answer["response"]["allowed"] is False
        assert (
            "devices.kubevirt.io/10de_1eb8: 1 requested" in answer["response"]["status"]["message"]
        )
    finally:
        await s.hook.stop()


async def test_node_check_failure_allows_with_warning(tmp_path: Path, config: Config) -> None:
    async def fetch() -> list[NodeResources]:
        raise NodeCheckError("cannot list nodes: forbidden")

    s = await start(tmp_path, config, check_nodes=True, node_fetch=fetch)
    try:
        status, answer = await post(s, json.dumps(review(VMI)).encode())
        assert status == 200 and answer["response"]["allowed"] is True
        assert "device availability not checked" in answer["response"]["warnings"][0]
    finally:
        await s.hook.stop()


async def test_review_with_its_body_is_read_without_a_timer(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's body arrives with its headers (a few KiB): it is read at once, with no
    ``asyncio.timeout`` armed and cancelled per review (~10 µs each); a body still arriving
    keeps its read_timeout (test_slow_body_times_out_with_408)."""
    import sys

    import vm_translate.webhook as webhook

    armed: list[str] = []
    real = asyncio.timeout

    def counting(delay: float | None) -> asyncio.Timeout:
        armed.append(sys._getframe(1).f_globals["__name__"])
        return real(delay)

    monkeypatch.setattr(webhook.asyncio, "timeout", counting)
    for _ in range(5):
        assert (await post(server, json.dumps(review(VMI)).encode()))[0] == 200
    assert [m for m in armed if m == "vm_translate.webhook"] == []


async def test_start_up_objects_are_frozen_out_of_collections(server: Running) -> None:
    """What start-up made (modules, the settings, the server) is moved out of the garbage
    collector's generations (gc.freeze): a full collection no longer walks it per review."""
    import gc

    assert gc.get_freeze_count() > 0


async def test_routes_of_the_low_level_server(server: Running) -> None:
    """aiohttp's low-level server answers the three routes as the application's router did:
    other paths 404, other methods 405 naming the allowed ones, HEAD like GET."""
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/nope", ssl=server.client_ctx) as r:
            assert r.status == 404
        async with session.put(server.url + "/metrics", ssl=server.client_ctx) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
        async with session.head(server.url + "/healthz", ssl=server.client_ctx) as r:
            assert r.status == 200
