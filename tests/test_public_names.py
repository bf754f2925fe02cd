"""Each package's public surface is declared in its ``__init__``'s ``__all__``.

Import-light packages list their public modules (imported on use); ``vfio_dp.host`` lists
the facade's classes. A module added to a package without being declared public (or named
``_private``) fails here, and so does a declared name that does not exist.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

MODULE_PACKAGES = [
    "vfio_dp",
    "vfio_dp.core",
    "vfio_dp.deviceplugin",
    "vfio_dp.dra",
    "vfio_dp.dra.apiserver",
    "vfio_dp.dra.claimpath",
    "vfio_dp.dra.kubeletapi",
    "vfio_dp.dra.observers",
    "vfio_dp.model",
    "vm_translate",
    "cli",
]


@pytest.mark.parametrize("name", MODULE_PACKAGES)
def test_every_public_module_is_declared_and_exists(name: str) -> None:
    pkg = importlib.import_module(name)
    present = {m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")}
    declared = set(pkg.__all__)
    assert present - declared == set(), f"add to {name}.__all__ (or name them _private)"
    assert declared - present == set(), f"{name}.__all__ names modules that do not exist"
    assert list(pkg.__all__) == sorted(pkg.__all__)


@pytest.mark.parametrize("name", MODULE_PACKAGES)
def test_package_init_stays_import_light(name: str) -> None:
    """Declaring the modules public does not import them: ``vfioctl list`` must not pay."""
    code = (
        f"import sys, {name} as p; "
        "print(sorted(m for m in p.__all__ if f'{p.__name__}.{m}' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_host_facade_names() -> None:
    import vfio_dp.host as host

    assert host.__all__ == ["BindResult", "CheckReport", "Host", "Step"]
    for n in host.__all__:
        assert isinstance(getattr(host, n), type), n
    public = {n for n in dir(host.Host) if not n.startswith("_")}
    # what the CLI uses: nothing past the facade (no host.fs / host.root.safe_component)
    assert {"scan", "names", "groups", "bind", "unbind", "unbind_all", "check", "display",
            "valid_driver_name"} <= public  # fmt: skip


def test_exception_trees() -> None:
    """Every error class of a package derives from the package's base."""
    from vfio_dp import errors as node
    from vm_translate import errors as cluster

    for mod, base in ((node, node.VfioError), (cluster, cluster.TranslateError)):
        classes = [
            v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, Exception)
        ]
        assert classes and all(issubclass(c, base) for c in classes), mod.__name__
    from vm_translate.errors import Unresolvable
    from vm_translate.patch import PatchError

    assert issubclass(PatchError, cluster.TranslateError)
    assert issubclass(Unresolvable, cluster.TranslateError)
    assert issubclass(PatchError, ValueError) and issubclass(Unresolvable, ValueError)
