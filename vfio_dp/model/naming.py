"""The one place for naming rules: every name a front-end, the translator or the hostdev emitter
builds or accepts is checked here, once, with one limit.

- Default resource name: ``devices.kubevirt.io/<vendor>_<device>``, lowercase 4-hex IDs
  (``devices.kubevirt.io/10de_1eb8``) — the original KubeVirt VFIO plugin's lineage.
- Default mdev resource name (an ``mdev:`` entry without ``resourceName``): the type's
  ``name`` file as KubeVirt's ``mdevNameSelector`` compares it, spaces made ``_``
  (``GRID T4-1Q`` -> ``GRID_T4-1Q``), and every other character a resource name cannot hold
  (``/``, ``(``...) made ``_`` too, ends trimmed to alphanumerics, cut to 63, under the
  resource domain: ``devices.kubevirt.io/GRID_T4-1Q``; a type without a usable name gets its
  type id (``devices.kubevirt.io/nvidia-222``).
- KubeVirt's env var: ``PCI_RESOURCE_`` + the resource name upper-cased with ``/`` and ``.``
  replaced by ``_`` (``-`` is kept): ``nvidia.com/TU104GL_Tesla_T4`` →
  ``PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4``.
- The SR-IOV network device plugin's: ``PCIDEVICE_`` + the same transform.
- A resource name is ``<dns-subdomain>/<name>``, not in ``kubernetes.io``, ``<name>`` a
  Kubernetes qualified-name part (<= 63, alphanumerics plus ``-_.``, alphanumeric at both ends).
- A DRA driver name (``vfioctl dra-plugin --driver-name``, ``translate --dra --driver-name``;
  default :data:`DEFAULT_DRA_DRIVER`) is a lowercase DNS subdomain of at most 63 characters
  (the API server's limit for ResourceSlice ``spec.driver``) that is also a CDI vendor
  (starts with a letter): it is the vendor of the claims' CDI kind ``<driver>/vfio``.
- A claim UID (kubelet's ``Claim.uid``, a 36-character UUID) reaches file names and CDI
  device names: at most 128 of ``[A-Za-z0-9-_.]``, starting with a letter or digit.
- CDI names (cncf-tags/container-device-interface ``pkg/parser``): vendor and class of
  letters, digits, ``.``, ``-``, ``_``, starting with a letter, ending with a letter or digit;
  a device name of letters, digits, ``-``, ``_``, ``.``, ``:``, alphanumeric at both ends.

Each rule is a ``*_problem`` function (why a value is refused, or None) so every caller
raises its own exception with the same reason; :func:`check_dra_driver_name` raises the one
error for a bad driver name.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

from vfio_dp.errors import AddressError, DriverNameError
from vfio_dp.model.address import PciAddress

DEFAULT_DOMAIN = "devices.kubevirt.io"
#: The DRA driver name when none is given (``vfioctl dra-plugin``, ``translate --dra``): it
#: names the sockets, the ResourceSlices' ``spec.driver``, the DeviceClass and the attributes'
#: domain.
DEFAULT_DRA_DRIVER = "vfio.dra.vfio-dp.io"
KUBEVIRT_ENV_PREFIX = "PCI_RESOURCE_"
#: what KubeVirt's launcher reads for a resource of mediated devices (UUIDs, not addresses)
KUBEVIRT_MDEV_ENV_PREFIX = "MDEV_PCI_RESOURCE_"
DRA_DRIVER_NAME_MAX = 63  # kube-apiserver's validateDriverName (ResourceSlice spec.driver)
SRIOV_ENV_PREFIX = "PCIDEVICE_"
CLAIM_UID_MAX = 128  # Kubernetes UIDs are 36-character UUIDs
#: No CDI name of ours comes close; bounds what reaches a file name.
CDI_NAME_MAX = 253

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_CLAIM_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*")
_CDI_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_CDI_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
#: CDI name part -> (pattern, what it must be)
_CDI_RULES = {
    "vendor": (
        _CDI_VENDOR_OR_CLASS,
        "use letters, digits, '.', '-', '_', starting with a letter and ending with a letter "
        "or digit",
    ),
    "class": (
        _CDI_VENDOR_OR_CLASS,
        "use letters, digits, '.', '-', '_', starting with a letter and ending with a letter "
        "or digit",
    ),
    "device name": (
        _CDI_DEVICE,
        "use letters, digits, '-', '_', '.', ':', starting and ending with a letter or digit",
    ),
}


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended-resource name for a device plugin, or None."""
    domain, sep, short = name.partition("/")
    if not sep:
        return "must be domain-qualified, like example.com/name"
    if "/" in short:
        return "must contain exactly one '/'"
    if len(domain) > 253 or not _DNS_SUBDOMAIN.fullmatch(domain):
        return f"domain {domain!r} is not a lowercase DNS subdomain"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for Kubernetes itself"
    if len(short) > 63 or not _NAME.fullmatch(short):
        return (
            f"name part {short!r} must be 1-63 characters of [A-Za-z0-9-_.], "
            "starting and ending alphanumeric"
        )
    return None


