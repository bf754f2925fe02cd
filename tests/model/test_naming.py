import pytest

from vfio_dp.model import naming


@pytest.mark.parametrize(
    ("resource", "env"),
    [
        ("nvidia.com/TU104GL_Tesla_T4", "PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4"),
        ("devices.kubevirt.io/8086_10d3", "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3"),
        ("example.com/nvme-a", "PCI_RESOURCE_EXAMPLE_COM_NVME-A"),  # '-' is NOT replaced
    ],
)
def test_kubevirt_env_var(resource: str, env: str) -> None:
    assert naming.kubevirt_env_var(resource) == env


def test_sriov_env_var() -> None:
    assert naming.sriov_env_var("intel.com/x710") == "PCIDEVICE_INTEL_COM_X710"


def test_default_resource_name_is_lowercase() -> None:
    assert naming.default_resource_name("10DE", "1EB8") == "devices.kubevirt.io/10de_1eb8"
    assert naming.default_resource_name("10de", "1eb8", "gpu.example.com") == (
        "gpu.example.com/10de_1eb8"
    )


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("devices.kubevirt.io/10de_1eb8", None),
        ("example.com/nvme-a", None),
        ("nogroup", "domain-qualified"),
        ("kubernetes.io/gpu", "reserved"),
        ("x.kubernetes.io/gpu", "reserved"),
        ("Example.com/gpu", "DNS subdomain"),
        ("example.com/-gpu", "name part"),
        ("example.com/a/b", "exactly one"),
        ("example.com/" + "a" * 64, "name part"),
    ],
)
def test_resource_name_problem(name: str, problem: str | None) -> None:
    got = naming.resource_name_problem(name)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_socket_name_has_no_slash() -> None:
    assert "/" not in naming.socket_name("devices.kubevirt.io/10de_1eb8")


# -- the DRA driver name: one rule, one limit, one default ----------------------------------
@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("vfio.dra.vfio-dp.io", None),
        ("d" * 54 + ".example", None),  # 62
        ("d" * 55 + ".example", None),  # 63: the API server's limit
        ("d" * 56 + ".example", "more than 63"),
        ("", "empty"),
        ("Vfio.Example.com", "lowercase DNS subdomain"),
        ("vfio_example.com", "lowercase DNS subdomain"),
        ("9vfio.example.com", "cannot be a CDI vendor"),
    ],
)
def test_dra_driver_name_problem(name: str, needle: str | None) -> None:
    got = naming.dra_driver_name_problem(name)
    assert got is None if needle is None else (got is not None and needle in got), got


def test_the_default_dra_driver_name_passes_its_own_rule() -> None:
    assert naming.check_dra_driver_name(naming.DEFAULT_DRA_DRIVER) == naming.DEFAULT_DRA_DRIVER


def test_a_bad_driver_name_is_one_error_a_usage_and_a_dra_error() -> None:
    from vfio_dp.errors import DraError, DriverNameError, UsageError

    with pytest.raises(DriverNameError) as e:
        naming.check_dra_driver_name("x" * 64)
    assert isinstance(e.value, UsageError) and isinstance(e.value, DraError)
    assert "'" + "x" * 64 + "'" in str(e.value) and "at most 63" in str(e.value)


@pytest.mark.parametrize(
    ("uid", "ok"),
    [
        ("0b9a1c2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b", True),
        ("u-1", True),
        ("", False),
        ("..", False),
        (".hidden", False),
        ("-x", False),
        ("a/b", False),
        ("u id", False),
        ("x" * 128, True),
        ("x" * 129, False),
    ],
)
def test_claim_uid_problem(uid: str, ok: bool) -> None:
    got = naming.claim_uid_problem(uid)
    assert (got is None) == ok, got
    if not ok:
        assert got is not None and "not a Kubernetes UID" in got


@pytest.mark.parametrize(
    ("part", "value", "ok"),
    [
        ("vendor", "vfio.dra.vfio-dp.io", True),
        ("vendor", "9vendor", False),
        ("vendor", "v-", False),
        ("class", "vfio", True),
        ("class", "a/b", False),
        ("device name", "0000:65:00.0", True),
        ("device name", "uid-1-pci-0000-3b-00-0", True),
        ("device name", "-g1", False),
        ("device name", "x=y", False),
        ("device name", "a" * 254, False),
    ],
)
def test_cdi_name_problem(part: str, value: str, ok: bool) -> None:
    got = naming.cdi_name_problem(part, value)  # type: ignore[arg-type]
    assert (got is None) == ok, got
    if not ok:
        assert got is not None and f"CDI {part} {value!r}" in got


@pytest.mark.parametrize(
    ("type_name", "type_id", "resource"),
    [
        ("GRID T4-1Q", "nvidia-222", "devices.kubevirt.io/GRID_T4-1Q"),  # KubeVirt's space -> _
        ("GRID  T4-1Q", "nvidia-222", "devices.kubevirt.io/GRID__T4-1Q"),  # each space, as KubeVirt
        ("Intel GVT-g/1 (low)", "i915-GVTg_V5_4", "devices.kubevirt.io/Intel_GVT-g_1__low"),
        ("  Dual port serial\n", "mtty-2", "devices.kubevirt.io/Dual_port_serial"),
        (None, "nvidia-222", "devices.kubevirt.io/nvidia-222"),  # unreadable name: the type id
        ("///", "mtty-1", "devices.kubevirt.io/mtty-1"),  # nothing usable: the type id
        ("x" * 80, "t", "devices.kubevirt.io/" + "x" * 63),  # cut to 63
    ],
)
def test_default_mdev_resource_name(type_name: str | None, type_id: str, resource: str) -> None:
    name = naming.default_mdev_resource_name(type_name, type_id)
    assert name == resource
    assert naming.resource_name_problem(name) is None
    assert naming.default_mdev_resource_name("GRID T4-1Q", "x", "nvidia.com") == (
        "nvidia.com/GRID_T4-1Q"
    )
