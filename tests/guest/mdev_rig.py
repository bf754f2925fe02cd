"""The kernel's sample mdev driver ``mtty`` for the guest, built by the rig's one module
builder (:func:`tests.guest.rig.build_modules`).

Its source is ``samples/vfio-mdev/mtty.c`` of Debian's ``linux-source-<series>`` (the
guest kernel's series: ``6.1`` for ``6.1.0-56-amd64``; installed by scripts/setup.sh as
``/usr/src/linux-source-6.1.tar.xz``). Only that one file is taken out of the tarball, once,
into the rig's cache beside a one-line ``Kbuild``; no source or binary is committed. In the
guest, ``modprobe mdev`` then ``insmod mtty.ko`` gives the virtual parent
``/sys/devices/virtual/mtty/mtty`` (``/sys/class/mdev_bus/mtty``) with the types ``mtty-1``
("Single port serial") and ``mtty-2`` ("Dual port serial"), 24 ports between them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .rig import GuestRigUnavailable, build_modules, cache_root

MEMBER = "samples/vfio-mdev/mtty.c"


def series(release: str) -> str:
    """``6.1`` for ``6.1.0-56-amd64``."""
    return ".".join(release.split(".")[:2])


def mtty_source(release: str) -> Path:
    """A directory with ``mtty.c`` (from ``linux-source-<series>``) and its ``Kbuild``."""
    s = series(release)
    out = cache_root() / "mtty-src" / s
    if (out / "mtty.c").is_file():
        return out
    tarball = Path("/usr/src") / f"linux-source-{s}.tar.xz"
    if not tarball.is_file():
        raise GuestRigUnavailable(
            f"{tarball} is missing: install linux-source-{s} (scripts/setup.sh does)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".mtty-", dir=out.parent))
    try:
        subprocess.run(  # the one member: tar still reads the whole xz stream (~1 min)
            ["tar", "-xJf", str(tarball), "-C", str(work), "--strip-components=3",
             f"linux-source-{s}/{MEMBER}"],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        (work / "Kbuild").write_text("obj-m := mtty.o\n")
        os.chmod(work, 0o755)
        os.replace(work, out)
    except subprocess.CalledProcessError as e:
        raise GuestRigUnavailable(f"cannot take {MEMBER} out of {tarball}: {e.stderr}") from e
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return out


def build_mtty(release: str) -> Path:
    """The directory holding ``mtty.ko`` built for ``release``."""
    return build_modules(release, source=mtty_source(release))