def dns_subdomain_problem(name: str, limit: int = 253) -> str | None:
    """Why ``name`` is not a lowercase RFC 1123 DNS subdomain of at most ``limit`` characters,
    or None (a DRA driver name is more: :func:`dra_driver_name_problem`)."""
    if not name:
        return "it is empty"
    if len(name) > limit:
        return f"it is {len(name)} characters long, more than {limit}"
    if not _DNS_SUBDOMAIN.fullmatch(name):
        return "it is not a lowercase DNS subdomain"
    long = [label for label in name.split(".") if len(label) > 63]
    if long:
        return f"label {long[0][:70]!r} is longer than 63 characters"
    return None


@functools.lru_cache(maxsize=64)
def dra_driver_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be our DRA driver name, or None: a lowercase DNS subdomain of at
    most :data:`DRA_DRIVER_NAME_MAX` characters (ResourceSlice ``spec.driver``, the attribute
    domain) that is also a CDI vendor (the claims' CDI kind is ``<driver>/vfio``). The plugin,
    its CDI and metadata files and ``translate --dra`` all ask this one question (remembered:
    a Prepare of 1,000 claims asked it 8,000 times of the same name)."""
    why = dns_subdomain_problem(name, DRA_DRIVER_NAME_MAX)
    if why is None and (cdi := cdi_name_problem("vendor", name)) is not None:
        why = f"it cannot be a CDI vendor (the kind of the claims' CDI specs): {cdi}"
    return why


def check_dra_driver_name(name: str) -> str:
    """``name`` when :func:`dra_driver_name_problem` finds nothing, else
    :class:`~vfio_dp.errors.DriverNameError` naming it and the fix."""
    why = dra_driver_name_problem(name)
    if why is not None:
        raise DriverNameError(name, why)
    return name


def dra_checkpoint_file(driver: str) -> str:
    """``dra-<driver>.checkpoint.json``: the DRA plugin's checkpoint, a file of
    ``<root>/var/lib/vfio_dp/`` (:mod:`vfio_dp.dra.claimpath.checkpoint`); the driver name checked."""
    return f"dra-{check_dra_driver_name(driver)}.checkpoint.json"


def claim_uid_problem(uid: str) -> str | None:
    """Why kubelet's claim ``uid`` is unusable, or None; the reason completes a sentence whose
    subject the caller names (``uid is empty``). The UID reaches file names (the claim's CDI
    spec, its metadata directory) and CDI device names, so: at most :data:`CLAIM_UID_MAX` of
    ``[A-Za-z0-9-_.]``, starting with a letter or digit (never ``..``, never a ``/``)."""
    if not uid:
        return "is empty (not a Kubernetes UID)"
    if len(uid) > CLAIM_UID_MAX or not _CLAIM_UID.fullmatch(uid):
        return (
            f"is not a Kubernetes UID (at most {CLAIM_UID_MAX} of [A-Za-z0-9-_.], starting "
            "with a letter or digit; expected a UUID)"
        )
    return None


def cdi_name_problem(part: Literal["vendor", "class", "device name"], value: str) -> str | None:
    """Why ``value`` is not a valid CDI ``part`` (see the module doc), or None."""
    pattern, rule = _CDI_RULES[part]
    if len(value) > CDI_NAME_MAX or not pattern.fullmatch(value):
        return f"CDI {part} {value!r} is not valid: {rule}"
    return None


def is_dns_label(text: str) -> bool:
    """A Kubernetes DNS label (RFC 1123): <= 63 of ``[a-z0-9-]``, alphanumeric at both ends
    (namespaces, DRA request and device names)."""
    return len(text) <= 63 and _DNS_LABEL_RE.fullmatch(text) is not None


def request_name_problem(name: str) -> str | None:
    """Why ``name`` is not a DRA request name, or None: ``<request>`` or
    ``<request>/<subrequest>`` (a prioritized-list alternative), each part a DNS label --
    ``gpu``, ``gpu/big``; never ``../x``, ``gpu/../../x``, ``gpu/``, ``a/b/c``."""
    parts = name.split("/")
    detail = ""
    if len(parts) > 2:
        detail = "more than one '/'"
    else:
        for part, what in zip(parts, ("request", "subrequest"), strict=False):
            if not is_dns_label(part):
                detail = f"{what} part {part[:80]!r} is not a DNS label"
                break
    if not detail:
        return None
    return (
        f"request name {name[:80]!r} is not a DNS label, nor <request>/<subrequest> of two "
        f"({detail}; a DNS label is at most 63 of a-z, 0-9 and '-', alphanumeric at both ends)"
    )


def is_dns_subdomain(text: str) -> bool:
    """A Kubernetes DNS subdomain: <= 253, dot-separated DNS labels (object names such as a
    ResourceClaim's)."""
    return dns_subdomain_problem(text) is None


def dra_device_name(address: PciAddress) -> str:
    """The DRA device name of the group whose first endpoint is ``address``:
    ``pci-<domain>-<bus>-<slot>-<function>`` in lowercase hex (``pci-0000-3b-01-0``)."""
    return f"pci-{address.domain:04x}-{address.bus:02x}-{address.slot:02x}-{address.function:x}"


def dra_device_address(name: str) -> PciAddress | None:
    """The address a DRA device name stands for (inverse of :func:`dra_device_name`), or None
    when ``name`` is not one of ours."""
    parts = name.split("-")
    if len(parts) != 5 or parts[0] != "pci":
        return None
    text = f"{parts[1]}:{parts[2]}:{parts[3]}.{parts[4]}"
    try:
        addr = PciAddress.parse(text)
    except AddressError:
        return None
    return addr if dra_device_name(addr) == name else None


#: a group's container entry (its native personality) is its name with this suffix:
#: ``pci-0000-01-00-0-native`` (the VFIO entry is ``pci-0000-01-00-0``)
NATIVE_SUFFIX = "-native"


def dra_native_name(unit_name: str) -> str:
    """``pci-0000-01-00-0`` → ``pci-0000-01-00-0-native``: the group's container entry."""
    return unit_name + NATIVE_SUFFIX


def dra_entry(name: str) -> tuple[str, bool]:
    """A published DRA device name → (the group's name, is it the container entry)."""
    if name.endswith(NATIVE_SUFFIX):
        return name[: -len(NATIVE_SUFFIX)], True
    return name, False


def is_valid_id(text: str) -> bool:
    """True for a 4-hex-digit PCI vendor or device ID (either case)."""
    return bool(_HEX4.fullmatch(text))


def default_short_name(vendor: str, device: str) -> str:
    """``<vendor>_<device>`` in lowercase hex, e.g. ``10de_1eb8``."""
    return f"{vendor.lower()}_{device.lower()}"


def qualify(name: str, domain: str = DEFAULT_DOMAIN) -> str:
    """Put a bare name under ``domain``; a name that already has a domain is kept."""
    return name if "/" in name else f"{domain}/{name}"


def default_resource_name(vendor: str, device: str, domain: str = DEFAULT_DOMAIN) -> str:
    """``devices.kubevirt.io/10de_1eb8`` for vendor 10de device 1eb8."""
    return qualify(default_short_name(vendor, device), domain)


_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_.-]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def _mdev_short(text: str) -> str:
    return _EDGE.sub("", _EDGE.sub("", _NOT_NAME_CHAR.sub("_", text.strip()))[:63])


def default_mdev_short_name(type_name: str | None, type_id: str) -> str:
    """The name part of an mdev type's default resource name (module docstring):
    ``GRID T4-1Q`` -> ``GRID_T4-1Q``, ``A/B (2)`` -> ``A_B__2``; no usable name: the type id
    made the same way (``nvidia-222``)."""
    return _mdev_short(type_name or "") or _mdev_short(type_id) or "mdev"


def default_mdev_resource_name(
    type_name: str | None, type_id: str, domain: str = DEFAULT_DOMAIN
) -> str:
    """``devices.kubevirt.io/GRID_T4-1Q`` for the type named ``GRID T4-1Q``: what an ``mdev:``
    entry without ``resourceName`` is advertised as by the device plugin."""
    return qualify(default_mdev_short_name(type_name, type_id), domain)


_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9]+")
_PCI_NAME = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def mdev_label(text: str) -> str:
    """An mdev parent's or type's name as part of a DNS label (DRA device and DeviceClass
    names): lowercase, each run of other characters ``-`` (``0000:3b:00.0`` ->
    ``0000-3b-00-0``, a one-to-one change); when that lost something (``i915-GVTg_V5_4``)
    its first 12 characters and a hash of the original, so two names never meet."""
    low = _NOT_LABEL_CHARS.sub("-", text.lower()).strip("-") or "x"
    if low == text or _PCI_NAME.fullmatch(text):
        return low
    import hashlib

    return f"{low[:12].rstrip('-')}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def _env_suffix(resource_name: str) -> str:
    return resource_name.upper().replace("/", "_").replace(".", "_")


def kubevirt_env_var(resource_name: str) -> str:
    """``PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3`` for ``devices.kubevirt.io/8086_10d3``."""
    return KUBEVIRT_ENV_PREFIX + _env_suffix(resource_name)


def kubevirt_mdev_env_var(resource_name: str) -> str:
    """``MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q`` for ``nvidia.com/GRID_T4-1Q``: the mdev
    UUIDs a device plugin allocated, comma-separated (KubeVirt's contract)."""
    return KUBEVIRT_MDEV_ENV_PREFIX + _env_suffix(resource_name)


def sriov_env_var(resource_name: str) -> str:
    """``PCIDEVICE_INTEL_COM_X710`` for ``intel.com/x710`` (the SR-IOV device plugin's form)."""
    return SRIOV_ENV_PREFIX + _env_suffix(resource_name)


def socket_name(resource_name: str) -> str:
    """The plugin's socket file name in the kubelet dir, e.g. ``vfio_dp-devices.kubevirt.io_10de_1eb8.sock``.

    Only characters safe in a file name: ``/`` becomes ``_``.
    """
    return "vfio_dp-" + resource_name.replace("/", "_") + ".sock"
