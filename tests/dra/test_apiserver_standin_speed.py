"""The API-server stand-in's cheaper write path judges exactly as before.

The stand-in's create path was most of the first publication's write time (a 4,096-device
pool's 32 slices: ~1 s of its CPU, three JSON copies per create, a path string per decoded
value, a path per attribute validated). What makes it cheaper must change no verdict and no
message: the fast decoding check (:func:`~tests.dra.apiserver_standin._decodes`) says "no
problem" exactly when the full walk (which builds the messages) finds none, on every shape a
slice's fields can be given wrongly; the attributes judged without building their paths are
exactly those the full check finds nothing in; and the copies dropped from the HTTP path are
not the ones the stand-in's own callers (the scheduler stand-in, KEP-5004's scheduling) rely
on: what they are given back is still theirs to change.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dra.apiserver_standin import (
    CLAIMS,
    SLICES,
    ApiServerStandin,
    _attribute_problems,
    _decode_walk,
    _decodes,
    _plain_attribute,
)
from tests.dra.conftest import DRIVER, a_slice
from tests.dra.test_apiserver_standin import SLICES_PATH, raw

#: a value of every JSON type, each put where another was expected
WRONG: list[Any] = ["s", 1, 1.5, True, None, [], [1], {}, {"unknown": 1}]


def _rich_slice() -> dict[str, Any]:
    """A slice using every part of the schema the plugin writes: attributes of each kind,
    capacity, taints, counters (consumed and shared), binding conditions."""
    s = a_slice(devices=2)
    d = s["spec"]["devices"][0]
    d["attributes"].update(
        {"b": {"bool": True}, "v": {"version": "1.2.3"}, "ss": {"strings": ["a"]}}
    )
    d["capacity"] = {"mem": {"value": "1Gi"}}
    d["taints"] = [{"key": f"{DRIVER}/t", "value": "x", "effect": "NoSchedule"}]
    d["consumesCounters"] = [{"counterSet": "pf", "counters": {"vf": {"value": "1"}}}]
    d["bindingConditions"] = [f"{DRIVER}/ready"]
    d["bindingFailureConditions"] = [f"{DRIVER}/failed"]
    d["bindsToNode"] = True
    return s


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position in ``value`` (dict keys and list indexes), depth first."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _places(v, (*path, i))


def _variants(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``body`` with one thing wrong (or not): each position given each JSON type, and each
    object given an unknown key."""
    for place in list(_places(body))[1:]:
        for wrong in WRONG:
            v = copy.deepcopy(body)
            cur = v
            for p in place[:-1]:
                cur = cur[p]
            cur[place[-1]] = copy.deepcopy(wrong)
            yield v
    for place in _places(body):
        v = copy.deepcopy(body)
        cur = v
        for p in place:
            cur = cur[p]
        if isinstance(cur, dict):
            cur["notAField"] = 1
            yield v


def test_the_fast_decoding_check_agrees_with_the_walk_everywhere() -> None:
    seen = {True: 0, False: 0}
    for body in _variants(_rich_slice()):
        fine = not _decode_walk(body, SLICES.model)
        assert _decodes(body, SLICES.model) == fine, json.dumps(body)[:400]
        seen[fine] += 1
    assert seen[True] > 50 and seen[False] > 400  # both verdicts were met, many times


ATTRIBUTES: list[tuple[str, Any]] = [
    ("vendorID", {"string": "10de"}),
    ("n", {"int": 1}),
    ("b", {"bool": False}),
    ("s", {"string": "s" * 64}),
    ("s", {"string": "s" * 65}),
    ("s", {"string": ""}),
    ("v", {"int": None}),
    ("v", {}),
    ("v", None),
    ("v", {"int": 1, "string": "1"}),
    ("v", {"version": "1.0"}),
    ("v", {"version": "1.0.0"}),
    ("v", {"strings": ["a"]}),
    (f"{DRIVER}/numa-node", {"int": 0}),
    (f"{DRIVER}/numaNode", {"int": 0}),
    ("x" * 33, {"int": 0}),
    ("d" * 64 + "/x", {"int": 0}),
    ("/x", {"int": 0}),
    ("a/", {"int": 0}),
]


@pytest.mark.parametrize(("key", "attr"), ATTRIBUTES)
def test_an_attribute_passed_without_its_path_is_one_the_full_check_passes(
    key: str, attr: Any
) -> None:
    full = _attribute_problems(key, attr, "spec.devices[0].attributes[x]")
    if _plain_attribute(key, attr):
        assert full == []
    if not full and isinstance(attr, dict) and set(attr) <= {"int", "bool", "string"}:
        assert _plain_attribute(key, attr)  # the common case takes the short way


def test_the_http_answer_is_what_is_stored_and_watched(apiserver: ApiServerStandin) -> None:
    code, created = raw(apiserver, "POST", SLICES_PATH, a_slice())
    assert code == 201
    name = created["metadata"]["name"]
    assert raw(apiserver, "GET", f"{SLICES_PATH}/{name}") == (200, created)
    body = copy.deepcopy(created)
    body["spec"]["pool"]["generation"] = 2
    code, replaced = raw(apiserver, "PUT", f"{SLICES_PATH}/{name}", body)
    assert code == 200 and replaced["spec"]["pool"]["generation"] == 2
    assert raw(apiserver, "GET", f"{SLICES_PATH}/{name}") == (200, replaced)
    watched = [(e.type, e.obj) for e in apiserver.store.events if e.kind is SLICES]
    assert watched == [("ADDED", created), ("MODIFIED", replaced)]


def test_what_the_stand_ins_own_callers_get_back_is_theirs(apiserver: ApiServerStandin) -> None:
    """seed, _create and _replace (the scheduler stand-ins' way in) copy on the way in and
    on the way out: changing what was given or got back changes nothing stored or watched."""
    given = a_slice()
    got = apiserver.seed(SLICES, given)
    given["spec"]["pool"]["generation"] = 7
    got["spec"]["pool"]["generation"] = 8
    got["metadata"]["labels"]["app"] = "changed"
    claim = {"metadata": {"name": "c", "namespace": "ns1"}, "spec": {"devices": {"requests": []}}}
    with apiserver.lock:
        made = apiserver._create(CLAIMS, "ns1", claim)
        made["metadata"]["labels"] = {"changed": "yes"}
        again = apiserver._replace(CLAIMS, "ns1", "c", made, status=False)
        again["metadata"]["labels"]["changed"] = "twice"
    (stored,) = apiserver.objects(SLICES)
    assert stored["spec"]["pool"]["generation"] == 1
    assert stored["metadata"]["labels"] == {"app": "vfio-dp"}
    (c,) = apiserver.objects(CLAIMS)
    assert c["metadata"]["labels"] == {"changed": "yes"}
    watched = [e.obj for e in apiserver.store.events]
    assert watched[-3]["spec"]["pool"]["generation"] == 1  # the seeded slice's ADDED
    assert watched[-1]["metadata"]["labels"] == {"changed": "yes"}
    assert "labels" not in watched[-2]["metadata"]  # the claim as created


def test_concurrent_creates_each_answer_their_own_object(apiserver: ApiServerStandin) -> None:
    """Eight slices created at once (as the publisher writes a pool): each answer is its own
    slice, as stored."""
    answers: dict[str, dict[str, Any]] = {}

    def create(i: int) -> None:
        code, body = raw(apiserver, "POST", SLICES_PATH, a_slice(f"s-{i}"))
        assert code == 201
        answers[body["metadata"]["name"]] = body

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = {o["metadata"]["name"]: o for o in apiserver.objects(SLICES)}
    assert stored == answers and len(stored) == 8
