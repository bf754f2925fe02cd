"""``vfioctl translate | hostdev``: the cluster/pod side (thin: parse, call, print); the
webhook command is :mod:`cli.webhook_cmd`.

Heavy libraries (aiohttp, lxml, libvirt, the Kubernetes client, cryptography) are imported
inside the command bodies only, so ``vfioctl list`` never pays for them.
"""

from __future__ import annotations

import sys

import click

from cli.common import option, run_guarded
from vfio_dp.model.naming import DEFAULT_DRA_DRIVER

CONFIG_HELP = (
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


@click.command("translate")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help=CONFIG_HELP)
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
    help=f"With --dra: the DRA driver (and DeviceClass) name. [default: {DEFAULT_DRA_DRIVER}]",
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
                    moved = to_dra(obj, config, driver_name or DEFAULT_DRA_DRIVER, classes)
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
@option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help=CONFIG_HELP)
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
    help="libvirt URI (qemu:///system): define (or with --live attach) instead of printing. "
    "Needs libvirt-python: pip install 'vfio-dp[libvirt]'.",
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

        from vm_translate import hostdev as emitter
        from vm_translate.allocation import Layout, Source
        from vm_translate.entries import Entry
        from vm_translate.errors import TranslateUsageError
        from vm_translate.inputs import (
            dra_addresses,
            entries_from_annotation,
            entries_from_object,
            load_config,
            load_objects,
            read_text,
        )

        if (spec_file is None) == (pod_annotation is None):
            raise TranslateUsageError("give SPEC_FILE or --pod-annotation (exactly one)")
        if (domain_name or live) and not connect:
            raise TranslateUsageError("--domain and --live need --connect URI")
        if live and not domain_name:
            raise TranslateUsageError("--live needs --domain NAME")
        config = load_config(config_path)
        entries: list[Entry]
        claims: dict[tuple[str, str], Source] = {}
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
