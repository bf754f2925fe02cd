"""A request name is ``<request>`` or ``<request>/<subrequest>``, each part a DNS label, wherever
one is read (issue 20 item 12): the claim view (Prepare answers a per-claim error), the
metadata writer, and the metadata reader of ``vfioctl hostdev`` (tests/vm_translate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dra.test_prepare import CONFIG, Claims, _boot, _preparer, _spec, result, run
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.errors import MetadataFormatError
from vfio_dp.model import dra_metadata as md
from vfio_dp.model.config import load_config_text
from vfio_dp.model.naming import request_name_problem

DRIVER = "vfio.example.com"
BAD = ["dev/../../x", "dev/..", "dev/", "/dev", "a/b/c", "dev/Big", "dev/" + "x" * 64, "../x"]


@pytest.mark.parametrize("name", ["gpu", "gpu/big", "a-1/b-2", "x" * 63 + "/" + "y" * 63])
def test_good_request_names(name: str) -> None:
    assert request_name_problem(name) is None


@pytest.mark.parametrize("name", BAD)
def test_bad_request_names_say_which_part(name: str) -> None:
    problem = request_name_problem(name)
    assert problem is not None and name[:40] in problem


def test_the_metadata_writer_refuses_a_bad_subrequest(tmp_path: Path) -> None:
    dev = md.MetadataDevice(DRIVER, "node-a", "pci-0000-03-01-0", {})
    with pytest.raises(MetadataFormatError, match=r"subrequest part '\.\.' is not a DNS label"):
        mdfile.build_claim(
            str(tmp_path),
            DRIVER,
            claim_name="c",
            namespace="ns",
            uid="11111111-2222-3333-4444-555555555555",
            pod_claim_name=None,
            devices_by_request={"dev": [("dev/..", dev)]},
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["dev/../../x", "nic/Big"])
def test_prepare_answers_a_bad_subrequest_for_that_claim_only(
    tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path, name: str
) -> None:
    _boot(tree, "boot-1")
    claims = Claims()
    dirs = (str(tmp_path / "cdi"), str(tmp_path / "plugins"))
    preparer = _preparer(tree, kernel, load_config_text(CONFIG, "t"), claims, dirs)
    bad = claims.add("bad", "uid-bad", [result("pci-0000-03-01-0", request=name)])
    good = claims.add("good", "uid-good", [result("pci-0000-3b-00-0", request="gpu")])
    out = run(preparer.prepare([bad, good]))
    err = out["uid-bad"].error
    assert f"request name {name!r}" in err and ("subrequest part" in err or "more than one" in err)
    assert out["uid-good"].error == ""
    assert _spec(dirs, "uid-bad") is None and _spec(dirs, "uid-good") is not None
    assert tree.driver_of("0000:03:01.0") == "e1000"
