"""``vfioctl webhook-certs``: make or keep the webhook's TLS Secret and caBundle in the cluster.

The self-signed overlay runs it as a Job (:mod:`vm_translate.webhook_certs` says what it
writes). The Kubernetes client is imported only when it runs.
"""

from __future__ import annotations

import click

from cli.common import FiniteFloatRange, option, run_guarded


@click.command("webhook-certs")
@option(
    "--namespace", default="vfio-dp", show_default=True, help="Namespace of the Service and Secret."
)
@option("--service", default="vfio-dp-webhook", show_default=True, help="The webhook's Service.")
@option(
    "--secret", default="vfio-dp-webhook-tls", show_default=True, help="The TLS Secret to keep."
)
@option(
    "--webhook-config",
    default="vfio-dp-webhook",
    show_default=True,
    help="The MutatingWebhookConfiguration whose caBundle follows the Secret's CA.",
)
@option(
    "--days",
    default=365,
    show_default=True,
    type=click.IntRange(2, 3650),
    help="Validity of a new certificate.",
)
@option(
    "--renew-days",
    default=30,
    show_default=True,
    type=click.IntRange(1, 3649),
    help="Replace a certificate that expires within this many days.",
)
@option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=FiniteFloatRange(0.1, 600),
    help="Seconds each call to the API server may take, its whole answer included (one "
    "that trickles its answer is given up on).",
)
@option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help="kubeconfig; absent: $KUBECONFIG, ~/.kube/config, then the pod's service account.",
)
def webhook_certs(
    namespace: str,
    service: str,
    secret: str,
    webhook_config: str,
    days: int,
    renew_days: int,
    timeout: float,
    kubeconfig: str | None,
) -> None:
    """Create (or keep, while good) the webhook's TLS Secret and set the caBundle.

    Idempotent: a Secret that names the Service and is good for --renew-days more days is
    kept. Exits 1 when the API server refuses, answers too slowly (--timeout) or answers
    something else; 2 when it cannot be reached, or on bad options. Each failure is one line
    naming the call, the server and the cause.
    """

    def body() -> int:
        from vfio_dp.dra.apiserver.client import api_client
        from vfio_dp.errors import UsageError
        from vm_translate.webhook_certs import ensure

        if renew_days >= days:
            raise UsageError(f"--renew-days {renew_days} must be less than --days {days}")
        try:
            client = api_client(kubeconfig)
        except ValueError as e:
            raise UsageError(str(e)) from e
        out = ensure(
            client,
            namespace=namespace,
            secret=secret,
            service=service,
            webhook_config=webhook_config,
            days=days,
            renew_days=renew_days,
            deadline=timeout,
        )
        click.echo(
            f"Secret {namespace}/{secret}: {out.secret}; caBundle set on "
            f"{out.patched_webhooks} webhook(s) of {webhook_config}"
        )
        return 0

    run_guarded(body)
