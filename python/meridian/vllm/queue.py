"""The waiting queue Meridian installs in place of vLLM's.

It holds vLLM ``Request`` objects in the order the core decided (preempted first, then by aged
class rank and slack) and gates how many of them vLLM's waiting loop may admit in one step (the
admission count under the answer KV reserve). Invariant: it contains exactly the requests vLLM put
into it, each once; ``len()`` always counts all of them, while truthiness turns false once the
step's admissions reach the allowance, which is the only thing vLLM's waiting loop asks it. An
admission is a popped request that vLLM moved to ``running`` or gave KV blocks for a remote load;
a request the loop pops only to skip it (grammar not compiled, remote KV not arrived, no room for
its encoder inputs: ``skip_request()`` on 0.32 and 0.33) spends nothing, so a blocked head never
stops the requests behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from meridian.vllm._version import require_supported_vllm

require_supported_vllm()

from vllm.v1.core.sched.request_queue import RequestQueue  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.request import Request

# The states a popped request is in once the waiting loop admitted it: scheduled, or holding the
# blocks an asynchronous KV load writes into. Everything else it pops is a skip.
_ADMITTED_STATUSES = frozenset({RequestStatus.RUNNING, RequestStatus.WAITING_FOR_REMOTE_KVS})


class MeridianWaitingQueue(RequestQueue):
    """A deque in Meridian's order, with a per-step admission allowance.

    Front: the next request to admit. ``prepend_request`` (used by vLLM for preempted and skipped
    requests) puts a request at the front; the next plan re-sorts anyway. Between plans the
    allowance is unlimited, so vLLM's own code paths outside ``schedule()`` behave as with FCFS.
    """

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._items: deque[Request] = deque(requests)
        self._allowance: int | None = None
        #: The requests the waiting loop popped since the plan, each with its status when the loop
        #: looked at it (its last peek: vLLM marks a request it starts a remote KV load for
        #: before it pops it to set it aside).
        self._popped: list[tuple[Request, RequestStatus]] = []
        self._peeked: tuple[Request, RequestStatus] | None = None
        #: Of ``_popped``, how many are counted so far and how many of those were admitted.
        self._num_counted = 0
        self._num_admitted = 0

    def apply_plan(self, order: list[int], num_admissible: int) -> None:
        """Reorders by ``order`` (a permutation of the current positions) and opens the gate."""
        items = self._items
        self._items = deque(items[i] for i in order)
        self._allowance = num_admissible
        self._popped = []
        self._peeked = None
        self._num_counted = self._num_admitted = 0

    def defer(self, requests: list[Request], position: int) -> None:
        """Moves ``requests`` (already in the queue) to ``position``, in their order: requests the
        plan preempted on arrival go right after the ones it admits this step."""
        moved = set(map(id, requests))
        kept = [r for r in self._items if id(r) not in moved]
        position = min(position, len(kept))
        self._items = deque([*kept[:position], *requests, *kept[position:]])

    def close_gate(self) -> None:
        """Lifts the allowance after the step (vLLM code outside ``schedule()`` sees plain FCFS)."""
        self._allowance = None
        self._popped = []
        self._peeked = None
        self._num_counted = self._num_admitted = 0

    def num_admitted(self) -> int:
        """Requests the waiting loop admitted since the plan opened the gate: popped ones it moved
        into an admitted state (one popped while waiting for remote KV and skipped again, still
        waiting, is no new admission). A popped request's fate is settled by the time the loop
        asks again, so each is counted once (the loop asks once per request it looks at: linear,
        not quadratic, in the step's admissions)."""
        for request, popped_as in self._popped[self._num_counted :]:
            self._num_admitted += request.status in _ADMITTED_STATUSES and request.status != popped_as
        self._num_counted = len(self._popped)
        return self._num_admitted

    def remote_loads_started(self) -> list[Request]:
        """Requests the waiting loop gave blocks for a remote KV load since the plan."""
        status = RequestStatus.WAITING_FOR_REMOTE_KVS
        return [request for request, popped_as in self._popped if request.status == status != popped_as]

    def add_request(self, request: Request) -> None:
        self._items.append(request)

    def pop_request(self) -> Request:
        request = self._items.popleft()
        if self._allowance is not None:
            peeked, self._peeked = self._peeked, None
            looked_at = peeked[1] if peeked is not None and peeked[0] is request else request.status
            self._popped.append((request, looked_at))
        return request

    def peek_request(self) -> Request:
        if not self._items:
            raise IndexError("peek from an empty queue")
        request = self._items[0]
        if self._allowance is not None:
            self._peeked = (request, request.status)
        return request

    def prepend_request(self, request: Request) -> None:
        self._items.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        # vLLM passes skipped requests in reverse pop order (its FCFS queue's extendleft reverses
        # them back); extendleft here restores the original order the same way.
        self._items.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self._items.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = set(requests)
        self._items = deque(r for r in self._items if r not in to_remove)

    def __bool__(self) -> bool:
        return bool(self._items) and (self._allowance is None or self.num_admitted() < self._allowance)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)
