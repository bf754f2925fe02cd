"""Reading the command line's inputs: the daemon config, YAML/JSON objects, entries.

The only file reading in ``vm_translate`` outside the webhook's certificates; errors are
:class:`~vm_translate.errors.InputError` (exit 2) naming the file, or
:class:`~vm_translate.errors.SpecError` (exit 1) for wrong passthrough entries.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from vfio_dp.host import files
from vfio_dp.model.config import MAX_CONFIG_BYTES, Config, load_config_bytes
from vm_translate.allocation import Source
from vm_translate.annotation import parse_passthrough
from vm_translate.entries import ClaimEntry, DeviceEntry, Entry
from vm_translate.errors import HostdevError, InputError, SpecError
from vm_translate.spec import (
    claims_path,
    describe,
    devices_path,
    dig,
    entries_of,
    vm_claims,
)


def read_text(path: str) -> str:
    """A file's text; ``-`` is stdin."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 text: {e}") from e


def load_config(path: str | None) -> Config:
    """The daemon's configuration: the same reader as the daemon's (:mod:`vfio_dp.host.files`,
    bounded, errors naming the file); ``-`` is stdin; none → the daemon's default."""
    if path == "-":
        return load_config_bytes(sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1), "<stdin>")
    return files.load_config(path)


def parse_pci_classes(values: Sequence[str]) -> dict[tuple[str, str], str]:
    """``--pci-class 8086:10d3=020000`` values → {(vendor, device): class}, lowercase."""
    import re

    form = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})=(?:0x)?([0-9a-fA-F]{6})")
    out: dict[tuple[str, str], str] = {}
    for value in values:
        m = form.fullmatch(value)
        if not m:
            raise InputError(
                "--pci-class",
                f"{value!r} is not VENDOR:DEVICE=CLASS with 4, 4 and 6 hex digits, "
                "e.g. 8086:10d3=020000 (the class `vfioctl list` or `lspci -n` shows)",
            )
        out[(m.group(1).lower(), m.group(2).lower())] = m.group(3).lower()
    return out


def load_objects(text: str, source: str) -> list[dict[str, Any]]:
    """Every document of a YAML (or JSON) stream; each must be a mapping (a Kubernetes object)."""
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise InputError(source, f"not valid YAML/JSON: {e}") from e
    if not docs:
        raise InputError(
            source, "holds no object; give a VirtualMachineInstance, VirtualMachine or Pod"
        )
    for i, d in enumerate(docs):
        if not isinstance(d, dict):
            raise InputError(
                source, f"document {i} is a {type(d).__name__}, not a Kubernetes object"
            )
    return docs


def entries_from_object(obj: Mapping[str, Any], config: Config) -> list[Entry]:
    subject = describe(obj)
    entries, problems = entries_of(obj, config, subject)
    if problems:
        raise SpecError(subject, problems)
    return entries


def entries_from_annotation(value: str, config: Config) -> list[DeviceEntry]:
    where = "--pod-annotation (devices.kubevirt.io/passthrough)"
    entries, problems = parse_passthrough(value, config, where)
    if problems:
        raise SpecError("pod annotation", problems)
    return entries


def dra_addresses(
    obj: Mapping[str, Any], entries: Sequence[Entry], base: str
) -> dict[tuple[str, str], Source]:
    """The address of every DRA entry of ``obj``, read from its device-metadata file under
    ``base`` (the pod's ``/var/run/kubernetes.io/dra-device-attributes``), keyed by
    (claim name, request name); see :mod:`vm_translate.dra`. Reads only regular files named
    ``*-metadata.json`` (at most ``MAX_BYTES`` each) in the directory the launcher would."""
    from vfio_dp.model import dra_metadata
    from vm_translate import dra

    wanted = [e for e in entries if isinstance(e, ClaimEntry)]
    if not wanted:
        return {}
    path = devices_path(obj)
    raw = dig(obj, claims_path(path)) if path is not None else None
    claims, _ = vm_claims(raw, "spec.resourceClaims")
    out: dict[tuple[str, str], Source] = {}
    for entry in wanted:
        directory = dra.metadata_dir(entry, claims, base)
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            names = []
        except OSError as e:
            raise HostdevError(f"{dra.claim_label(entry)}: cannot list {directory}: {e}") from e
        files: list[tuple[str, str | bytes]] = []
        for name in names:
            if not name.endswith(dra_metadata.FILE_SUFFIX):
                continue
            file = os.path.join(directory, name)
            files.append((file, _read_small(file, dra_metadata.MAX_BYTES, entry)))
        out[(entry.claim_name, entry.request_name)] = dra.address_from(entry, files, directory)
    return out


def _read_small(path: str, limit: int, entry: ClaimEntry) -> bytes:
    """At most ``limit`` + 1 bytes of a regular file (never blocks on a FIFO or device)."""
    from vm_translate import dra

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise HostdevError(f"{dra.claim_label(entry)}: cannot read {path}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostdevError(f"{dra.claim_label(entry)}: {path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)
