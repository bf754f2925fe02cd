"""``vfioctl webhook | translate | hostdev``: the cluster/pod side (thin: parse, call, print).

Heavy libraries (aiohttp, lxml, libvirt, the Kubernetes client, cryptography) are imported
inside the command bodies only, so ``vfioctl list`` never pays for them.
"""

from __future__ import annotations

import sys

import click

from cli.common import option, run_guarded

_CONFIG_HELP = (
    "The daemon's YAML config (the same ConfigMap file), used to turn vendor:device into "
    "resource names. Default: the daemon's default (devices.kubevirt.io/<vendor>_<device>)."
)


def _int_auto(value: str | int) -> int:
    """``0x10`` or ``16``."""
    if isinstance(value, int):
        return value
    try:
        return int(value, 0)
    except ValueError as e:
        raise click.BadParameter(f"{value!r} is not a number (hex like 0x10 or decimal)") from e


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
    type=click.FloatRange(0.01),
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
    type=click.FloatRange(0.01),
    help="Seconds to complete the TLS handshake.",
)
@option(
    "--idle-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.01),
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
    type=click.FloatRange(0.01),
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
    type=click.FloatRange(0),
    help="How long a node list is reused.",
)
@option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
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
    log_level: str,
) -> None:
    """Serve the mutating admission webhook: POST /mutate (AdmissionReview v1), GET /healthz.

    --config is read again when its file changes (a ConfigMap update); a bad new config is
    logged and the previous one kept.
    """
    import logging

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def body() -> int:
        from pathlib import Path
        from tempfile import mkdtemp

        from vm_translate.config_watch import ConfigWatch
        from vm_translate.errors import TranslateUsageError
        from vm_translate.webhook import WebhookSettings, run

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
        )
        run(
            config,
            settings,
            ready=lambda p: click.echo(f"serving https://{address}:{p}/mutate", err=True),
        )
        return 0

    run_guarded(body)


@click.command("translate")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help=_CONFIG_HELP)
@option(
    "--patch",
    is_flag=True,
    default=False,
    help="Print the JSONPatch (JSON) instead of the mutated object.",
)
@option(
    "--dra",
    is_flag=True,
    default=False,
    help="Print the DRA form: claim-based entries + the ResourceClaimTemplates they need.",
)
@option(
    "--driver-name",
    default=None,
    help="With --dra: the DRA driver (and DeviceClass) name. [default: vfio.dra.vfio-dp.io]",
)
@option(
    "--pci-class",
    "pci_classes",
    multiple=True,
    metavar="VENDOR:DEVICE=CLASS",
    help="With --dra: the PCI class of a device (6 hex digits, as `vfioctl list` shows it), "
    "when the config's selectors choose the path by class. Repeatable.",
)
def translate(
    file: str,
    config_path: str | None,
    patch: bool,
    dra: bool,
    driver_name: str | None,
    pci_classes: tuple[str, ...],
) -> None:
    """Translate a VMI / VM / annotated Pod offline, as the webhook would (FILE or - for stdin).

    Prints the mutated object(s) as YAML, or with --patch one JSON patch per document. With
    --dra a VMI/VM is printed in its DRA form (ResourceClaimTemplate first), ready for
    `kubectl apply -f -`: exactly the entries whose devices the --config sends to DRA
    (`path: dra`) become claim requests, the others stay deviceName entries; stderr says for
    each entry which path serves it and why. Wrong entries are listed on stderr and the exit
    code is 1.
    """

    def body() -> int:
        import json

        import yaml

        from vfio_dp.model import naming
        from vm_translate.errors import SpecError, TranslateUsageError
        from vm_translate.inputs import load_config, load_objects, parse_pci_classes, read_text
        from vm_translate.to_dra import to_dra
        from vm_translate.translate import translate as translate_object

        if patch and dra:
            raise TranslateUsageError("--patch and --dra do not go together; give one")
        if driver_name is not None and not dra:
            raise TranslateUsageError("--driver-name goes with --dra")
        if pci_classes and not dra:
            raise TranslateUsageError("--pci-class goes with --dra")
        classes = parse_pci_classes(pci_classes)
        config = load_config(config_path)
        objects = load_objects(read_text(file), file)
        failed = False
        out: list[str] = []
        for obj in objects:
            try:
                if dra:
                    moved = to_dra(obj, config, driver_name or naming.DEFAULT_DRA_DRIVER, classes)
                    for verdict in moved.verdicts:
                        click.echo(f"{moved.subject}: {verdict.describe()}", err=True)
                    out.extend(yaml.safe_dump(dict(o), sort_keys=False) for o in moved.objects)
                    continue
                t = translate_object(obj, config)
            except SpecError as e:
                click.echo(f"vfioctl: {e}", err=True)
                failed = True
                continue
            if patch:
                out.append(json.dumps(list(t.patch)))
            else:
                out.append(yaml.safe_dump(dict(t.obj), sort_keys=False))
        if failed:
            return 1
        sys.stdout.write(("\n" if patch else "---\n").join(out) + ("\n" if patch else ""))
        return 0

    run_guarded(body)


