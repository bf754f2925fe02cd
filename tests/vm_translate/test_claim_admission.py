"""Claim entries that can never work are denied at admission with the rule (issue 20 item
11): by the webhook's decision and by plain ``vfioctl translate``; a denial listing thousands
of problems stays short (the first ones and a count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import vfioctl
from tests.vm_translate.conftest import CONFIG_YAML
from vfio_dp.model.config import Config
from vm_translate.review import decide


def vmi(host_devices: list[Any], claims: list[Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns"},
        "spec": {
            "domain": {"devices": {"hostDevices": host_devices}},
            "resourceClaims": claims,
        },
    }


CLAIMS = [{"name": "nics", "resourceClaimTemplateName": "vm1-nics"}]


def entry(name: str = "nic", claim: str = "nics", request: str = "nic") -> dict[str, str]:
    return {"name": name, "claimName": claim, "requestName": request}


CASES = [
    ([entry(request="../x")], CLAIMS, "requestName", "is not a DNS label"),
    ([entry(request="nic/../../x")], CLAIMS, "requestName", "more than one '/'"),
    ([entry(request="nic/..")], CLAIMS, "requestName", "subrequest part '..'"),
    ([entry(request="r" * 1000)], CLAIMS, "requestName", "is not a DNS label"),
    ([entry(name="a/b")], CLAIMS, ".name", "ua-dra-<kind>-<name>"),
    ([entry(claim="Bad_Claim")], [{"name": "Bad_Claim", "resourceClaimName": "x"}],
     "resourceClaims[0].name", "must be a DNS label"),
    ([entry()], [{"name": "nics", "resourceClaimName": "../etc"}],
     "resourceClaims[0].resourceClaimName", "DNS subdomain"),
    ([entry(name="a"), entry(name="b")], CLAIMS, "hostDevices", "already the entry 'a'"),
    # issue 37.18c: the API server refuses a claim of more than 32 requests at creation
    ([entry(name=f"n{i}", request=f"r{i}") for i in range(33)], CLAIMS, "spec.resourceClaims",
     "33 DRA entries would each be a request of this one claim, but a ResourceClaim holds at most 32"),
]  # fmt: skip


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"uid": "u-1", "operation": "CREATE", "kind": {"kind": obj["kind"]}, "object": obj}


@pytest.mark.parametrize(("devices", "claims", "where", "rule"), CASES)
def test_the_webhook_denies_claim_entries_that_can_never_work(
    config: Config, devices: list[Any], claims: list[Any], where: str, rule: str
) -> None:
    answer = decide(_review(vmi(devices, claims)), config)  # type: ignore[arg-type]
    response = answer["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert where in message and rule in message, message
    assert len(message) < 2000


@pytest.mark.parametrize(("devices", "claims", "where", "rule"), CASES)
def test_plain_translate_refuses_them_too(
    tmp_path: Path, devices: list[Any], claims: list[Any], where: str, rule: str
) -> None:
    spec = tmp_path / "vmi.yaml"
    spec.write_text(yaml.safe_dump(vmi(devices, claims)))
    (tmp_path / "config.yaml").write_text(CONFIG_YAML)
    result = CliRunner().invoke(
        vfioctl, ["translate", "--config", str(tmp_path / "config.yaml"), str(spec)]
    )
    assert result.exit_code != 0
    assert where in result.output and rule in result.output, result.output


def test_a_good_claim_entry_is_still_admitted(config: Config) -> None:
    obj = vmi([entry(), entry(name="n2", request="other/big")], CLAIMS)
    assert decide(_review(obj), config)["response"]["allowed"] is True  # type: ignore[arg-type]


def test_thirty_two_requests_of_one_claim_are_admitted(config: Config) -> None:
    """The limit is the API's own: 32 requests per claim pass, across two claims 64 do."""
    two = [*CLAIMS, {"name": "more", "resourceClaimTemplateName": "vm1-more"}]
    devices = [entry(name=f"n{i}", request=f"r{i}") for i in range(32)]
    devices += [entry(name=f"m{i}", claim="more", request=f"r{i}") for i in range(32)]
    answer = decide(_review(vmi(devices, two)), config)  # type: ignore[arg-type]
    assert answer["response"]["allowed"] is True, answer


def test_a_denial_of_ten_thousand_duplicates_is_bounded(config: Config) -> None:
    devices = [entry(name=f"e{i}") for i in range(10_000)]
    answer = decide(_review(vmi(devices, CLAIMS)), config)  # type: ignore[arg-type]
    message = answer["response"]["status"]["message"]
    assert answer["response"]["allowed"] is False
    assert "already the entry 'e0'" in message
    assert "and 9979 more problem(s)" in message
    assert len(message) < 10_000, len(message)
