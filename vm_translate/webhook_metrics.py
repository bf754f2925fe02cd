"""The webhook's Prometheus counters (``GET /metrics`` on its TLS port)::

    vfio_dp_webhook_reviews_total{result="allowed"|"patched"|"denied"}
    vfio_dp_webhook_refused_total{code="400"|"408"|"413"|"500"|"503"}

The registry and text format are the node processes' (:class:`vfio_dp.core.metrics.Metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vfio_dp.core.metrics import Metrics


class WebhookMetrics(Metrics):
    """The webhook's counters (the node processes' :class:`Metrics`, its own names)."""

    HELP: ClassVar[dict[str, tuple[str, str]]] = {
        "vfio_dp_webhook_reviews_total": (
            "counter",
            "AdmissionReviews answered, by result (allowed unchanged, patched, denied).",
        ),
        "vfio_dp_webhook_refused_total": (
            "counter",
            "Requests answered without a review, by HTTP status (400 not a review, 408 too "
            "slow, 413 too big, 500 internal, 503 busy).",
        ),
    }


def review_result(answer: Mapping[str, Any]) -> str:
    """allowed (unchanged), patched or denied: how a review was answered."""
    r = answer.get("response") or {}
    if not r.get("allowed"):
        return "denied"
    return "patched" if r.get("patch") else "allowed"
