"""The publisher's requests: ResourceSlices created, replaced and deleted, a pool's slices
written :data:`WRITERS` at a time.

The calls (what the DRA plugin's RBAC must allow; the publisher's module doc lists them all)::

    POST   /apis/resource.k8s.io/v1/resourceslices?fieldValidation=Strict
    PUT    /apis/resource.k8s.io/v1/resourceslices/<name>?fieldValidation=Strict  (resourceVersion read)
    DELETE /apis/resource.k8s.io/v1/resourceslices/<name>

Bodies are plain JSON through the ``ApiClient`` (:mod:`.plain`: no typed model on either side).

Why writing a pool's slices at once is safe (``reference/dra.md``: slices of an older
``pool.generation`` are ignored): :meth:`SliceWriter.write_all` is given either ONE slice (a
change kept at the pool's generation: one write is atomic) or every slice of the pool at a
new generation. A consumer (the scheduler) takes a pool's newest generation only when it holds
``pool.resourceSliceCount`` slices; until the last write lands the new generation is
incomplete and the pool is not allocated from, whatever order the writes land in -- exactly
as while they were written one after another, only for ~1/:data:`WRITERS` of the time. Every
write of a call has ended (done, failed or cut off by the call's deadline) before it returns,
so no write of one reconcile races the next.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import kubernetes.client as k8s

from vfio_dp.dra.apiserver.client import call_json, current, own_client, run_under
from vfio_dp.dra.apiserver.plain import RESOURCE_API, send
from vfio_dp.dra.slices import Slice
from vfio_dp.errors import ApiCallError

SLICES_PATH = f"{RESOURCE_API}/resourceslices"
#: slice writes of one publication in flight at most (16 + 1 slices at 1,024 tainted devices;
#: 64 + 1 at 4,096): also the connections the writes' pool keeps open
WRITERS = 8


class SliceWriter:
    """Blocking requests for the publisher's lane thread (and its :data:`WRITERS` helpers)."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self.client = own_client(client, WRITERS)
        #: what our own writes made (name -> resourceVersion) and deletes, as they happen:
        #: the publisher's watch ignores its events of them
        self.ours: dict[str, str] = {}
        self.deleting: set[str] = set()
        self.writes = 0  # slices created or updated (tests: one change, one write)
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="vfio_dp-api-slice-writes")

    def close(self) -> None:
        """Writes under way end by their call's deadline (the lane's close shuts their
        sockets); none starts after this."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def send(
        self, what: str, method: str, path: str, body: Slice | None = None, strict: bool = False
    ) -> dict[str, Any]:
        """One request with a plain JSON body (:func:`.plain.send`); the answer's JSON."""
        query = [("fieldValidation", "Strict")] if strict else []
        return call_json(what, send, self.client, method, path, body, query=query)

    def write(self, body: Slice, resource_version: str | None) -> tuple[str, dict[str, Any]]:
        """Create ``body`` (``resource_version`` None) or replace it at that resourceVersion:
        → (its new resourceVersion, the spec the server answered with)."""
        name = body["metadata"]["name"]
        if resource_version is None:
            answer = self.send(f"creating ResourceSlice {name}", "POST", SLICES_PATH, body, True)
        else:
            meta = {**body["metadata"], "resourceVersion": resource_version}
            answer = self.send(
                f"updating ResourceSlice {name}",
                "PUT",
                f"{SLICES_PATH}/{name}",
                {**body, "metadata": meta},
                True,
            )
        rv: str = answer.get("metadata", {}).get("resourceVersion", "")
        self.ours[name] = rv
        return rv, answer.get("spec") or {}

    def write_all(
        self,
        slices: Sequence[Slice],
        versions: Mapping[str, str],
        answered: Callable[[Slice, str, dict[str, Any]], None],
    ) -> None:
        """Write ``slices`` (each replaced at its resourceVersion in ``versions``, or created),
        :data:`WRITERS` at a time, each under the calling thread's deadline; ``answered(slice,
        resourceVersion, spec)`` in this thread for each one written. Returns once every write
        has ended; raises the first failure (in ``slices`` order) if any failed."""
        d = current()
        futures: list[tuple[Slice, Future[tuple[str, dict[str, Any]]]]] = []
        for s in slices:
            rv = versions.get(s["metadata"]["name"])
            if len(slices) == 1:  # one slice: no hand-over
                futures.append((s, _now(self.write, s, rv)))
            else:
                futures.append((s, self._pool.submit(run_under, d, self.write, s, rv)))
        failure: BaseException | None = None
        for s, f in futures:
            try:
                rv, spec = f.result()
            except Exception as e:  # every write has ended before anything is raised
                failure = failure or e
                continue
            self.writes += 1
            answered(s, rv, spec)
        if failure is not None:
            raise failure

    def delete(self, name: str) -> None:
        """Delete slice ``name`` (gone already: done)."""
        self.deleting.add(name)
        try:
            self.send(f"deleting ResourceSlice {name}", "DELETE", f"{SLICES_PATH}/{name}")
        except ApiCallError as e:
            if e.status != 404:
                raise


def _now(fn: Callable[..., tuple[str, dict[str, Any]]], *args: Any) -> Future[Any]:
    """``fn(*args)`` run in this thread, as a finished future."""
    f: Future[Any] = Future()
    try:
        f.set_result(fn(*args))
    except Exception as e:
        f.set_exception(e)
    return f
