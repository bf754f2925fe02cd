"""The DRA claim path: NodePrepareResources, NodeUnprepareResources and reconcile.

``prepare`` (the kubelet's Handler as a recipe: read, resolve, take ownership, write, record),
``reconcile`` (Unprepare's release, reconcile, re-verify after a reboot), and the pure or
file-owning helpers it runs over: ``claims`` (kubelet's claim types, the ResourceClaim as
read, its checks), ``resolve`` (results → IOMMU groups), ``steps`` (the device steps Prepare and the switch
ahead share: resolve, take over), ``native`` (a container claim: the group
on its native driver, its own device nodes), ``ahead`` (a claim's driver switch done ahead of
its pod, for the binding conditions), ``edits`` (a claim's CDI edits and
metadata), ``cdi`` (one CDI spec per claim), ``metadata`` (KEP-5304 files), ``extended``
(what a pod's extended-resource claim gets), ``checkpoint`` (the prepared claims, with the
boot ID: the one reader and writer of that file; its format and parser in
``checkpoint_format``), ``holds`` (which functions prepared
claims hold, read through ``checkpoint``) and ``outcome`` (the one mapper from what a
claim's work raised to the error kubelet gets). Importing any of it loads no gRPC
(import-linter contract).
"""

__all__ = [
    "ahead",
    "cdi",
    "checkpoint",
    "checkpoint_format",
    "claims",
    "commit",
    "edits",
    "extended",
    "holds",
    "mdev",
    "metadata",
    "native",
    "outcome",
    "prepare",
    "reconcile",
    "resolve",
    "steps",
]
