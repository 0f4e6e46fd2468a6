"""The waiting queue Meridian installs in place of vLLM's.

It holds vLLM ``Request`` objects in the order the core decided (preempted first, then by aged
class rank and slack) and gates how many of them vLLM's waiting loop may admit in one step (the
admission count under the answer KV reserve). Invariant: it contains exactly the requests vLLM put
into it, each once; ``len()`` always counts all of them, while truthiness turns false once the
step's admissions reach the allowance, which is the only thing vLLM's waiting loop asks it. An
admission is a popped request that vLLM moved to ``running`` or gave KV blocks for a remote load;
a request the loop pops only to skip it (grammar not compiled, remote KV not arrived, no room for
its encoder inputs: ``skip_request()`` on 0.32 to 0.34) spends nothing, so a blocked head never
stops the requests behind it. vLLM 0.34 keeps a second queue of waiting requests, the async KV-load
queue (``async_kv_waiting``, with ``--max-num-inflight-kv-loads``): ``WaitingQueues`` plans the two
as one list, the core's, and gives each queue its part of the order and of the step's admissions;
vLLM's loop takes whichever head the plan ranks first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
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
        #: Each request's place in the plan's order of every waiting queue (``WaitingQueues``).
        self._ranks: dict[int, int] = {}
        #: The requests the waiting loop popped since the plan, each with its status when the loop
        #: looked at it (its last peek: vLLM marks a request it starts a remote KV load for
        #: before it pops it to set it aside).
        self._popped: list[tuple[Request, RequestStatus]] = []
        self._peeked: tuple[Request, RequestStatus] | None = None
        #: Of ``_popped``, how many are counted so far and how many of those were admitted.
        self._num_counted = 0
        self._num_admitted = 0

    def apply_plan(self, order: Sequence[int], num_admissible: int, ranks: Sequence[int] = ()) -> None:
        """Reorders by ``order`` (a permutation of the current positions) and opens the gate;
        ``ranks``: each reordered request's place in the plan over every waiting queue."""
        items = self._items
        self._items = deque(items[i] for i in order)
        self._ranks = {id(r): rank for r, rank in zip(self._items, ranks)}
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

    def head_rank(self) -> float:
        """The plan's rank of the request at the front (infinite: none, or one the plan never saw)."""
        return self._ranks.get(id(self._items[0]), math.inf) if self._items else math.inf

    def close_gate(self) -> None:
        """Lifts the allowance after the step (vLLM code outside ``schedule()`` sees plain FCFS)."""
        self._allowance = None
        self._ranks = {}
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


class WaitingQueues:
    """vLLM's waiting queue and, on 0.34 with ``--max-num-inflight-kv-loads``, its async KV-load
    queue, as the one waiting list a plan orders: the plain requests first, the async queue's
    last (the core's ``num_async_waiting``). Applying a plan gives each queue its requests in the
    plan's order and, as its allowance, how many of them the plan admits."""

    def __init__(self, waiting: MeridianWaitingQueue, async_kv: MeridianWaitingQueue | None) -> None:
        self.waiting = waiting
        self.async_kv = async_kv

    def requests(self) -> list[Request]:
        """Every waiting request, in the order the plan's indices refer to."""
        # Not `or`: a queue's truthiness is its gate.
        return [*self.waiting, *(self.async_kv if self.async_kv is not None else ())]

    @property
    def num_async(self) -> int:
        return len(self.async_kv) if self.async_kv is not None else 0

    def apply_plan(self, order: Sequence[int], num_admissible: int) -> int:
        """Splits the plan's order over the two queues; returns the plain queue's allowance."""
        if self.async_kv is None:
            self.waiting.apply_plan(order, num_admissible, range(len(order)))
            return num_admissible
        num_plain = len(self.waiting)
        plain = [(rank, i) for rank, i in enumerate(order) if i < num_plain]
        loads = [(rank, i - num_plain) for rank, i in enumerate(order) if i >= num_plain]
        plain_admitted = sum(1 for i in order[:num_admissible] if i < num_plain)
        self.waiting.apply_plan([i for _, i in plain], plain_admitted, [rank for rank, _ in plain])
        self.async_kv.apply_plan([i for _, i in loads], num_admissible - plain_admitted, [rank for rank, _ in loads])
        return plain_admitted

    def next_queue(self, take_async_kv: bool) -> MeridianWaitingQueue:
        """vLLM 0.34's ``_next_waiting_queue`` under the plan: the queue whose head the plan ranks
        first (vLLM's own picks the older head); a queue whose gate is shut is passed over, as
        vLLM passes over an empty one."""
        if not take_async_kv or self.async_kv is None or not self.async_kv:
            return self.waiting
        if not self.waiting:
            return self.async_kv
        return self.async_kv if self.async_kv.head_rank() < self.waiting.head_rank() else self.waiting

    def remote_loads_started(self) -> list[Request]:
        loads = self.async_kv.remote_loads_started() if self.async_kv is not None else []
        return [*self.waiting.remote_loads_started(), *loads]

    def close_gate(self) -> None:
        self.waiting.close_gate()
        if self.async_kv is not None:
            self.async_kv.close_gate()
