"""``pods/exec`` for the API-server stand-in: the WebSocket remote-command protocol, for real.

Named for what it is: a stand-in for kube-apiserver + kubelet + the container runtime's
exec, behaving as the real chain does on the wire (what ``kubernetes.stream`` and kubectl
speak), with the command run as a LOCAL process:

- ``GET /api/v1/namespaces/<ns>/pods/<pod>/exec?command=…&container=…&stdout=true&stderr=true``
  with ``Upgrade: websocket``; authorized as ``create`` on ``pods/exec`` (what Kubernetes
  >= 1.31 asks of a WebSocket exec); a missing pod is 404, a container the pod does not have
  is 400 (``container X is not valid for pod Y``), a pod not ``Running`` is 400, a request
  without the upgrade 400 (the real server would serve SPDY there; the stand-in does not);
- the handshake answers ``101 Switching Protocols`` with the first of the client's
  ``Sec-WebSocket-Protocol`` it speaks (``v5.channel.k8s.io``, then ``v4.channel.k8s.io``);
- frames are binary, the first byte the channel: 1 stdout, 2 stderr, 3 the error channel,
  which carries a ``Status`` (``Success``, or ``Failure`` with reason ``NonZeroExitCode`` and
  the exit code as ``details.causes[0].message``) before the close frame (RFC 6455 §5).

The command runs with the container's ``env`` from the pod spec (``VFIOCTL_ROOT``… as the
DaemonSet sets them) on top of the test process's environment; ``runner`` may replace that.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
EXEC_PATH = "/exec"

#: (pod object, container name, command) -> (exit code, stdout, stderr)
Runner = Callable[[Mapping[str, Any], str, Sequence[str]], tuple[int, bytes, bytes]]


def local_runner(
    pod: Mapping[str, Any], container: str, command: Sequence[str]
) -> tuple[int, bytes, bytes]:
    """Run ``command`` here, with the container's env from the pod spec (timeout 120 s)."""
    ctr = next(c for c in pod["spec"]["containers"] if c["name"] == container)
    env = dict(os.environ)
    for e in ctr.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    done = subprocess.run(list(command), env=env, capture_output=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


def _frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked server frame (RFC 6455 §5.2), FIN set."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    return head + payload


def _status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command "
        f"[...], exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def is_exec(path: str) -> bool:
    parts = urlsplit(path).path.split("/")
    return (
        len(parts) == 8
        and parts[1:4] == ["api", "v1", "namespaces"]
        and parts[5] == "pods"
        and parts[7] == "exec"
    )


def serve(handler: Any, api: Any, runner: Runner) -> None:
    """Answer one exec request on ``handler`` (the stand-in's request handler)."""
    from tests.dra.apiserver_standin import PODS, ApiError

    url = urlsplit(handler.path)
    _, _, _, _, ns, _, name, _ = url.path.split("/")
    query = parse_qs(url.query)
    try:
        if handler.headers.get("Authorization") != f"Bearer {api.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")
        api.authorize("", "pods/exec", "create", name)
        with api.lock:
            pod = api._get(PODS, ns, name)
        if (handler.headers.get("Upgrade") or "").lower() != "websocket":
            raise ApiError(400, "BadRequest", "the stand-in serves exec over WebSocket only")
        offered = [
            p.strip() for p in (handler.headers.get("Sec-WebSocket-Protocol") or "").split(",")
        ]
        chosen = next((p for p in PROTOCOLS if p in offered), None)
        if chosen is None:
            raise ApiError(400, "BadRequest", f"no supported channel protocol in {offered!r}")
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = (query.get("container") or [names[0]])[-1]
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if (pod.get("status") or {}).get("phase") != "Running":
            raise ApiError(400, "BadRequest", f"pod {name} is not running")
        command = query.get("command") or []
        if not command:
            raise ApiError(400, "BadRequest", "you must specify at least 1 command")
    except ApiError as e:
        handler._record("GET", e.code)
        handler._send(e.code, e.status())
        return
    handler._record("GET", 101)
    key = handler.headers.get("Sec-WebSocket-Key") or ""
    accept = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.send_header("Sec-WebSocket-Protocol", chosen)
    handler.end_headers()
    try:
        code, out, err = runner(pod, container, command)
    except (OSError, subprocess.SubprocessError) as e:  # the runtime could not run it
        code, out, err = 126, b"", f"{e}\n".encode()
    w = handler.wfile
    if out:
        w.write(_frame(0x2, b"\x01" + out))
    if err:
        w.write(_frame(0x2, b"\x02" + err))
    w.write(_frame(0x2, b"\x03" + json.dumps(_status(code)).encode()))
    w.write(_frame(0x8, struct.pack(">H", 1000)))
    w.flush()
    handler.close_connection = True
