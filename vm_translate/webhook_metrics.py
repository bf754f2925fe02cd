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

    def __init__(self) -> None:
        super().__init__()
        #: prometheus_client's series (its types stay in vfio_dp.core.metrics: import-linter)
        self._children: dict[tuple[str, ...], Any] = {}

    def _metric(self, name: str, **labels: str) -> Any:
        """The series, looked up once (:meth:`Metrics.inc` resolves the labels at every call:
        ~3 µs, a review's updates cost ~1 µs this way)."""
        key = (name, *labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child(name, labels)
        return child

    def reviewed(self, result: str) -> None:
        """One review answered: ``result`` from :func:`review_result`."""
        self._metric("vfio_dp_webhook_reviews_total", result=result).inc()

    def refused(self, code: int) -> None:
        """One POST /mutate answered ``code`` without a review."""
        self._metric("vfio_dp_webhook_refused_total", code=str(code)).inc()

    def took(self, seconds: float) -> None:
        """The time one POST /mutate took."""
        self._metric("vfio_dp_webhook_review_seconds").observe(seconds)


def review_result(answer: Mapping[str, Any]) -> str:
    """allowed (unchanged), patched or denied: how a review was answered."""
    r = answer.get("response") or {}
    if not r.get("allowed"):
        return "denied"
    return "patched" if r.get("patch") else "allowed"
