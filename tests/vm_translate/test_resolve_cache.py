"""``resolve_device_name`` answers a name once per configuration object: reviews name the
same few devices again and again (issue 39 row 4: the selectors were walked for every entry
of every review). Same answers, errors included; a reload (a new Config) resolves afresh; the
names kept are bounded (they come from clients)."""

from __future__ import annotations

import dataclasses

import pytest

import vm_translate.entries as entries
from vfio_dp.model.config import Config
from vm_translate.entries import resolve_device_name
from vm_translate.errors import Unresolvable


@pytest.fixture()
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every time the configuration's selectors are asked for a vendor:device pair."""
    seen: list[str] = []
    real = Config.resources_for_ids

    def counting(self: Config, vendor: str, device: str) -> list[str]:
        seen.append(f"{vendor}:{device}")
        return real(self, vendor, device)

    monkeypatch.setattr(Config, "resources_for_ids", counting)
    return seen


def test_a_name_is_resolved_once_per_configuration(config: Config, walks: list[str]) -> None:
    for _ in range(5):
        assert resolve_device_name("10DE:1EB8", config) == "devices.kubevirt.io/10de_1eb8"
        assert resolve_device_name("devices.kubevirt.io/10DE_10F8", config) == (
            "devices.kubevirt.io/10de_10f8"
        )
    assert walks == ["10DE:1EB8", "10DE:10F8"]  # once each, not five times


def test_a_reload_resolves_again(config: Config, walks: list[str]) -> None:
    resolve_device_name("10de:1eb8", config)
    reloaded = dataclasses.replace(config, resource_domain="example.org")
    assert resolve_device_name("10de:1eb8", reloaded) == "example.org/10de_1eb8"
    assert walks == ["10de:1eb8", "10de:1eb8"]


def test_unresolvable_names_keep_their_reason(config: Config, walks: list[str]) -> None:
    reasons = []
    for _ in range(3):
        with pytest.raises(Unresolvable) as e:
            resolve_device_name("abcd:0001", config)
        reasons.append(str(e.value))
    assert len(set(reasons)) == 1 and "no selector" in reasons[0]
    assert walks == ["abcd:0001"]


def test_names_kept_are_bounded(config: Config) -> None:
    for i in range(3 * entries.RESOLVED_MAX):
        with pytest.raises(Unresolvable):
            resolve_device_name(f"abcd:{i:04x}", config)
    assert len(entries._resolved[1]) <= entries.RESOLVED_MAX
