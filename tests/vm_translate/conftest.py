"""Shared fixtures: the daemon's own configuration format, parsed by the daemon's own parser;
and a garbage collection after each test of a ``test_webhook*`` module (those open sockets;
a collection costs ~25 ms, too much for all 286 tests), so a socket such a test leaves open
fails THAT test.

An asyncio socket closed too late (tests/vm_translate/streams.py says how) is closed by the
garbage collector, whose ResourceWarning pytest turns into an error for the test running at
that moment: without the collection here, whichever test the worker runs next.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

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


@pytest.fixture(autouse=True)
def _leaks_fail_here(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.module.__name__.rpartition(".")[2].startswith("test_webhook"):
        gc.collect()
