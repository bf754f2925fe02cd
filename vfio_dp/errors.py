"""The one exception tree of ``vfio_dp``.

Every error carries the data it is about and a message that says the fix, e.g.::

    0000:3b:00.1 (10de:10f8, snd_hda_intel) shares IOMMU group 45 with 0000:3b:00.0;
    bind it too: vfioctl bind --group 0000:3b:00.0

``UsageError`` subclasses are mistakes in what the user typed (exit code 2 in the CLI);
everything else is a failure of the operation (exit code 1).
"""

from __future__ import annotations


class VfioError(Exception):
    """Base of every error raised by vfio_dp."""


class UsageError(VfioError):
    """The input itself is wrong (bad address, bad option value). CLI exit code 2."""


class AddressError(UsageError, ValueError):
    """A string is not a PCI address in ``DDDD:BB:SS.F`` / ``BB:SS.F`` form."""

    def __init__(self, value: str, why: str) -> None:
        self.value = value
        self.why = why
        super().__init__(
            f"{value!r} is not a PCI address ({why}); "
            "expected DDDD:BB:SS.F in hex, e.g. 0000:65:00.0 (slot <= 1f, function 0-7)"
        )


#: What an error message shows of a value from outside (a config value, a device ID):
#: enough to recognise it, never the whole of a hostile megabyte.
SHOWN_CHARS = 80

