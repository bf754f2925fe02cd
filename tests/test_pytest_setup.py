"""The suite's own rules, as the test run applies them: a time limit on every test (larger for
guest and image tests) and warnings as errors."""

from __future__ import annotations

import warnings

import pytest

from tests.conftest import GUEST_TIMEOUT, IMAGE_TIMEOUT, pytest_collection_modifyitems


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    """pytest-timeout is loaded (the test extra) and pyproject.toml sets its default, so
    `make test` (what CI runs) applies it too."""
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) == 120
    assert request.node.get_closest_marker("timeout") is None  # the default applies here


class _Item:
    """What the hook reads of a collected test: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.marks = [m.mark for m in marks]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.mark)

    def limit(self) -> object:
        mark = self.get_closest_marker("timeout")
        return mark.args[0] if mark else None


def test_guest_and_image_tests_get_their_own_limits() -> None:
    unit, guest, image = _Item(), _Item(pytest.mark.guest), _Item(pytest.mark.image)
    own = _Item(pytest.mark.guest, pytest.mark.timeout(7))
    pytest_collection_modifyitems([unit, guest, image, own])  # type: ignore[list-item]
    assert unit.limit() is None  # the default from pyproject.toml
    assert guest.limit() == GUEST_TIMEOUT and image.limit() == IMAGE_TIMEOUT
    assert own.limit() == 7  # a test's own limit wins
    assert GUEST_TIMEOUT > 120 + 1500 + 15 + 60  # the rig's limit for its longest run


@pytest.mark.guest  # selected with the guest tests (`make test`'s serial part), boots nothing
def test_the_guest_tests_collected_here_carry_the_guest_limit(
    request: pytest.FixtureRequest,
) -> None:
    guest = [i for i in request.session.items if i.get_closest_marker("guest")]
    if not guest:
        pytest.skip("no guest test collected in this run (deselected by -m or a path)")
    for item in guest:
        assert item.get_closest_marker("timeout").args == (GUEST_TIMEOUT,), item.nodeid


def test_a_warning_is_an_error() -> None:
    with pytest.raises(DeprecationWarning):
        warnings.warn("from our own code", DeprecationWarning, stacklevel=1)


def test_make_check_deselects_exactly_the_registered_slow_markers() -> None:
    """`make check` (the fast tier) names its markers in the Makefile; a typo there would
    silently select everything, and a marker added to pyproject.toml must be decided on."""
    import re
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    makefile = (repo / "Makefile").read_text()
    m = re.search(r"^CHECK_MARKERS \?= (.+)$", makefile, re.MULTILINE)
    assert m, "Makefile: CHECK_MARKERS ?= not guest and not ..."
    named = re.findall(r"not (\w+)", m.group(1))
    assert m.group(1) == " and ".join(f"not {n}" for n in named)
    ini = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in ini["markers"]}
    assert set(named) == registered, (named, registered)
