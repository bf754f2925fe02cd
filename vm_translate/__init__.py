"""vm_translate — the cluster and pod side of the VFIO passthrough toolkit.

- :mod:`vm_translate.spec` / :mod:`vm_translate.annotation` / :mod:`vm_translate.entries` /
  :mod:`vm_translate.translate` (pure): VM specs and annotated Pods → typed entries and resource names, JSONPatch and the
  mutated object.
- :mod:`vm_translate.review` (pure): AdmissionReview ``admission.k8s.io/v1`` in and out.
- :mod:`vm_translate.webhook`: the aiohttp HTTPS shell around it (its bounds and their memory
  cost: :mod:`vm_translate.webhook_limits`; :mod:`vm_translate.tls` for
  certificates, :mod:`vm_translate.nodes` / :mod:`vm_translate.kube_adapter` for the optional
  node-capacity check).
- :mod:`vm_translate.allocation` (pure): ``PCI_RESOURCE_*`` addresses → typed hostdevs;
  :mod:`vm_translate.hostdev` renders them as libvirt XML (the one place lxml is imported);
  :mod:`vm_translate.libvirt_adapter` defines/attaches them (the one place libvirt is imported).

Resource and env-var names come from :mod:`vfio_dp.model.naming` only. This ``__init__`` is
import-light on purpose: nothing heavy loads until a command needs it.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "alias",
    "allocation",
    "annotation",
    "balance",
    "cluster",
    "config_watch",
    "dra",
    "entries",
    "errors",
    "fleet",
    "hostdev",
    "http_log",
    "inputs",
    "kube_adapter",
    "libvirt_adapter",
    "listener",
    "nodes",
    "patch",
    "review",
    "spec",
    "tls",
    "to_dra",
    "translate",
    "webhook",
    "webhook_certs",
    "webhook_limits",
    "webhook_metrics",
    "workers",
]
