"""What the node's state means for the DRA pool and the claims: ``health`` (the pool by
group state, taints, the health list; design.md's table, decided purely), ``slice_feed``
(from each scan of the node core to the devices to publish, with its caches keyed by the
scan generation) and ``claim_status`` (which claims' device status to write, written in the
background off the kubelet's path)."""

__all__ = ["api_fields", "claim_status", "health", "slice_feed"]
