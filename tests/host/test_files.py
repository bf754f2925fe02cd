"""The one config-file reader (:mod:`vfio_dp.host.files`): real files, FIFOs and directories."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.model.test_config import BILLION_LAUGHS
from vfio_dp.errors import ConfigError
from vfio_dp.host.files import NotRegularFileError, load_config, read_regular
from vfio_dp.model.config import DEFAULT_CONFIG, MAX_CONFIG_BYTES


def test_no_path_is_the_default() -> None:
    assert load_config(None) is DEFAULT_CONFIG


def test_a_good_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("selectors:\n- vendor: '10de'\n")
    assert load_config(str(cfg)).selectors[0].vendors == ("10de",)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(err.value) and "No such file" in str(err.value)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            load_config(str(fifo))
        except BaseException as e:  # handed to the test thread
            done.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO config blocked")
    assert isinstance(done[0], ConfigError) and "not a regular file" in str(done[0])


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(str(tmp_path))


def test_read_regular_reads_at_most_one_byte_past_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (3 * MAX_CONFIG_BYTES))
    assert len(read_regular(str(big), 100)) == 101
    with pytest.raises(ConfigError, match="larger than"):
        load_config(str(big))
    with pytest.raises(NotRegularFileError):
        read_regular("/dev/null", 10)


def test_not_utf8_and_billion_laughs_files(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("selectors:\n- resourceName: gerät\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_config(str(latin))
    assert "latin1.yaml" in str(err.value) and "not UTF-8" in str(err.value)
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError, match="aliases"):  # refused while composing: nothing expanded
        load_config(str(laughs))
