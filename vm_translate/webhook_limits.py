"""The webhook's limits, and the memory they allow it at worst.

Each bound is a :class:`WebhookSettings` field and a ``vfioctl webhook`` flag (open
connections, TLS handshake, headers, idle keep-alive, request body size and time, bytes of
large bodies received at once) or a constant here (the parser's buffers, the header block).
:func:`worst_case_rss_bytes` adds them up from the measured per-connection cost
(:data:`vm_translate.listener.CONNECTION_RSS`); the Deployment's memory limit is checked
against it (``tests/deploy/test_webhook.py``). The server that applies them is
:mod:`vm_translate.webhook`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vm_translate.listener import CONNECTION_RSS, INCOMING_HIGH_WATER

MIB = 1024 * 1024
#: Bodies up to this size are received without drawing on ``body_budget_bytes`` (an
#: AdmissionReview of a VM is a few KiB), so small reviews are never refused for want of it.
SMALL_BODY = 32 * 1024
#: The HTTP parser's read buffer per connection (aiohttp's default is 64 KiB, paused at 2x).
READ_BUFSIZE = 16 * 1024
#: Request headers: how many, and the longest request line, header name or value (longer:
#: HTTP 400). What a client holds while its headers are incomplete is bounded by these.
MAX_HEADERS = 24
MAX_FIELD_SIZE = 1024
#: RSS of the started webhook with no connection (measured 49 MB with Python 3.11, rounded up).
BASELINE_RSS = 64 * MIB
#: ``--check-nodes``: RSS of the node-list child (vm_translate.kube_adapter.ChildNodeLister:
#: an interpreter with the Kubernetes client; 78 MB measured at 100 nodes x 64 DRA devices,
#: rounded up; it grows with the size of the lists it decodes)
NODE_CHECK_RSS = 112 * MIB


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    cert_file: str
    key_file: str
    host: str = "0.0.0.0"
    port: int = 8443
    max_body_bytes: int = MIB
    read_timeout: float = 10.0
    handshake_timeout: float = 5.0
    idle_timeout: float = 10.0
    max_connections: int = 384
    silent_grace: float = 0.25  # see vm_translate.listener
    body_budget_bytes: int = 16 * MIB
    reload_interval: float = 5.0
    check_nodes: bool = False
    node_cache_seconds: float = 30.0
    #: a review waits this long for the node list, then is answered unchecked (with a
    #: warning); well inside the API server's timeoutSeconds (5)
    node_wait: float = 2.0
    #: after SIGTERM keep answering this long with /healthz failing (a rolling update: the
    #: Service drops a terminating pod's endpoint a moment after the kubelet's SIGTERM, and
    #: reviews sent meanwhile must not be refused); SIGINT stops at once
    shutdown_delay: float = 0.0
    #: serving processes (:mod:`vm_translate.workers`): ``max_connections`` and
    #: ``body_budget_bytes`` are the replica's, each worker holding its share
    workers: int = 1

    def share(self, n: int) -> int:
        """A worker's share of the replica's bound ``n`` (rounded up)."""
        return -(-n // self.workers)


def worst_case_rss_bytes(settings: WebhookSettings) -> int:
    """An upper bound of the webhook's RSS under any mix of clients, from its limits: each open
    connection at most its measured cost (with a full header block), undecrypted input,
    parser buffer and a small body being received; plus every large body the budget admits, each parsed once (JSON objects
    take several times their text; one review is parsed at a time in each serving process);
    plus the node-list child with ``check_nodes``; with ``workers`` > 1, a baseline for each
    worker and one for the supervisor (counted whole: what the fork shares is not relied on)."""
    per_connection = CONNECTION_RSS + INCOMING_HIGH_WATER + 2 * READ_BUFSIZE + SMALL_BODY
    parsed = 10 * settings.max_body_bytes
    n = settings.workers
    return (
        BASELINE_RSS * (n + (n > 1))
        + (NODE_CHECK_RSS if settings.check_nodes else 0)
        + n * settings.share(settings.max_connections) * per_connection
        + n * settings.share(settings.body_budget_bytes)
        + n * parsed
    )
