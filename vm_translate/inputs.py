"""Reading the command line's inputs: the daemon config, YAML/JSON objects, entries.

The only file reading in ``vm_translate`` outside the webhook's certificates; errors are
:class:`~vm_translate.errors.InputError` (exit 2) naming the file, or
:class:`~vm_translate.errors.SpecError` (exit 1) for wrong passthrough entries.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from vfio_dp.host import files
from vfio_dp.model.config import MAX_CONFIG_BYTES, Config, load_config_bytes
from vm_translate.errors import InputError, SpecError
from vm_translate.spec import DeviceEntry, describe, entries_of, parse_passthrough


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


def entries_from_object(obj: Mapping[str, Any], config: Config) -> list[DeviceEntry]:
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
