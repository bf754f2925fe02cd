"""``personalities`` of a selector (issue 36, item 1): declared once, parsed, and its rule
with ``bind: onPrepare`` (a config error naming the selector and the fix)."""

from __future__ import annotations

import pytest

from vfio_dp.errors import ConfigError
from vfio_dp.model.config import load_config_text
from vfio_dp.model.personality import Personality


def one(text: str) -> tuple[Personality, ...]:
    return load_config_text(f"selectors: [{text}]", "cfg.yaml").selectors[0].personalities


def test_the_default_is_vm_alone() -> None:
    assert one('{vendor: "1b36", path: dra, bind: onPrepare}') == (Personality.VM,)


def test_both_and_container_alone_are_allowed_with_on_prepare() -> None:
    both = one('{vendor: "1b36", path: dra, bind: onPrepare, personalities: [vm, container]}')
    assert both == (Personality.VM, Personality.CONTAINER)
    alone = one('{vendor: "1b36", path: dra, bind: onPrepare, personalities: [container]}')
    assert alone == (Personality.CONTAINER,)
    assert one('{vendor: "1b36", path: dra, personalities: [vm]}') == (Personality.VM,)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{vendor: "1b36", path: dra, personalities: [vm, container]}',
            "selectors[0].personalities: ['vm', 'container']: container needs path: dra and "
            "bind: onPrepare",
        ),
        (
            '{vendor: "1b36", path: dra, bind: true, personalities: [container]}',
            "add path: dra and bind: onPrepare, or remove container",
        ),
        ('{vendor: "1b36", path: dra, personalities: [gpu]}', "'gpu': must be vm or container"),
        ('{vendor: "1b36", path: dra, personalities: []}', "must be a non-empty list"),
        ('{vendor: "1b36", path: dra, personalities: [vm, vm]}', "names vm twice"),
        ('{vendor: "1b36", personalities: [vm]}', "only the DRA plugin offers personalities"),
    ],
)
def test_wrong_values_name_the_selector_and_the_fix(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        one(text)
    assert said in str(e.value)
