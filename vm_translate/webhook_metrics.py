"""The webhook's Prometheus series (``GET /metrics`` on its TLS port)::

    vfio_dp_webhook_reviews_total{result="allowed"|"patched"|"denied"}
    vfio_dp_webhook_refused_total{code="400"|"408"|"413"|"500"|"503"}
    vfio_dp_webhook_review_seconds_bucket{le=...}    (and _sum, _count)

The registry and text format are the node processes' (:class:`vfio_dp.core.metrics.Metrics`:
``prometheus_client``, one registry per process, no ``_created`` series).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vfio_dp.core.metrics import COUNTER, HISTOGRAM, Metrics, Spec


class WebhookMetrics(Metrics):
    """The webhook's series (the node processes' :class:`Metrics`, its own names)."""

    HELP: ClassVar[dict[str, Spec]] = {
        "vfio_dp_webhook_reviews_total": (
            COUNTER,
            "AdmissionReviews answered, by result (allowed unchanged, patched, denied).",
            ("result",),
        ),
        "vfio_dp_webhook_refused_total": (
            COUNTER,
            "Requests answered without a review, by HTTP status (400 not a review, 408 too "
            "slow, 413 too big, 500 internal, 503 busy).",
            ("code",),
        ),
        "vfio_dp_webhook_review_seconds": (
            HISTOGRAM,
            "Time from a POST /mutate's headers to its answer (body read, node check, decision).",
            (),
        ),
    }


def review_result(answer: Mapping[str, Any]) -> str:
    """allowed (unchanged), patched or denied: how a review was answered."""
    r = answer.get("response") or {}
    if not r.get("allowed"):
        return "denied"
    return "patched" if r.get("patch") else "allowed"
