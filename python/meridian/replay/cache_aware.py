"""vLLM 0.34's cache-aware admission as a replay baseline, on every vLLM the replay runs.

vLLM 0.34 added ``--cache-aware-admission-window N`` and ``--cache-aware-admission-threshold T``
(``SchedulerConfig.cache_aware_admission_window``, default 0: off; ``..._threshold``, default
0.5). With a window, ``Scheduler.schedule()`` calls ``_reorder_waiting_by_cached_prefix()`` after
the running loop and before the waiting loop — only when the running loop preempted nothing, the
scheduler is not ``PAUSED_ALL`` and prefills are not deferred (DP throttling, local prefill
cadence) — and ``__init__`` keeps the window only under the FCFS policy with prefix caching on.
The reorder: unless fewer than two requests wait or KV usage is below the threshold, the plain
waiting requests (status ``WAITING``, nothing computed) among the first N of the queue are put
deepest cached prefix first (``KVCacheManager.get_num_cached_tokens``, arrival order on a tie)
into the slots they held; every other request in the window keeps its exact position.

``cache_aware_scheduler(base, window, threshold)`` gives a subclass of ``base`` (vLLM's
``AsyncScheduler`` for the baseline, ``MeridianScheduler`` for the composition measurement) with
the window on:

- **vLLM 0.34 and later** (``native()``): vLLM's own code. The subclass sets the two
  ``SchedulerConfig`` fields before vLLM's ``__init__`` reads them, which is what
  ``--cache-aware-admission-*`` do through ``EngineArgs``; nothing of the reorder is Python here.
  (``MeridianScheduler`` refuses those fields at start-up; ``mode="after-init"`` sets the window
  on the scheduler after its ``__init__`` instead, as vLLM's ``__init__`` would have, to measure
  what vLLM's reorder does on top of Meridian's order.)
- **vLLM 0.32 and 0.33** (the replay's usual vLLM; the feature does not exist): a port of
  ``_reorder_waiting_by_cached_prefix`` (``_reorder_waiting_by_cached_prefix_port``, the same
  statements, with ``get_num_cached_tokens`` spelt out as 0.34 defines it: the coordinator's
  ``find_longest_cache_hit`` over the request's block hashes up to its last token, 0 where the
  manager's ``prefix_cache_lookup_enabled`` says no lookup). It is called where 0.34 calls it:
  the subclass arms itself at the top of vLLM's ``schedule()`` (innermost, right before vLLM's
  own ``AsyncScheduler.schedule``: under Meridian, after Meridian's plan has ordered the queue),
  and the waiting queue, whose class is swapped for one that reports being looked at, runs the
  reorder the first time vLLM's waiting loop asks whether it is empty (``__bool__``; its
  ``peek_request`` asks the same) — after the running loop's allocations, before the first
  admission, as in 0.34. A preemption in the running loop (``_preempt_request``) disarms it, as
  0.34 skips the reorder when ``preempted_reqs`` is non-empty; ``PAUSED_ALL`` and deferred
  prefills (computed from the same state 0.34's ``schedule()`` reads at its top) skip it too. A
  step whose waiting loop never looks at the queue (no token budget left after the running loop,
  or ``PAUSED_NEW``) reorders when vLLM's ``schedule()`` returns, where 0.34 would have reordered
  before its (then empty) waiting loop; nothing between the two points touches the block pool.

Differences from 0.34's placement that remain in the port, by construction:

1. **Requests holding KV blocks** (``kv_holding_waiting``: asynchronous KV loads of a connector,
   0.32's preempted block-holders) are drained before vLLM's waiting loop first looks at
   ``waiting``, so where that queue is non-empty at a step's start the port reorders after their
   admissions (their block allocations can change the KV usage and the cached prefixes it reads),
   0.34 before. The replay's engines without a KV connector never hold any there; the proof test
   (``tests/replay/test_cache_aware.py``) checks that the run it compares had none.
2. **0.34's asynchronous KV loads** (``async_kv_waiting``, ``--max-num-inflight-kv-loads``) and
   its local prefill cadence (``--prefill-schedule-interval``) do not exist on 0.32/0.33; on 0.34
   the port reads the cadence's state where present (``local_prefill_interval``), so it defers as
   0.34 does.
3. **Version drift around the call**: the port runs on 0.32's ``schedule()``, whose running and
   waiting loops are 0.32's own — the reorder is 0.34's, the scheduler around it is not.

``CacheAwareAdmission`` checks the two values as vLLM's ``SchedulerConfig`` does (window a whole
number ≥ 0, threshold in [0, 1]) and names a bad one.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

#: vLLM's default ``--cache-aware-admission-threshold``: the window engages only once the KV
#: cache is at least half used.
DEFAULT_THRESHOLD = 0.5


def check_window(window: object) -> int:
    """``window`` if it is a cache-aware admission window (a whole number of requests >= 0; 0:
    off, as vLLM's default), else a ``ValueError`` naming it."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(
            f"cache-aware admission window {window!r}: expected a whole number of waiting requests >= 0 "
            "(vLLM's --cache-aware-admission-window; 0 turns it off)"
        )
    return window