#: At most this many problems of one config file are listed (the count of the rest follows).
LISTED_PROBLEMS = 20


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` itself, or its first ``limit`` characters and ``...[N chars]``."""
    return text if len(text) <= limit else f"{text[:limit]}...[{len(text)} chars]"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, bounded in time and length: nested containers are cut
    by :mod:`reprlib` (so a shared, alias-built structure is never expanded) and the text to
    ``limit`` characters with ``...[N chars]`` saying how long the original string was."""
    if isinstance(value, str):
        text = repr(value[:limit])
        return text if len(value) <= limit else f"{text}...[{len(value)} chars]"
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 4, 4, 4
    r.maxstring, r.maxother, r.maxlong = limit, limit, limit
    text = r.repr(value)
    return text if len(text) <= limit + 20 else text[: limit + 20] + "..."


class RootNotFoundError(UsageError):
    """``--root`` names no directory: every command would see an empty host and say nothing."""

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(
            f"--root {clip(root, 400)!r} is not a directory; give the host's root "
            "(/ on a node, the host mount such as /host in a pod)"
        )


class ConfigError(UsageError):
    """A configuration file is invalid; ``problems`` lists every (key, value, why).

    The message lists at most :data:`LISTED_PROBLEMS` of them, each value cut by
    :func:`shown`, so a hostile file cannot make the error itself huge."""

    def __init__(self, source: str, problems: list[tuple[str, object, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [
            f"  {clip(key, 120)}: {clip(why, 400)}"
            if value is None and key == "(file)"
            else f"  {clip(key, 120)}: {shown(value)}: {clip(why, 400)}"
            for key, value, why in problems[:LISTED_PROBLEMS]
        ]
        if len(problems) > LISTED_PROBLEMS:
            lines.append(f"  ... and {len(problems) - LISTED_PROBLEMS} more problems")
        super().__init__(f"invalid configuration {clip(source, 400)}:\n" + "\n".join(lines))


class PathConflictError(UsageError):
    """One resource name would be served by both paths on one node (the device plugin and the
    DRA plugin through its DeviceClass's extendedResourceName): ``conflicts`` lists each."""

    def __init__(self, process: str, node: str | None, conflicts: list[str]) -> None:
        self.process = process
        self.conflicts = conflicts
        where = f"node {node}" if node else "this node"
        lines = "\n".join(f"  {clip(c, 600)}" for c in conflicts[:LISTED_PROBLEMS])
        if len(conflicts) > LISTED_PROBLEMS:
            lines += f"\n  ... and {len(conflicts) - LISTED_PROBLEMS} more"
        super().__init__(
            f"{process} refuses to start: on {where} a resource name would be served by both "
            f"the device plugin and DRA:\n{lines}\none resource name goes through one path "
            "on a node: give one of the selectors another resourceName or the same path, or "
            "limit it to other nodes (nodes:)"
        )


class SocketPathError(VfioError):
    """Where a socket of ours must go, something else is (or the directory is unusable)."""

    def __init__(self, path: str, what: str, fix: str) -> None:
        self.path = path
        super().__init__(
            f"cannot serve a socket at {path}: it {what}" + (f"; {fix}" if fix else "")
        )


class PortError(UsageError):
    """A port we were told to listen on cannot be had (busy, or not ours to bind)."""


class InstanceRunningError(VfioError):
    """Another process of ours runs on this node (it holds its lock under run/vfio_dp)."""


class HostError(VfioError):
    """Reading or writing the host's sysfs/devfs failed."""


class InstanceLockError(HostError):
    """A process lock file under ``run/vfio_dp/instances`` cannot be used: something that is
    not a regular file stands at its path (a link, a FIFO, a directory, a socket), or a
    directory on the way is not one."""

    def __init__(self, path: str, why: str, fix: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"cannot take a process lock of ours at {path}: {why}; {fix}")


class SysfsValueError(HostError):
    """A sysfs file holds what the kernel never writes there (binary, not hex, a FIFO): the
    device it describes is skipped rather than trusted (its IDs would become resource names)."""

    def __init__(self, path: str, value: object, why: str) -> None:
        self.path = path
        self.value = value
        self.why = why
        super().__init__(
            f"{path} reads {shown(value)}: {why}; the device is skipped "
            "(a kernel writes no such value: check what created this file)"
        )


class PathEscapeError(HostError):
    """A path or symlink would leave the configured root."""

    def __init__(self, path: str, root: str, via: str | None = None) -> None:
        self.path = path
        self.root = root
        self.via = via
        msg = f"refusing {path!r}: it resolves outside the root {root!r}"
        if via:
            msg += f" (through the symlink {via}); fix or remove that link"
        super().__init__(msg)


class DeviceNotFoundError(HostError):
    """No such PCI device under the root."""

    def __init__(self, address: str, root: str) -> None:
        self.address = address
        super().__init__(
            f"no PCI device {address} under {root}sys/bus/pci/devices; "
            "check the address with: vfioctl list"
        )


#: The one statement of why a host has no IOMMU groups and what to do about it.
IOMMU_OFF = (
    "the IOMMU is off or absent; enable VT-d/AMD-Vi in the firmware and boot with "
    "intel_iommu=on (or amd_iommu=on)"
)


def no_iommu_group(subject: str) -> str:
    """``<subject> has no IOMMU group: <why and the fix>`` -- every per-device form."""
    return f"{subject} has no IOMMU group: {IOMMU_OFF}"


class NoIommuError(HostError):
    """The host has no IOMMU groups at all (raised by :meth:`vfio_dp.host.Host.groups`)."""

    def __init__(self, root: str) -> None:
        self.root = root
        super().__init__(f"no IOMMU groups under {root}sys/kernel/iommu_groups: {IOMMU_OFF}")


class BindError(HostError):
    """A bind or unbind could not be done (or was refused); nothing was left half-done."""


class RefusedError(BindError):
    """The operation was refused before touching anything (host in use, half group, ...)."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("\n".join(reasons))


class LockTimeoutError(BindError):
    """Another vfioctl or the daemon holds the device's lock."""


class WriteTimeoutError(BindError):
    """A sysfs write (typically ``driver/unbind``) did not return in time."""


class StateWriteError(BindError):
    """A durable record (original driver, operation journal, lock) could not be written:
    the state directory is full, read-only or missing. Raised before the first sysfs write
    of an operation, so nothing was changed."""


class CorruptRecordError(HostError):
    """A durable record exists but cannot be read; it is reported and kept, never dropped."""

    def __init__(self, path: str, why: str, fix: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"unreadable record {path}: {why}; it is kept as it is; {fix}")


class DevicePluginError(VfioError):
    """A device-plugin request cannot be served (unknown device, unhealthy, renumbered group)."""


class PluginRequestError(DevicePluginError):
    """The request itself is malformed (no device IDs at all): gRPC ``INVALID_ARGUMENT``."""


class UnknownDeviceError(DevicePluginError):
    """The kubelet named a device ID this resource does not list (never advertised or gone).
    The message shows at most :data:`SHOWN_CHARS` of the ID (a 1 MB ID is not echoed)."""

    def __init__(self, resource: str, device_id: str, why: str) -> None:
        self.resource = resource
        self.device_id = device_id
        super().__init__(f"{resource}: unknown device {shown(device_id)}: {why}")


class UnhealthyDeviceError(DevicePluginError):
    """The device is listed but cannot be handed to a pod now; ``reasons`` say why."""

    def __init__(self, resource: str, device_id: str, reasons: list[str]) -> None:
        self.resource = resource
        self.device_id = device_id
        self.reasons = reasons
        super().__init__(
            f"{resource}: device {clip(device_id)} is unhealthy: " + "; ".join(reasons)
        )


class StaleAllocationError(DevicePluginError):
    """PreStartContainer found that an earlier Allocate's answer no longer holds (a group was
    renumbered across a reboot, or no record of the Allocate exists): the container must not
    start with a ``/dev/vfio/<N>`` that may now be another device's group."""

    def __init__(self, resource: str, device_id: str, why: str) -> None:
        self.resource = resource
        self.device_id = device_id
        super().__init__(
            f"{resource}: device {clip(device_id)}: {why}; the container would get the wrong device "
            "group: delete the pod so that the kubelet allocates again"
        )


class DraError(VfioError):
    """The DRA front-end cannot serve a claim (prepare, unprepare, its files)."""


class DriverNameError(UsageError, DraError, ValueError):
    """A DRA driver name we cannot use (:func:`vfio_dp.model.naming.dra_driver_name_problem`):
    it names the sockets, the slices and the claims' CDI kind. A usage error (exit 2)."""

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.why = why
        super().__init__(
            f"DRA driver name {name!r}: {why}; use a lowercase DNS subdomain you own, "
            "e.g. vfio.example.com (labels of a-z, 0-9 and '-', starting with a letter; at "
            "most 63 characters in all, the API server's limit for ResourceSlice spec.driver)"
        )


class ApiCallError(DraError):
    """A call to the Kubernetes API server failed; the message names the call and why.

    ``status`` is the HTTP status the server answered (``ApiException.status``), None when it
    did not answer; ``expired`` is True when the call's overall deadline passed (a server that
    never answers, or trickles its answer, is cut off there, whatever it still sends)."""

    def __init__(self, message: str, status: int | None = None, expired: bool = False) -> None:
        self.status = status
        self.expired = expired
        super().__init__(message)


class MetadataFormatError(DraError, ValueError):
    """A KEP-5304 device-metadata file (``metadata.resource.k8s.io``) is not in the format;
    ``source`` names the file (or ``<string>``)."""

    def __init__(self, source: str, why: str) -> None:
        self.source = source
        self.why = why
        super().__init__(f"{source}: not a KEP-5304 device-metadata stream: {why}")


class ClaimError(DraError):
    """One claim cannot be prepared: names the claim, the device (when one is at fault) and the
    reason with its fix, e.g. ``claim default/vm-gpu (uid 1f..): device pci-0000-3b-00-0: ...``."""

    def __init__(self, claim: str, reason: str, device: str = "") -> None:
        self.claim = claim
        self.device = device
        self.reason = reason
        where = f"claim {claim}" + (f": device {device}" if device else "")
        super().__init__(f"{where}: {reason}")


class CdiError(VfioError, ValueError):
    """A CDI spec or name (:mod:`vfio_dp.model.cdi`) would not be valid CDI."""
