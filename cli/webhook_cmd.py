"""``vfioctl webhook``: the mutating admission webhook over HTTPS (thin: parse, call).

aiohttp, cryptography and the Kubernetes client are imported inside the command body only.
"""

from __future__ import annotations

import sys

import click

from cli.common import (
    FiniteFloatRange,
    configure_logging,
    log_format_option,
    log_level_option,
    option,
    run_guarded,
)
from cli.vm_cmds import CONFIG_HELP as _CONFIG_HELP


@click.command("webhook")
@option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help=_CONFIG_HELP)
@option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@option(
    "--port", default=8443, show_default=True, type=click.IntRange(0, 65535), help="HTTPS port."
)
@option(
    "--tls-cert",
    type=click.Path(dir_okay=False),
    default=None,
    help="PEM certificate chain (reloaded when it changes).",
)
@option(
    "--tls-key",
    type=click.Path(dir_okay=False),
    default=None,
    help="PEM private key of --tls-cert.",
)
@option(
    "--self-signed",
    is_flag=True,
    default=False,
    help="Development: make a throw-away CA and certificate, print the caBundle on stdout.",
)
@option(
    "--san",
    multiple=True,
    default=("localhost", "127.0.0.1"),
    show_default=True,
    help="Names for --self-signed (repeatable), e.g. vfio-dp-webhook.vfio-dp.svc.",
)
@option(
    "--cert-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where --self-signed writes tls.crt/tls.key/ca.crt (default: a new temp dir).",
)
@option(
    "--max-body-bytes",
    default=1024 * 1024,
    show_default=True,
    type=click.IntRange(1024),
    help="Larger requests get HTTP 413.",
)
@option(
    "--read-timeout",
    default=10.0,
    show_default=True,
    type=FiniteFloatRange(0.01),
    help="Seconds to receive a request body (else 408).",
)
@option(
    "--max-connections",
    default=384,
    show_default=True,
    type=click.IntRange(1),
    help="Open connections at most (25-100 KB each); at the cap a new one closes an idle one "
    "(bare TCP first, then the least recently active).",
)
@option(
    "--handshake-timeout",
    default=5.0,
    show_default=True,
    type=FiniteFloatRange(0.01),
    help="Seconds to complete the TLS handshake.",
)
@option(
    "--idle-timeout",
    default=10.0,
    show_default=True,
    type=FiniteFloatRange(0.01),
    help="Seconds a connection may wait for a request's headers (after the handshake or the "
    "previous response) before it is closed.",
)
@option(
    "--body-budget-bytes",
    default=16 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024),
    help="Bytes of large (> 32 KiB) request bodies received at once; more get HTTP 503.",
)
@option(
    "--reload-interval",
    "--cert-reload-interval",
    "reload_interval",
    default=5.0,
    show_default=True,
    type=FiniteFloatRange(0.01),
    help="Seconds between checks of the certificate files and --config.",
)
@option(
    "--check-nodes/--no-check-nodes",
    default=False,
    show_default=True,
    help="Deny VMs whose devices no schedulable node advertises (needs list on nodes).",
)
@option(
    "--node-cache-seconds",
    default=30.0,
    show_default=True,
    type=FiniteFloatRange(0),
    help="How long a node list is reused.",
)
@option(
    "--shutdown-delay",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 300),
    help="After SIGTERM, keep answering this many seconds with /healthz failing, so a rolling "
    "update's endpoint change refuses no review (the Deployment sets 5).",
)
@option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Serving processes sharing the port (one core each at most); the node list is "
    "fetched once for all (vm_translate.workers).",
)
@log_level_option
@log_format_option
def webhook(
    config_path: str | None,
    address: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    self_signed: bool,
    san: tuple[str, ...],
    cert_dir: str | None,
    max_body_bytes: int,
    read_timeout: float,
    max_connections: int,
    handshake_timeout: float,
    idle_timeout: float,
    body_budget_bytes: int,
    reload_interval: float,
    check_nodes: bool,
    node_cache_seconds: float,
    shutdown_delay: float,
    workers: int,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the mutating admission webhook: POST /mutate (AdmissionReview v1), GET /healthz.

    --config is read again when its file changes (a ConfigMap update); a bad new config is
    logged and the previous one kept.
    """
    configure_logging(log_level, log_format)

    def body() -> int:
        from pathlib import Path
        from tempfile import mkdtemp

        from vm_translate.config_watch import ConfigWatch
        from vm_translate.errors import TranslateUsageError
        from vm_translate.webhook import run
        from vm_translate.webhook_limits import WebhookSettings

        config = ConfigWatch(config_path)  # a bad config at start: exit 2
        if self_signed == bool(tls_cert or tls_key):
            raise TranslateUsageError(
                "give --tls-cert and --tls-key, or --self-signed (exactly one)"
            )
        if not self_signed and not (tls_cert and tls_key):
            raise TranslateUsageError("--tls-cert and --tls-key go together")
        if self_signed:
            from vm_translate.tls import self_signed as make_bundle

            bundle = make_bundle(list(san))
            tls_cert_path, tls_key_path = bundle.write(
                Path(cert_dir or mkdtemp(prefix="vfioctl-webhook-"))
            )
            click.echo(
                f"# CA: {tls_cert_path.parent / 'ca.crt'}; MutatingWebhookConfiguration clientConfig.caBundle:"
            )
            click.echo(bundle.ca_bundle)
            sys.stdout.flush()
            cert, key = str(tls_cert_path), str(tls_key_path)
        else:
            assert tls_cert and tls_key
            cert, key = tls_cert, tls_key
        settings = WebhookSettings(
            cert_file=cert,
            key_file=key,
            host=address,
            port=port,
            max_body_bytes=max_body_bytes,
            read_timeout=read_timeout,
            handshake_timeout=handshake_timeout,
            idle_timeout=idle_timeout,
            max_connections=max_connections,
            body_budget_bytes=body_budget_bytes,
            reload_interval=reload_interval,
            check_nodes=check_nodes,
            node_cache_seconds=node_cache_seconds,
            shutdown_delay=shutdown_delay,
            workers=workers,
        )
        def ready(p: int) -> None:
            click.echo(f"serving https://{address}:{p}/mutate", err=True)

        if workers > 1:
            from vm_translate.workers import run_workers

            return run_workers(config, settings, ready)
        run(config, settings, ready=ready)
        return 0

    run_guarded(body)