def check_threshold(threshold: object) -> float:
    """``threshold`` if it is a KV usage in [0, 1], else a ``ValueError`` naming it."""
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
        or not 0.0 <= threshold <= 1.0
    ):
        raise ValueError(
            f"cache-aware admission threshold {threshold!r}: expected a KV cache usage between 0 and 1 "
            "(vLLM's --cache-aware-admission-threshold; default 0.5)"
        )
    return float(threshold)


@dataclass(frozen=True)
class CacheAwareAdmission:
    """vLLM's two settings: the look-ahead window (waiting requests) and the KV usage threshold."""

    window: int
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        check_window(self.window)
        object.__setattr__(self, "threshold", check_threshold(self.threshold))


def native() -> bool:
    """Whether the installed vLLM has cache-aware admission itself (0.34 and later)."""
    from vllm.config import SchedulerConfig

    return "cache_aware_admission_window" in getattr(SchedulerConfig, "__dataclass_fields__", {})


#: How ``cache_aware_scheduler`` turns the window on (``auto``: ``fields`` where vLLM has it, else
#: ``port``).
MODES = ("auto", "fields", "after-init", "port")


def cache_aware_scheduler(
    base: type[Any], window: int, threshold: float = DEFAULT_THRESHOLD, *, mode: str = "auto"
) -> type[Any]:
    """``base`` (a subclass of vLLM's ``AsyncScheduler``, or it) with cache-aware admission at
    ``window`` and ``threshold``. ``mode``:

    - ``fields``: vLLM's own (0.34+), its two ``SchedulerConfig`` fields set before its
      ``__init__`` reads them — what the two flags do;
    - ``after-init``: vLLM's own reorder, the window set on the scheduler right after its
      ``__init__`` as that ``__init__`` sets it from the fields (FCFS and prefix caching, else 0)
      — for a ``base`` that refuses the fields at start-up (``MeridianScheduler`` does since
      ca47e20): what vLLM's reorder would do inside its ``schedule()`` if let through;
    - ``port``: the port (any version; see the module docs);
    - ``auto``: ``fields`` where vLLM has it, else ``port``."""
    if mode not in MODES:
        raise ValueError(f"cache-aware mode {mode!r}: expected one of {', '.join(MODES)}")
    settings = {"cache_aware_admission": CacheAwareAdmission(window, threshold)}
    if mode == "auto":
        mode = "fields" if native() else "port"
    if mode != "port" and not native():
        raise ValueError(f"mode {mode!r}: this vLLM has no cache-aware admission of its own (0.34+ has): use the port")
    if mode == "port":
        # Right before AsyncScheduler in the MRO: its schedule() runs right before vLLM's own.
        port = _port_class()
        bases = (port,) if base is _async_scheduler() else (base, port)
        return type(f"{base.__name__}CacheAwarePort", bases, settings)
    if mode == "fields":
        # First in the MRO: its __init__ sets the fields before vLLM's reads them.
        return type(f"{base.__name__}CacheAware", (_NativeFields, base), settings)
    return type(f"{base.__name__}CacheAwareAfterInit", (_NativeAfterInit, base), settings)


# ---- vLLM 0.34's own ------------------------------------------------------------------------------