@click.command("hostdev")
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
@option(
    "--pod-annotation",
    default=None,
    help="The pod's devices.kubevirt.io/passthrough value (e.g. via the downward API) instead of SPEC_FILE.",
)
@option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help=_CONFIG_HELP)
@option(
    "--domain-xml",
    type=click.Path(dir_okay=False),
    default=None,
    help="Merge into this libvirt domain XML (same alias is replaced).",
)
@option(
    "--multifunction",
    is_flag=True,
    default=False,
    help="Put functions of one physical device on one guest slot.",
)
@option(
    "--guest-bus",
    default="0x00",
    show_default=True,
    callback=lambda _c, _p, v: _int_auto(v),
    help="Guest PCI bus for --multifunction.",
)
@option(
    "--guest-slot",
    default="0x10",
    show_default=True,
    callback=lambda _c, _p, v: _int_auto(v),
    help="First guest slot tried for --multifunction.",
)
@option(
    "--connect",
    default=None,
    help="libvirt URI (qemu:///system): define (or with --live attach) instead of printing.",
)
@option(
    "--domain",
    "domain_name",
    default=None,
    help="With --connect: the domain to update (instead of --domain-xml).",
)
@option(
    "--live",
    is_flag=True,
    default=False,
    help="With --connect --domain: hot-plug into the running domain.",
)
@option(
    "--dra-metadata-dir",
    default="/var/run/kubernetes.io/dra-device-attributes",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the pod sees the DRA device-metadata files (claim-based entries).",
)
def hostdev(
    spec_file: str | None,
    pod_annotation: str | None,
    config_path: str | None,
    domain_xml: str | None,
    multifunction: bool,
    guest_bus: int,
    guest_slot: int,
    connect: str | None,
    domain_name: str | None,
    live: bool,
    dra_metadata_dir: str,
) -> None:
    """Allocated PCI_RESOURCE_* addresses and DRA claims → libvirt <hostdev> XML (printed,
    merged or defined).

    Entries come from SPEC_FILE (VMI, VM or annotated Pod) or --pod-annotation; the i-th entry
    of a resource gets the i-th address of its env var; a claimName/requestName entry gets the
    address in its claim's device-metadata file, as virt-launcher reads it.
    """

    def body() -> int:
        import os

        from vfio_dp.model.address import PciAddress
        from vm_translate import hostdev as emitter
        from vm_translate.allocation import Layout
        from vm_translate.errors import TranslateUsageError
        from vm_translate.inputs import (
            dra_addresses,
            entries_from_annotation,
            entries_from_object,
            load_config,
            load_objects,
            read_text,
        )
        from vm_translate.spec import Entry

        if (spec_file is None) == (pod_annotation is None):
            raise TranslateUsageError("give SPEC_FILE or --pod-annotation (exactly one)")
        if (domain_name or live) and not connect:
            raise TranslateUsageError("--domain and --live need --connect URI")
        if live and not domain_name:
            raise TranslateUsageError("--live needs --domain NAME")
        config = load_config(config_path)
        entries: list[Entry]
        claims: dict[tuple[str, str], PciAddress] = {}
        if spec_file is not None:
            objects = load_objects(read_text(spec_file), spec_file)
            if len(objects) != 1:
                raise TranslateUsageError(f"{spec_file}: holds {len(objects)} objects; give one VM")
            entries = entries_from_object(objects[0], config)
            claims = dra_addresses(objects[0], entries, dra_metadata_dir)
        else:
            assert pod_annotation is not None
            entries = list(entries_from_annotation(pod_annotation, config))
        layout = Layout(bus=guest_bus, first_slot=guest_slot) if multifunction else None
        xml_in = read_text(domain_xml) if domain_xml else None
        if connect is None:
            _, text = emitter.build(
                entries,
                os.environ,
                claims=claims,
                domain_xml=xml_in,
                layout=layout,
                source=domain_xml or "",
            )
            sys.stdout.write(text)
            return 0
        from vm_translate import libvirt_adapter

        outcome = libvirt_adapter.define_or_attach(
            connect,
            lambda xml: emitter.build(
                entries, os.environ, claims=claims, domain_xml=xml, layout=layout
            )[0],
            domain_xml=xml_in,
            domain_name=domain_name,
            live=live,
        )
        click.echo(
            f"{outcome.action} {outcome.domain}: {', '.join(outcome.aliases) or 'nothing new'}"
        )
        return 0

    run_guarded(body)
