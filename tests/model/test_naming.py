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