class _NativeFields:
    """Sets ``SchedulerConfig.cache_aware_admission_*`` before vLLM's ``Scheduler.__init__`` reads
    them (first in the MRO: its ``__init__`` runs first)."""

    cache_aware_admission: CacheAwareAdmission

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        scheduler_config = vllm_config.scheduler_config
        scheduler_config.cache_aware_admission_window = self.cache_aware_admission.window
        scheduler_config.cache_aware_admission_threshold = self.cache_aware_admission.threshold
        super().__init__(*args, **kwargs)


class _NativeAfterInit:
    """Sets the scheduler's ``cache_aware_window`` and ``cache_aware_threshold`` right after the
    whole ``__init__`` ran, as vLLM 0.34's ``Scheduler.__init__`` sets them from the fields: the
    window only under the FCFS policy the config names, with prefix caching on."""

    cache_aware_admission: CacheAwareAdmission

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        super().__init__(*args, **kwargs)
        from vllm.v1.core.sched.request_queue import SchedulingPolicy

        fcfs = SchedulingPolicy(vllm_config.scheduler_config.policy) == SchedulingPolicy.FCFS
        caching = vllm_config.cache_config.enable_prefix_caching
        self.cache_aware_window = self.cache_aware_admission.window if fcfs and caching else 0
        self.cache_aware_threshold = self.cache_aware_admission.threshold


# ---- the port: 0.34's reorder on 0.32 / 0.33 ----------------------------------------------------


def _looking_bool(self: Any) -> bool:
    """The swapped-in queue's ``__bool__``: the first time vLLM asks whether the queue is empty
    while its scheduler is armed, the scheduler reorders it (see the module docs); then the
    queue's own answer."""
    self._cache_aware_scheduler._cache_aware_looked_at()
    return bool(super(type(self), self).__bool__())  # the looking class is never subclassed


def _looking_queue_class(cls: type[Any]) -> type[Any]:
    """``cls`` (the waiting queue's class: vLLM's FCFS deque, Meridian's queue) with
    ``_looking_bool``: a direct subclass adding no slot, so the queue's class can be swapped in
    place (``__class__``), which needs the same layout."""
    looking = _LOOKING_CLASSES.get(cls)
    if looking is None:
        looking = type(f"Looking{cls.__name__}", (cls,), {"__slots__": (), "__bool__": _looking_bool})
        _LOOKING_CLASSES[cls] = looking
    return looking


#: Queue class → its looking subclass.
_LOOKING_CLASSES: dict[type[Any], type[Any]] = {}


def _async_scheduler() -> type[Any]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return AsyncScheduler


