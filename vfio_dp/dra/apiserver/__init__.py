"""The DRA plugin's Kubernetes-API shell: everything that talks to the API server.

``client`` (the client config; every call's overall deadline; the lanes that keep claim
reads, class reads, status writes and slice writes apart), ``plain`` (one request with a plain
JSON body, no typed model), ``publisher`` (keeps this node's ResourceSlices published; its
writes, a pool's slices several at once: ``slice_writes``), ``watch`` (this node's slices as
the server holds them, by a
watch that relists on 410 Gone), ``claim_watch`` (the claims allocated from this node's pool,
by the same loop), ``readers`` (the claim path's ResourceClaim and DeviceClass
reads) and ``claim_status`` (our entries of a claim's ``status.devices[]``, built purely and
written through the status subresource). The ``kubernetes`` package is imported here only.
"""

__all__ = [
    "claim_status",
    "claim_watch",
    "client",
    "plain",
    "publisher",
    "readers",
    "slice_writes",
    "watch",
]
