"""The config's fields are declared once (vfio_dp.model.config_fields): the checker's keys and
parsers, "selects nothing" and docs/configuration.md all follow that one declaration."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from vfio_dp.errors import ConfigError
from vfio_dp.model import config_check
from vfio_dp.model.config import Config, Selector, load_config_text, parse_config
from vfio_dp.model.config_fields import ACTION, MATCH, Kind, markdown_table, yaml_field, yaml_fields
from vfio_dp.model.mdev_config import MdevEntry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
#: every problem the checker gave for these selectors at 1e3e734, before the fields were
#: declared once: the messages stay the same, word for word
PROBLEMS = json.loads((Path(__file__).parent / "data" / "config_problems.json").read_text())


def _docs_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_docs", ROOT / "scripts/config_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", PROBLEMS, ids=lambda c: json.dumps(c["selector"])[:60])
def test_each_problem_reads_as_before(case: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"selectors": [case["selector"]]}, "t")
    got = sorted([k, repr(v), why] for k, v, why in e.value.problems)
    assert got == sorted(case["problems"])  # type: ignore[type-var]


def test_every_yaml_key_is_a_declared_field_and_nothing_else() -> None:
    keys = [f.key for f in yaml_fields(Selector)]
    assert len(keys) == len(set(keys))
    assert set(keys) == config_check._SELECTOR_KEYS
    assert {"resourceDomain", "selectors", "mdev"} == config_check._TOP_KEYS
    # every dataclass field is set from the file except the one bind: onPrepare sets
    plain = {f.name for f in dataclasses.fields(Selector)} - {f.attr for f in yaml_fields(Selector)}
    assert plain == {"bind_on_prepare"}
    with pytest.raises(ConfigError) as e:
        parse_config({"selectors": [{"vendr": "10de"}]})
    assert f"(known: {', '.join(sorted(keys))})" in str(e.value)


def test_every_kind_has_a_parser_and_every_choice_is_accepted() -> None:
    for f in yaml_fields(Selector):
        assert f.kind.name in config_check._PARSERS, f.key
        for value in f.kind.values:
            raw = {"vendor": "10de", "path": "dra", f.key: value}
            if f.key == "vfDriver":
                raw |= {"addresses": ["0000:01:00.0"], "numVfs": 1, "bind": False}
            assert getattr(parse_config({"selectors": [raw]}).selectors[0], f.attr) == value


def test_selects_nothing_follows_the_match_role() -> None:
    with pytest.raises(ConfigError, match="selects nothing"):
        parse_config({"selectors": [{"resourceName": "x", "nodes": ["a"], "bind": True}]})
    assert parse_config({"selectors": [{"sriov": "vf"}]}).selectors[0].sriov == "vf"
    assert {f.key for f in yaml_fields(Selector) if f.role == MATCH} == {
        "vendor", "device", "class", "subsystemVendor", "subsystemDevice", "addresses",
        "drivers", "sriov",
    }  # fmt: skip


def test_a_new_field_is_one_declaration() -> None:
    @dataclasses.dataclass(frozen=True)
    class Toy:
        size: int = yaml_field(3, "size", Kind("count", "a whole number"), ACTION, "how big")
        internal: bool = False

    (f,) = yaml_fields(Toy)
    assert (f.attr, f.key, f.default, f.shown_default) == ("size", "size", 3, "`3`")
    assert Toy().size == 3 and Toy(size=4).size == 4
    assert "| `size` | a whole number | `3` | how big |" in markdown_table(yaml_fields(Toy))


def test_the_docs_table_is_the_declaration() -> None:
    """A field missing from docs/configuration.md, documented but unknown, or documented with
    another default or text fails here; `python scripts/config_docs.py` rewrites the tables."""
    text = DOC.read_text(encoding="utf-8")
    script = _docs_script()
    assert script.rendered(text) == text, "run: python scripts/config_docs.py"
    documented = re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE)
    declared = [f.key for f in yaml_fields(Config) + yaml_fields(Selector) + yaml_fields(MdevEntry)]
    assert documented == declared


def test_the_docs_table_check_catches_a_missing_and_an_unknown_field() -> None:
    script = _docs_script()
    text = DOC.read_text(encoding="utf-8")
    missing = re.sub(r"^\| `numVfs` \|.*\n", "", text, flags=re.MULTILINE)
    unknown = text.replace("<!-- end fields: Selector -->", "| `colour` | x | x | x |\n"
                           "<!-- end fields: Selector -->")  # fmt: skip
    assert missing != text and unknown != text
    assert script.rendered(missing) == text and script.rendered(unknown) == text
    assert script.main(["--check"]) == 0


def test_every_yaml_example_in_the_docs_loads() -> None:
    """A key the docs' examples use that the checker does not know fails here."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    configs = [b for b in blocks if b.lstrip().startswith(("resourceDomain:", "selectors:"))]
    assert configs
    for block in configs:
        load_config_text(block, str(DOC))
