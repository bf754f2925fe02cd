"""The DRA plugin's Kubernetes-API shell: everything that talks to the API server.

``publisher`` (keeps this node's ResourceSlices published; reads claims and DeviceClasses)
and ``claim_status`` (our entries of a claim's ``status.devices[]``, built purely and written
through the status subresource). The ``kubernetes`` package is imported here only.
"""

__all__ = ["claim_status", "publisher"]
