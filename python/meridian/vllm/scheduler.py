"""``MeridianScheduler``: vLLM's own ``AsyncScheduler``, steered by the Meridian core.

Selected with ``--scheduler-cls meridian.vllm.MeridianScheduler``. Before each
``super().schedule()`` it hands the core the handles of ``running`` and ``waiting`` and applies
the plan: the order of ``running`` (budget goes to the front; under FCFS the victim is
``running[-1]``), the order and admission gate of the waiting queue, the step's token budget and
the KV tier lookups it wants ahead of time (prefetch). After ``update_from_output`` it reports
tokens, preemptions and step times, and hands the core's prefix index the block pool's KV cache
events (and each new request's prompt block hashes). When a reasoning request finishes it evicts
the blocks the core reports as never reusable before vLLM frees the rest. Everything vLLM does itself (chunked prefill, prefix caching, spec decode, structured
output, KV connectors) keeps working. Invariant: every request vLLM holds is either tracked by the
core (its handle stored on the request) or pending rejection; the shim decides nothing itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from meridian.vllm._version import require_supported_vllm

require_supported_vllm()

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.request_queue import SchedulingPolicy  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from meridian._core import FinishedRequest, Meridian, Shed  # noqa: E402
from meridian.errors import MeridianError  # noqa: E402
from meridian.vllm import convert  # noqa: E402
from meridian.vllm.arrival import ArrivalPublisher  # noqa: E402
from meridian.vllm.bus import SchedulerEndpoint  # noqa: E402
from meridian.vllm.config import processor_configured, read_settings  # noqa: E402
from meridian.vllm.knobs import check_scheduler_config  # noqa: E402
from meridian.vllm.kvtier import TierHooks  # noqa: E402
from meridian.vllm.metrics import MeridianMetrics, metrics_dir, served_model_name  # noqa: E402
from meridian.vllm.names import REQ_ID_ARG, RESOLVED_CLASS_ARG  # noqa: E402
from meridian.vllm.probes import ProbeBook  # noqa: E402
from meridian.vllm.queue import MeridianWaitingQueue, WaitingQueues  # noqa: E402

if TYPE_CHECKING:
    from vllm.v1.core.sched.interface import PauseState
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

logger = logging.getLogger("meridian")

#: Attribute holding the core handle on a vLLM ``Request`` (a plain class without slots).
HANDLE_ATTR = "meridian_handle"
#: Attribute holding the core's step id on a ``SchedulerOutput``.
STEP_ATTR = "meridian_step_id"
#: Attribute holding the batch shape on a ``SchedulerOutput``.
SHAPE_ATTR = "meridian_step_shape"
#: Attribute holding Meridian's own share of ``schedule()`` (ms) on a ``SchedulerOutput``.
COST_ATTR = "meridian_schedule_ms"
#: Attribute holding what the plan judged with, for the step log, on a ``SchedulerOutput``.
PLAN_NOTE_ATTR = "meridian_plan_note"
#: Finished-request reports kept for inspection (tests, the demo, operators' debugging).
MAX_REPORTS = 10_000


def _handles(requests: Iterable[Request]) -> list[int]:
    """The core handles of the requests that have one."""
    return [h for r in requests if (h := getattr(r, HANDLE_ATTR, None)) is not None]


def _closing_tokens(request: Request) -> list[int]:
    """The tokens a shed request's final output carries: none once it has streamed output, else its
    end-of-sequence token — vLLM's OpenAI stream drops a final chunk that carries no token at all
    (it takes it for a prompt chunk's), which would end the stream without the finish reason and
    the notice; the end-of-sequence token decodes to no text."""
    eos = request.sampling_params.eos_token_id if request.sampling_params is not None else None
    return [eos] if eos is not None and not request.output_token_ids else []


def _wall_clock_ms() -> float:
    # vLLM stamps `Request.arrival_time` with time.time() in the frontend; the same clock keeps
    # TTFT honest about frontend queueing.
    return time.time() * 1000.0


class CoreRestorePolicy:
    """The core's restore-or-recompute choice for the connector's tier, in vLLM's terms; what the
    tier holds — of each request, and which blocks for the prefix index — reaches the core once
    per step (``flush``)."""

    def __init__(self, core: Meridian, requests: dict[str, Request]) -> None:
        self._core = core
        self._requests = requests
        self._tier = core.add_kv_tier(TierHooks.TIER_NAME)
        self._stored: dict[str, int] = {}
        self._block_events = convert.BlockEvents() if core.wants_block_events() else None

    @property
    def retains_live_blocks(self) -> bool:
        return self._core.retains_live_tier_blocks()

    def restore_tokens(self, request: Request, num_hit_tokens: int) -> int:
        handle = getattr(request, HANDLE_ATTR, None)
        if handle is None:
            return num_hit_tokens  # a request pending rejection: it is never scheduled
        return self._core.plan_restore(handle, [self._tier], [num_hit_tokens]).num_restore_tokens

    def on_kv_allocated(self, request: Request, num_external_tokens: int) -> None:
        handle = getattr(request, HANDLE_ATTR, None)
        if handle is not None:
            self._core.on_kv_allocated(handle, num_external_tokens)

    def on_kv_loaded(self, num_tokens: float, duration_s: float) -> None:
        self._core.on_kv_load(self._tier, round(num_tokens), duration_s * 1000.0)

    def on_kv_stored(self, req_id: str, num_tokens: int) -> None:
        self._stored[req_id] = num_tokens

    def on_tier_blocks(self, stored_hashes: list[bytes], removed_hashes: list[bytes]) -> None:
        if self._block_events is not None:
            self._block_events.removed(removed_hashes)
            self._block_events.stored(stored_hashes)

    def on_tier_cleared(self) -> None:
        if self._block_events is not None:
            self._block_events.cleared()

    def flush(self) -> None:
        """Hands the core what the tier came to hold since the last step."""
        if self._block_events:
            ops, hashes = self._block_events.take()
            self._core.on_block_events(self._tier, ops, hashes, convert.HASH_KEY_BYTES)
        if not self._stored:
            return
        handles, counts = [], []
        for req_id, num_tokens in self._stored.items():
            handle = getattr(self._requests.get(req_id), HANDLE_ATTR, None)
            if handle is not None:  # gone, or pending rejection: nothing to tell
                handles.append(handle)
                counts.append(num_tokens)
        self._stored.clear()
        if handles:
            self._core.on_kv_stored_batch(self._tier, handles, counts)


class MeridianScheduler(AsyncScheduler):
    """vLLM's ``AsyncScheduler`` with Meridian's phase- and SLO-aware policy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_scheduler_config(self.scheduler_config)
        settings = read_settings(self.vllm_config)
        config, markers = settings.config, settings.markers
        self.meridian_config = config
        self.meridian = Meridian(
            config,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_scheduled_tokens,
            # The requests vLLM admits into running: `--max-num-active-seqs` where it is lower.
            max_num_seqs=self.max_num_active_reqs,
            reasoning_start_ids=markers.start,
            reasoning_end_ids=markers.end,
            tool_call_ids=markers.tool_calls,
            max_num_inflight_kv_loads=getattr(self.scheduler_config, "max_num_inflight_kv_loads", None),
        )
        #: Clock in milliseconds; the replay and the tests install a virtual one.
        self.clock_ms: Callable[[], float] = _wall_clock_ms
        #: Reports of finished requests, newest last.
        self.finished_reports: deque[FinishedRequest] = deque(maxlen=MAX_REPORTS)
        #: KV blocks dropped from the prefix cache as never reusable.
        self.num_reasoning_blocks_evicted = 0
        #: Requests ended by the scheduler itself (rejected arguments, shed), with the finish
        #: reason, stop reason and tokens their output carries, until the next output goes out.
        self._ended: list[tuple[Request, FinishReason, str | None, list[int]]] = []
        rank = self.vllm_config.parallel_config.data_parallel_index
        # Before the log is opened for this run: its earlier lines are what the restart learns.
        learnt = convert.warm_start(self.meridian, config, rank)
        if learnt is not None:
            logger.info("meridian: warm start from %s: %d finished requests learnt, %d lines skipped", *learnt)
        self._request_log = convert.open_log(config.request_log_path, "request_log_path", rank)
        self._step_log = convert.open_log(config.step_log_path, "step_log_path", rank)
        #: Internal EAT probes (their outputs never reach a client).
        self.probes = ProbeBook(markers.end)
        #: The channel to MeridianThinkingProcessor; none (and nothing polled per step) without it.
        self._bus = SchedulerEndpoint() if processor_configured(self.vllm_config) else None
        self.meridian.set_thinking_worker(self._bus is not None)
        #: Without the processor (vLLM's Model Runner V2 loads no V1 logits processor), vLLM's own
        #: per-request thinking budget carries each request's hard, effort and load-aware budget:
        #: it runs on both model runners wherever vLLM knows the reasoning markers.
        self._sets_vllm_thinking_budget = self._bus is None and bool(markers.end)
        #: The queue the API server reads (``MeridianFrontend``): for admission at arrival, and for
        #: the load it reports to a router (``GET /get_load``) under any configuration.
        self._arrival = ArrivalPublisher()
        self._install_queues()
        #: Meridian's eviction order on an OffloadingConnector's tier, when one is configured.
        tier_policy = None if self.connector is None else CoreRestorePolicy(self.meridian, self.requests)
        self.kv_tier = (
            None if tier_policy is None else TierHooks.install(self.connector, tier_policy, self.kv_cache_config)
        )
        self._tier_policy = tier_policy if self.kv_tier is not None else None
        if self.kv_tier is not None and self.kv_tier.staged:
            self.meridian.add_kv_tier(TierHooks.TIER_NAME, staged=True)
        #: The device cache's block events for the core's prefix index, when it wants them.
        self._device_events = self._tee_device_events()
        #: Meridian's series on the server's /metrics (when vLLM logs stats and the configuration
        #: does not turn them off).
        self.metrics = (
            MeridianMetrics(
                metrics_dir(self.vllm_config),
                served_model_name(self.vllm_config),
                rank,
                {name: _numeric(config.class_targets(name)) for name in config.class_names},
            )
            if self.log_stats and config.metrics
            else None
        )
        self._metrics_failed = False
        # Written once now, so a server that has served nothing yet exports its idle gauges:
        # Prometheus' multiprocess collector leaves out a gauge never set, and a dashboard would
        # read "no data" where the queue is empty.
        self._refresh_metrics()
        if not markers.end:
            logger.info("meridian: no --reasoning-parser; every request is scheduled as answering")

    def queued_requests(self) -> list[Request]:
        """Every request vLLM holds outside ``running``: the waiting queue, 0.34's async KV-load
        queue, and the requests holding blocks for a KV load (the core's "waiting")."""
        return [*self._waiting_queues.requests(), *self.kv_holding_waiting]

    def engine_load(self) -> tuple[dict[str, dict[str, int | float | None]], float]:
        """The core's ``engine_load`` over vLLM's running and waiting lists now: per class, the
        requests in each state, least slack and TTFAT headroom, expected remaining output; and the
        phase-weighted queue. What /metrics publishes and a data-parallel balancer reads."""
        return self.meridian.engine_load(
            self.clock_ms(),
            _handles(self.running),
            _handles(self.queued_requests()),
        )

    @property
    def _meridian_waiting(self) -> MeridianWaitingQueue:
        # `_install_queues` put Meridian's queue in vLLM's `waiting` attribute, typed as vLLM's.
        return cast(MeridianWaitingQueue, self.waiting)

    @property
    def _waiting_queues(self) -> WaitingQueues:
        async_kv = getattr(self, "async_kv_waiting", None)
        return WaitingQueues(
            self._meridian_waiting, cast(MeridianWaitingQueue, async_kv) if async_kv is not None else None
        )

    def _next_waiting_queue(self, take_async_kv: bool) -> MeridianWaitingQueue:
        # vLLM 0.34 picks between its waiting queue and its async KV-load queue by their heads'
        # arrival: under Meridian, by the plan's order over both.
        return self._waiting_queues.next_queue(take_async_kv)

    def _num_inflight_kv_loads(self) -> int:
        """What vLLM 0.34 counts against ``--max-num-inflight-kv-loads`` (``_admits_inflight_kv_load``)."""
        # 0.34's attributes, read by name: the venv's vLLM (0.32) types neither.
        counts: dict[str, int] = self._kv_fetch_counts or {}
        aborted: set[str] = getattr(self, "_aborted_kv_loads", set())
        return counts.get("in_progress", 0) + counts.get("completed_waiting", 0) + len(aborted)

    # ---- vLLM interface -----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests or request.abort_immediately:
            # A streaming-input continuation of a session the core already tracks, or vLLM's own
            # clean-up request (added pre-aborted so a failed hand-off's connector frees the KV
            # the other side holds): no client's request, in no count or log.
            super().add_request(request)
            return
        try:
            convert.check_request_args(
                convert.extra_args(request), self.meridian_config, request.max_tokens, request.priority
            )
            handle, slo_class = self.meridian.add_request(
                request.request_id,
                request.arrival_time * 1000.0,
                convert.prompt_token_ids(request),
                request.max_tokens,
                convert.requested_class(request),
                request.priority,
                convert.waited_ms(request),
            )
        except (MeridianError, OverflowError, TypeError, ValueError) as exc:
            # Per-request input never takes the engine down: the request alone fails.
            self._reject(request, str(exc))
            return
        setattr(request, HANDLE_ATTR, handle)
        handoff = convert.kv_handoff(request)
        if handoff is not None:
            self.meridian.set_kv_handoff(handle, handoff)
        if self._sets_vllm_thinking_budget:
            self._set_vllm_thinking_budget(request, handle, slo_class)
        if self._device_events is not None and request.block_hashes:
            self.meridian.set_block_hashes(
                handle, convert.block_hash_keys(request.block_hashes), convert.HASH_KEY_BYTES
            )
        self._stamp_worker_args(request, slo_class)
        super().add_request(request)
        # No step follows an arrival while vLLM is paused (`/pause?mode=keep`, a weight update):
        # the gauges are written here, or they would not show the queue that builds meanwhile.
        self._refresh_metrics()

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        started = time.perf_counter()
        self._take_thinking_stops()
        self._add_probes()
        if self._tier_policy is not None:
            self._tier_policy.flush()
        queues = self._waiting_queues
        waiting = queues.requests()
        plan = self.meridian.plan_step(
            self.clock_ms(),
            [getattr(r, HANDLE_ATTR) for r in self.running],
            [getattr(r, HANDLE_ATTR) for r in waiting],
            self.kv_cache_manager.block_pool.get_num_free_blocks(),
            num_async_waiting=queues.num_async,
            num_inflight_kv_loads=self._num_inflight_kv_loads() if queues.num_async else 0,
        )
        running = self.running
        held = [running[i] for i in plan.held]
        victims = [running[i] for i in plan.preempt]
        shed = self._shed_requests(plan.shed, running, waiting)
        set_aside = {id(r) for r in held} | {id(r) for r in victims} | {id(r) for r, _ in shed}
        # Held requests sit the step out: vLLM only schedules (and only preempts) what is in
        # `running`, so they keep their KV and rejoin at the back right after.
        self.running = [r for i in plan.running_order if id(r := running[i]) not in set_aside]
        if plan.prefetch and self.kv_tier is not None:
            ready = self.kv_tier.prefetch(waiting[i] for i in plan.prefetch)
            self.meridian.on_prefetched([getattr(r, HANDLE_ATTR) for r in ready])
        num_plain_admissible = queues.apply_plan(plan.waiting_order, plan.num_admissible)
        self._end_shed(shed)
        self._preempt_on_arrival(victims, num_plain_admissible)
        self.max_num_scheduled_tokens = plan.token_budget
        handed_over = time.perf_counter()
        try:
            output = super().schedule(throttle_prefills)
            self._record_remote_loads_started()
        finally:
            queues.close_gate()
            self.running.extend(held)
        returned = time.perf_counter()
        setattr(output, STEP_ATTR, plan.step_id)
        setattr(output, SHAPE_ATTR, convert.step_shape(output, self.requests))
        if output.preempted_req_ids:
            self._record_preemptions(output.preempted_req_ids)
        if self._step_log is not None:
            # Meridian's own share of the call, vLLM's scheduling left out: what the step log reports.
            setattr(output, COST_ATTR, (handed_over - started + time.perf_counter() - returned) * 1000.0)
            note = {
                "decode_step_ms": round(self.meridian.planned_decode_step_ms(), 4),
                "num_shed": len(shed),
                "num_running": len(running),
                "num_waiting": len(waiting),
            }
            setattr(output, PLAN_NOTE_ATTR, note)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        kv_output = model_runner_output.kv_connector_output
        if kv_output is not None and kv_output.invalid_block_ids:
            self._record_load_failures(kv_output.invalid_block_ids)
        if kv_output is not None and kv_output.finished_recving:
            self._record_remote_loads_received(kv_output.finished_recving)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        started = time.perf_counter()
        now_ms = self.clock_ms()
        step_id = getattr(scheduler_output, STEP_ATTR, None)
        shape = getattr(scheduler_output, SHAPE_ATTR, None)
        step_ms = predicted_ms = None
        if step_id is not None and shape is not None:
            if self._step_log is not None:
                predicted_ms = self.meridian.predict_step_ms(
                    shape["num_prefill_tokens"], shape["num_decode_requests"], shape["num_context_tokens"]
                )
            step_ms = self.meridian.on_step_output(
                now_ms, step_id, shape["num_prefill_tokens"], shape["num_decode_requests"], shape["num_context_tokens"]
            )
        self._record_tokens(now_ms, outputs.values())
        self._emit_ended(outputs)
        self.probes.drop_outputs(outputs, self.meridian.num_live_probes() > 0, self._is_live_probe)
        if self._bus is not None:
            self._bus.publish(self.meridian.recent_ttfat_attainment(), self.thinking_endings)
        self._publish_arrival(now_ms)
        if self._step_log is not None and shape is not None:
            meridian_ms = getattr(scheduler_output, COST_ATTR, 0.0) + (time.perf_counter() - started) * 1000.0
            note = {
                "t_ms": round(now_ms, 3),
                "predicted_ms": predicted_ms and round(predicted_ms, 4),
                **getattr(scheduler_output, PLAN_NOTE_ATTR, {}),
            }
            self._log_step(shape, step_ms, meridian_ms, note)
        self._refresh_metrics()
        return outputs

    def finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        # An abort can empty the engine between steps: the gauges must still read zero then.
        finished = super().finish_requests(*args, **kwargs)
        self._refresh_metrics()
        self._publish_arrival(self.clock_ms())
        return finished

    def set_pause_state(self, pause_state: PauseState) -> None:
        # A paused engine takes no step that would refresh the gauges: they are written now, so
        # while it is paused they show exactly the requests it holds.
        super().set_pause_state(pause_state)
        self._refresh_metrics()

    def has_requests(self) -> bool:
        return bool(self._ended) or super().has_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self._ended) + super().get_num_unfinished_requests()

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # Every finish path (stop, length, abort, error) goes through here before vLLM returns
        # the blocks to the pool: the last chance to drop never-reusable hashes first.
        handle = getattr(request, HANDLE_ATTR, None)
        if handle is not None:
            delattr(request, HANDLE_ATTR)
            self._finish_in_core(request, handle)
        return super()._free_request(request, *args, **kwargs)

    # ---- translation steps ----------------------------------------------------------------

    def _tee_device_events(self) -> convert.BlockEvents | None:
        """Has vLLM's block pool record its KV cache events (``BlockStored``/``BlockRemoved``, as
        for ``--kv-events-config``) and passes them to the core's prefix index each step; the
        operator's own KV event publishing sees them exactly as before (none, when it is off)."""
        if not (self.cache_config.enable_prefix_caching and self.meridian.wants_block_events()):
            return None
        manager, events = self.kv_cache_manager, convert.BlockEvents()
        publishing = manager.block_pool.enable_kv_cache_events
        manager.block_pool.enable_kv_cache_events = True
        take_events = manager.take_events

        def teeing_take_events() -> list[Any]:
            taken = take_events()
            convert.device_block_events(taken, events)
            if events:
                ops, hashes = events.take()
                self.meridian.on_block_events(None, ops, hashes, convert.HASH_KEY_BYTES)
            return taken if publishing else []

        manager.take_events = teeing_take_events  # type: ignore[method-assign]
        return events

    def _install_queues(self) -> None:
        # The core orders everything and its victim is running[-1]; vLLM's priority heap and
        # priority victim rule would override both, so the engine runs FCFS underneath.
        if self.policy != SchedulingPolicy.FCFS:
            logger.info("meridian: vLLM priorities map onto SLO classes; running vLLM's queues as FCFS")
        self.policy = SchedulingPolicy.FCFS
        self.waiting = MeridianWaitingQueue(self.waiting)
        holding = list(self.kv_holding_waiting)
        self.kv_holding_waiting = MeridianWaitingQueue(holding)
        async_kv = getattr(self, "async_kv_waiting", None)  # vLLM 0.34
        if async_kv is not None:
            self.async_kv_waiting = MeridianWaitingQueue(list(async_kv))

    def _shed_requests(
        self, decisions: list[Shed], running: list[Request], waiting: list[Request]
    ) -> list[tuple[Request, Shed]]:
        """The requests the plan ends early, read off the lists its indices refer to (before
        either list is reordered)."""
        return [(running[d.index] if d.running else waiting[d.index], d) for d in decisions]

    def _end_shed(self, shed: list[tuple[Request, Shed]]) -> None:
        # vLLM's own abort path (out of its queues, blocks freed, in-flight output dropped),
        # then an output with the core's message, so the client learns why at once.
        if not shed:
            return
        self.finish_requests([r.request_id for r, _ in shed], RequestStatus.FINISHED_ABORTED)
        for request, decision in shed:
            logger.info("meridian: %s", decision.message)
            self._ended.append((request, FinishReason.ABORT, decision.message, _closing_tokens(request)))

    def _preempt_on_arrival(self, victims: list[Request], num_admissible: int) -> None:
        # vLLM's own preemption path (blocks freed, in-flight output marked stale, the id
        # reported in this step's `preempted_req_ids`), then the victims queue right behind the
        # requests they made room for.
        if not victims:
            return
        timestamp = time.monotonic()
        # On a prefill instance (a connector that hands KV off, vLLM's `requires_kv_delivery`)
        # a victim's in-flight output is dropped, as vLLM's own preemptions drop it — delivered, it
        # would finish the request and hand off the blocks this preemption frees. On a decode
        # instance with overlapping batches vLLM fences the free behind the step in flight, so the
        # blocks come back (and the request they were freed for is admitted) one step later.
        for request in victims:
            self._preempt_request(request, timestamp, drop_stale_output=self.requires_kv_delivery)
        self._meridian_waiting.defer(victims, num_admissible)

    def _record_preemptions(self, req_ids: Iterable[str]) -> None:
        now_ms = self.clock_ms()
        for req_id in req_ids:
            request = self.requests.get(req_id)
            handle = getattr(request, HANDLE_ATTR, None) if request is not None else None
            if handle is None:
                continue
            _phase, alarm = self.meridian.on_preempted(now_ms, handle)
            if alarm:
                logger.warning("meridian: answering request %s preempted while a thinking request ran", req_id)

    def _record_load_failures(self, invalid_block_ids: set[int]) -> None:
        # vLLM truncates each affected request at its first failed block (before its blocks
        # change hands in super().update_from_output); the core learns which requests they were.
        for request in [*self.kv_holding_waiting, *self.running]:
            handle = getattr(request, HANDLE_ATTR, None)
            if handle is None:
                continue
            failed = sum(
                len(invalid_block_ids.intersection(group))
                for group in self.kv_cache_manager.get_block_ids(request.request_id)
            )
            if failed:
                self.meridian.on_kv_load_failure(handle, failed)

    def _record_remote_loads_started(self) -> None:
        started = self._waiting_queues.remote_loads_started()
        if not started:
            return
        now_ms = self.clock_ms()
        for request in started:
            handle = getattr(request, HANDLE_ATTR, None)
            if handle is not None:
                self.meridian.on_remote_kv_started(now_ms, handle)

    def _record_remote_loads_received(self, req_ids: Iterable[str]) -> None:
        now_ms = self.clock_ms()
        for req_id in req_ids:
            request = self.requests.get(req_id)
            handle = getattr(request, HANDLE_ATTR, None) if request is not None else None
            if handle is not None:
                self.meridian.on_remote_kv_received(now_ms, handle)

    def _record_tokens(self, now_ms: float, batches: Iterable[EngineCoreOutputs]) -> None:
        handles: list[int] = []
        counts: list[int] = []
        flat: list[int] = []
        for batch in batches:
            for out in batch.outputs:
                request = self.requests.get(out.request_id)
                handle = getattr(request, HANDLE_ATTR, None) if request is not None else None
                if handle is None or not out.new_token_ids:
                    continue  # finished (already reported in _free_request) or nothing new
                handles.append(handle)
                counts.append(len(out.new_token_ids))
                flat.extend(out.new_token_ids)
        if handles:
            self.meridian.on_tokens_batch(now_ms, handles, counts, flat)

    @property
    def thinking_endings(self) -> frozenset[str]:
        """Requests whose thinking a plan ended to answer in time (``degrade``), until they
        finish (the core's list): what the thinking worker reads (the processor over the bus;
        the replay's scripted model directly)."""
        return frozenset(self.meridian.thinking_endings())

    def _is_live_probe(self, req_id: str) -> bool:
        request = self.requests.get(req_id)
        handle = getattr(request, HANDLE_ATTR, None) if request is not None else None
        return handle is not None and self.meridian.is_probe(handle)

    def attach_thinking_worker(self) -> None:
        """Something other than ``MeridianThinkingProcessor`` ends thinking for this scheduler (the
        replay's scripted model reads ``thinking_endings``): plans may end thinking to answer in
        time (``on_overload: degrade``)."""
        self.meridian.set_thinking_worker(True)

    def _finish_in_core(self, request: Request, handle: int) -> None:
        # A stop the processor reported during this step reaches the core before the finish does.
        self._take_thinking_stops()
        # The request's last tokens were appended inside super().update_from_output(), before
        # _record_tokens runs: the core takes the ones it has not seen with the finish.
        report = self.meridian.finish(
            self.clock_ms(), handle, convert.finish_reason(request), list(request.output_token_ids)
        )
        if report.unknown_finish_reason is not None:
            logger.warning(
                "meridian: request %s finished with vLLM reason %r, which Meridian does not know; counted as "
                "an error and not learned from",
                request.request_id,
                report.unknown_finish_reason,
            )
        if report.probe:
            self.probes.finished(request.request_id)
            return
        self.finished_reports.append(report)
        if self.metrics is not None:
            self.metrics.on_finished(report)
        if self._request_log is not None:
            self._request_log.write(convert.report_json(report) + "\n")
        if report.never_reusable_from_token is not None:
            self._evict_never_reusable(request, report.never_reusable_from_token)
            if self.kv_tier is not None:
                self.kv_tier.mark_never_reusable(request.request_id, report.never_reusable_from_token)

    def _set_vllm_thinking_budget(self, request: Request, handle: int, slo_class: str) -> None:
        """Sets ``thinking_token_budget`` to the budget the core gives the request at admission
        (the client's own budget, if tighter, stays)."""
        params = request.sampling_params
        if params is None:
            return
        try:
            control = self.meridian_config.request_thinking_control(
                slo_class, convert.request_args_json(params.extra_args) or "{}", request.max_tokens
            )
            budget = self.meridian.vllm_thinking_budget(handle, control, params.thinking_token_budget)
        except MeridianError:
            # check_request_args admitted these arguments; the request runs on with its own budget.
            logger.exception("meridian: no thinking budget for request %s", request.request_id)
            return
        if budget is not None:
            params.thinking_token_budget = budget

    def _stamp_worker_args(self, request: Request, slo_class: str) -> None:
        # The logits processor sees sampling params, not requests: it learns the request's id
        # (to pair EAT probes with it) and the class the core resolved (for the class's thinking
        # control) here.
        params = request.sampling_params
        if params is None:
            return
        extra = params.extra_args if params.extra_args is not None else {}
        extra[REQ_ID_ARG] = request.request_id
        extra[RESOLVED_CLASS_ARG] = slo_class
        params.extra_args = extra

    def _take_thinking_stops(self) -> None:
        if self._bus is None:
            return
        for req_id, reason, num_think_tokens in self._bus.take_stops():
            request = self.requests.get(req_id)
            handle = getattr(request, HANDLE_ATTR, None) if request is not None else None
            if handle is None:
                continue  # it finished before the report arrived: its log line is written
            try:
                self.meridian.on_thinking_stopped(handle, reason, num_think_tokens)
            except MeridianError as exc:
                logger.warning("meridian: a thinking-stop report for %s was not taken: %s", req_id, exc)

    def _add_probes(self) -> None:
        if self._bus is None:
            return
        for parent_id, num_output_tokens in self._bus.take_probes():
            parent = self.requests.get(parent_id)
            handle = getattr(parent, HANDLE_ATTR, None) if parent is not None else None
            if parent is None or handle is None or parent.is_finished():
                continue  # the parent finished first: the probe would measure nothing
            probe = self.probes.build(parent, num_output_tokens)
            probe_handle = self.meridian.add_probe(
                probe.request_id, probe.arrival_time * 1000.0, list(probe.prompt_token_ids or []), handle
            )
            setattr(probe, HANDLE_ATTR, probe_handle)
            super().add_request(probe)

    def _evict_never_reusable(self, request: Request, from_token: int) -> None:
        first_block = from_token // self.block_size
        block_ids: set[int] = set()
        for group in self.kv_cache_manager.get_block_ids(request.request_id):
            block_ids.update(group[first_block:])
        if block_ids:
            # Dropping the hashes now makes the block pool put these blocks at the front of the
            # free queue when they are freed: reused before any ordinary prefix-cache block.
            self.kv_cache_manager.evict_blocks(block_ids)
            self.num_reasoning_blocks_evicted += len(block_ids)

    def _refresh_metrics(self) -> None:
        if self.metrics is None or not self.metrics.due(idle=not self.has_requests()):
            return
        try:
            self.metrics.refresh(self.meridian, self.engine_load())
        except (MeridianError, OSError) as exc:
            # Publishing never takes the engine down: the series stay as they were.
            if not self._metrics_failed:
                logger.warning("meridian: could not refresh the /metrics series: %s", exc)
            self._metrics_failed = True

    def _publish_arrival(self, now_ms: float) -> None:
        # An engine that runs out of requests steps no more: its last snapshot must say so now.
        self._arrival.publish(
            lambda: self.meridian.arrival_snapshot(now_ms, _handles(self.running), _handles(self.queued_requests())),
            force=not self.has_requests(),
        )

    def _log_step(self, shape: dict[str, int], step_ms: float | None, meridian_ms: float, note: dict[str, Any]) -> None:
        # The core measured the step (from when it could start until its output); the log
        # records what the core folded into its step-time model, and what Meridian itself spent
        # on the step in schedule() and update_from_output() (vLLM's own work left out); then
        # what the model predicted for the step before it was folded in, and what the plan judged
        # deadlines with and shed (`note`): the model's error beside the decisions it drove.
        if self._step_log is not None and step_ms is not None:
            record = {**shape, "step_ms": round(step_ms, 4), "meridian_ms": round(meridian_ms, 4), **note}
            self._step_log.write(json.dumps(record) + "\n")

    def shutdown(self) -> None:
        if self._bus is not None:
            self._bus.close()
        self._arrival.close()
        for log in (self._request_log, self._step_log):
            if log is not None:
                log.close()
        self._request_log = self._step_log = None
        super().shutdown()

    def _reject(self, request: Request, message: str) -> None:
        logger.warning("meridian: rejecting request %s: %s", request.request_id, message)
        request.status = RequestStatus.FINISHED_ERROR
        self._ended.append((request, FinishReason.ERROR, None, []))

    def _emit_ended(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        ended, self._ended = self._ended, []
        for request, reason, stop_reason, token_ids in ended:
            final = EngineCoreOutput(
                request_id=request.request_id, new_token_ids=token_ids, finish_reason=reason, stop_reason=stop_reason
            )
            batch = outputs.get(request.client_index)
            if batch is None:
                outputs[request.client_index] = EngineCoreOutputs(outputs=[final])
            else:
                batch.outputs.append(final)


def _numeric(values: dict[str, float | int | str | None]) -> dict[str, float | int | None]:
    """A class's targets without its named settings (the metrics read only the targets)."""
    return {key: value for key, value in values.items() if not isinstance(value, str)}
