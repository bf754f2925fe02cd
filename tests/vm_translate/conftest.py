"""Shared fixtures: the daemon's own configuration format, parsed by the daemon's own parser."""

from __future__ import annotations

import pytest

from vfio_dp.model.config import Config, load_config_text

CONFIG_YAML = """\
selectors:
  - vendor: "10de"
    device: ["1eb8", "10f8"]
  - vendor: "8086"
    device: "0a54"
    addresses: ["0000:65:00.0"]
    resourceName: nvme-a
  - vendor: "8086"
    device: "0a54"
    resourceName: nvme-b
  - vendor: "15b3"
    resourceName: example.com/mlx
"""


@pytest.fixture()
def config() -> Config:
    return load_config_text(CONFIG_YAML, "test-config.yaml")