@functools.cache
def _port_class() -> type[Any]:
    """The port as a class: built on first use, so importing this module loads no vLLM (the
    layers' rule: outside ``meridian.vllm`` nothing imports vLLM when it is imported)."""

    class _CacheAwarePort(_async_scheduler()):  # type: ignore[misc]
        """vLLM's ``AsyncScheduler`` with 0.34's cache-aware reorder ported (see the module docs).
        Placed right before ``AsyncScheduler`` in a subclass's MRO, so its ``schedule()`` runs right
        before vLLM's own."""

        cache_aware_admission: CacheAwareAdmission

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            from vllm.v1.core.sched.request_queue import SchedulingPolicy

            # As 0.34's __init__: the window needs a prefix cache to consult, and a FCFS queue.
            settings = self.cache_aware_admission
            self._cache_aware_window_port = (
                settings.window
                if self.policy == SchedulingPolicy.FCFS and self.cache_config.enable_prefix_caching
                else 0
            )
            self._cache_aware_threshold_port = settings.threshold
            self._cache_aware_armed = False
            self._cache_aware_preempted = False
            #: Steps whose reorder moved a request, and steps it ran at ``schedule()``'s end (the
            #: waiting loop never looked at the queue).
            self.cache_aware_reorders = 0
            self.cache_aware_late_reorders = 0
            #: Steps that began with requests holding KV blocks waiting (difference 1 of the docs).
            self.cache_aware_kv_holding_steps = 0

        def schedule(self, throttle_prefills: bool = False) -> Any:
            from vllm.v1.core.sched.interface import PauseState

            if not self._cache_aware_window_port:
                return super().schedule(throttle_prefills)
            self._wrap_waiting_queue()
            if self.kv_holding_waiting:
                self.cache_aware_kv_holding_steps += 1
            self._cache_aware_preempted = False
            self._cache_aware_armed = not self._defers_prefills(throttle_prefills)
            try:
                output = super().schedule(throttle_prefills)
            except BaseException:
                self._cache_aware_armed = False
                raise
            if self._cache_aware_armed:
                # The waiting loop never looked at the queue: 0.34 reorders all the same.
                self._cache_aware_armed = False
                if not self._cache_aware_preempted and self._pause_state != PauseState.PAUSED_ALL:
                    self.cache_aware_late_reorders += 1
                    self._reorder_waiting_by_cached_prefix_port()
            return output

        def _preempt_request(self, *args: Any, **kwargs: Any) -> Any:
            # 0.34 reorders only when the running loop preempted nothing (`not preempted_reqs`).
            self._cache_aware_preempted = True
            return super()._preempt_request(*args, **kwargs)

        def _cache_aware_looked_at(self) -> None:
            from vllm.v1.core.sched.interface import PauseState

            if not self._cache_aware_armed:
                return
            self._cache_aware_armed = False
            if not self._cache_aware_preempted and self._pause_state != PauseState.PAUSED_ALL:
                self._reorder_waiting_by_cached_prefix_port()

        def _wrap_waiting_queue(self) -> None:
            queue = self.waiting
            if type(queue) in _LOOKING_CLASSES.values():
                return
            queue.__class__ = _looking_queue_class(type(queue))
            queue._cache_aware_scheduler = self

        def _defers_prefills(self, throttle_prefills: bool) -> bool:
            """0.34's ``defer_prefills`` at the top of ``schedule()``, from the same state: DP
            throttling, and 0.34's local prefill cadence where the scheduler has it."""
            decoding = any(not r.is_prefill_chunk for r in self.running)
            capacity_bound = getattr(self, "prefill_capacity_bound", False)
            if throttle_prefills and not capacity_bound and decoding:
                return True
            interval = getattr(self, "local_prefill_interval", 1)
            return bool(
                interval > 1
                and not capacity_bound
                and (self.num_executed_steps + 1) - self.last_prefill_step < interval
                and decoding
            )

        def _num_cached_tokens(self, request: Any) -> int:
            """0.34's ``KVCacheManager.get_num_cached_tokens``: a probe of the prefix cache that takes
            no references, allocates nothing and emits no events."""
            manager = self.kv_cache_manager
            if not manager.prefix_cache_lookup_enabled(request):
                return 0
            # Mirrors `get_computed_blocks`: the last token is always recomputed.
            _, num_computed_tokens, _ = manager.coordinator.find_longest_cache_hit(
                request.block_hashes, request.num_tokens - 1
            )
            return int(num_computed_tokens)

        def _reorder_waiting_by_cached_prefix_port(self) -> None:
            """vLLM 0.34's ``Scheduler._reorder_waiting_by_cached_prefix``, statement for statement:
            move waiting requests with a cached prefix to the front of the window, confined to the
            slots held by plain waiting requests."""
            from vllm.v1.request import RequestStatus

            if len(self.waiting) < 2:
                return
            if self.kv_cache_manager.usage < self._cache_aware_threshold_port:
                return

            head = list(itertools.islice(self.waiting, self._cache_aware_window_port))
            slots = [
                i
                for i, request in enumerate(head)
                if request.status == RequestStatus.WAITING and not request.num_computed_tokens
            ]
            if len(slots) < 2:
                return

            # Deepest cached prefix first, arrival order breaking ties.
            cached = {i: self._num_cached_tokens(head[i]) for i in slots}
            order = sorted(slots, key=lambda i: (-cached[i], i))
            if order == slots:
                return
            self.cache_aware_reorders += 1

            reordered = list(head)
            for slot, source in zip(slots, order):
                reordered[slot] = head[source]
            # One pass to drop the whole window, then re-insert in the new order.
            self.waiting.remove_requests(head)
            for request in reversed(reordered):
                self.waiting.prepend_request(request)

    return _CacheAwarePort


def __getattr__(name: str) -> Any:
    # ``NATIVE``: whether the installed vLLM has cache-aware admission itself, read when first
    # asked for, so importing this module loads no vLLM.
    if name == "NATIVE":
        return native()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
