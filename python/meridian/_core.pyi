"""Type stubs of the Rust extension ``meridian._core`` (hand-written; checked by mypy.stubtest)."""

from collections.abc import Sequence
from typing import Final, Literal, final

__all__ = [
    "__version__",
    "ARRIVAL_SNAPSHOT_FORMAT",
    "CLASS_ARG",
    "POLICY_NAMES",
    "SHED_MARKER",
    "SHED_REASONS",
    "KV_HANDOFFS",
    "THINKING_STOP_RULES",
    "THINKING_ARG",
    "THINKING_BUDGET_ARG",
    "WAITED_ARG",
    "EFFORT_ARG",
    "EFFORT_LEVELS",
    "ArrivalGate",
    "Config",
    "FinishedRequest",
    "Meridian",
    "RestorePlan",
    "Shed",
    "StepPlan",
    "ThinkingControl",
    "ThinkingStream",
    "check_request_args",
    "config_schema",
    "kernel_source",
    "parse_shed_notice",
]
__version__: str
#: Request argument (``vllm_xargs`` / ``SamplingParams.extra_args``) naming the SLO class.
CLASS_ARG: Final = "meridian_class"
#: Request argument replacing the class's thinking control (``"off"`` or a JSON object).
THINKING_ARG: Final = "meridian_thinking"
#: Request argument setting a hard thinking budget in tokens.
THINKING_BUDGET_ARG: Final = "meridian_thinking_budget_tokens"
#: Request argument: how long, in ms, the client already waited for this request elsewhere (a
#: retry after a shed); its class's targets count that time.
WAITED_ARG: Final = "meridian_waited_ms"
#: Request argument carrying the request's ``reasoning_effort`` (``MeridianFrontend`` copies the
#: OpenAI API's field into it): its level's thinking budget becomes the request's hard budget.
EFFORT_ARG: Final = "meridian_reasoning_effort"
#: The ``reasoning_effort`` levels that map onto a budget: ``("low", "medium", "high")``.
EFFORT_LEVELS: Final[tuple[str, ...]]
#: Every ``policy`` name, the product first: ``("meridian", "answer_first", "pascal", "uniboost", "scorpio")``.
POLICY_NAMES: Final[tuple[str, ...]]
THINKING_STOP_RULES: Final[tuple[str, ...]]
#: What every shed request's message (its stop reason) starts with.
SHED_MARKER: Final = "meridian:shed"
#: The targets a request is shed for: ``("ttft", "ttfat")``.
SHED_REASONS: Final[tuple[str, ...]]
#: A request's parts in a prefill/decode hand-off: ``("local", "sends", "receives")``.
KV_HANDOFFS: Final[tuple[str, ...]]

def parse_shed_notice(text: str) -> tuple[str, int] | None:
    """``(reason, retry_after_s)`` of a shed request's message (its stop reason), or ``None``
    when the text is not one."""

def config_schema() -> str:
    """The JSON Schema (draft 2020-12) of the ``meridian`` block of ``--additional-config``, derived
    by the core from the structs it parses: every accepted key, its type and its explanation."""

def kernel_source(name: str) -> str:
    """Source of a bundled CUDA kernel file by name."""

def check_request_args(args_json: str, config: Config | None, max_tokens: int | None = None, priority: int = 0) -> None:
    """Checks a request's Meridian arguments (the JSON object of its request arguments) against
    ``config`` (``None``: the class's type only) and, for ``meridian_reasoning_effort``'s answer
    room, the request's ``max_tokens`` and ``priority``; raises ``RequestArgsError`` naming the
    argument."""

@final
class Config:
    """Validated Meridian configuration."""

    @staticmethod
    def from_json(text: str) -> Config:
        """Parses and validates the ``meridian`` block of ``--additional-config``.

        Raises:
            ConfigError: an unknown key or a bad value; the message names the dotted key.
        """
    def to_json(self) -> str:
        """The configuration as the JSON block that parses back to it (every key given but those left
        unset: the log paths, ``e2e_ms``, ``predictor.prior_memory_requests``, and
        ``tool_call_markers`` when none was given); ``Config.from_json("{}").to_json()`` holds every
        default."""
    @property
    def class_names(self) -> list[str]: ...
    @property
    def default_class(self) -> str: ...
    @property
    def tool_call_markers(self) -> list[str]: ...
    @property
    def length_priors(self) -> tuple[list[int], list[int]]: ...
    @property
    def request_log_path(self) -> str | None: ...
    @property
    def step_log_path(self) -> str | None: ...
    @property
    def metrics(self) -> bool: ...
    @property
    def policy(self) -> Literal["meridian", "answer_first", "pascal", "uniboost", "scorpio"]: ...
    @property
    def warm_start(self) -> bool: ...
    @property
    def warm_start_path(self) -> str | None: ...
    @property
    def admits_at_arrival(self) -> bool:
        """Whether the API server refuses requests at arrival (the ``meridian`` policy,
        ``overload.admit_at_arrival`` and a class that sheds)."""
    @property
    def shed_status(self) -> int:
        """The HTTP status of a shed or a refusal at arrival (``overload.shed_status``: 429 or 503)."""
    def resolve_tool_call_markers(self, found: list[int | None]) -> list[int]:
        """The tool-call marker ids, given per configured marker (in order) its single token id in
        the model's vocabulary, or ``None`` when it is not one token.

        A configured marker that is not one token is an error; the default marker is dropped
        instead, so the result is then shorter than ``tool_call_markers``.

        Raises:
            ConfigError: an explicitly configured marker is not one token (names ``tool_call_markers[i]``).
            InvalidArgumentError: ``found`` does not hold one entry per configured marker.
        """
    def class_targets(self, name: str) -> dict[str, float | int | str | None]:
        """The class's targets (``ttft_ms``, ``ttfat_ms``, ``answer_tpot_ms``, ``e2e_ms``), ``rank`` and
        ``on_overload``."""
    def thinking_control(self, slo_class: str) -> ThinkingControl:
        """The thinking control a class runs under (its own, else the top-level one)."""
    def request_thinking_control(
        self, slo_class: str, args_json: str, max_tokens: int | None = None
    ) -> ThinkingControl:
        """One request's thinking control from its request arguments (the JSON object) under its
        ``max_tokens``; raises ``RequestArgsError`` naming the argument."""
    def thinking_stream_wanted(self, slo_class: str, control: ThinkingControl) -> bool:
        """Whether a request of the class under ``control`` needs its thinking followed token by
        token: a rule is on, or the class degrades under overload."""

#: The format tag of an engine's published queue (``Meridian.arrival_snapshot``).
ARRIVAL_SNAPSHOT_FORMAT: Final = "meridian-arrival/1"

@final
class ArrivalGate:
    """The API server's admission at arrival: refuses a request of a ``shed`` class whose wait for
    its first token, behind the queue the engines published and what the gate admitted since,
    would pass its TTFT target (times ``overload.arrival_wait_ttft_factor``)."""

    def __new__(cls, config: Config) -> ArrivalGate: ...
    def set_snapshots(self, texts: list[str]) -> None:
        """Replaces the engines' snapshots with these published texts.

        Raises:
            InvalidArgumentError: a text is not a snapshot (the previous ones stay).
        """
    def decide(
        self, now_ms: float, slo_class: str | None, priority: int, waited_ms: float = 0.0
    ) -> tuple[str, float | None, str | None, int | None]:
        """``(class, predicted wait ms or None, refusal message or None, retry-after s or None)``
        for a request arriving at ``now_ms`` (wall clock) whose client already waited
        ``waited_ms`` elsewhere; an admitted one queues for the next.

        Raises:
            UnknownSloClassError: ``slo_class`` is not configured.
            InvalidArgumentError: ``now_ms`` is not finite.
            RequestArgsError: ``waited_ms`` is not from 0 to a day.
        """
    @property
    def num_refused(self) -> int: ...
    @property
    def load_tokens(self) -> int:
        """The work ahead on the engines, in expected output tokens (the load a router reads)."""

@final
class RestorePlan:
    """The restore-or-recompute choice for one KV tier hit."""

    @property
    def num_restore_tokens(self) -> int:
        """Tokens of the hit to load (a prefix ending on a span boundary); the rest is recomputed."""
    @property
    def num_offered_tokens(self) -> int: ...
    @property
    def cost_ms(self) -> float:
        """Modelled cost of this plan (extra step, loads, recompute of the rest)."""
    @property
    def recompute_ms(self) -> float:
        """Modelled cost of recomputing the whole hit."""

@final
class StepPlan:
    """One engine step's decisions."""

    @property
    def step_id(self) -> int: ...
    @property
    def running_order(self) -> list[int]:
        """Permutation of the ``running`` list passed in; the last entry is the first victim."""
    @property
    def waiting_order(self) -> list[int]: ...
    @property
    def num_admissible(self) -> int: ...
    @property
    def token_budget(self) -> int: ...
    @property
    def num_reserved_blocks(self) -> int: ...
    @property
    def held(self) -> list[int]:
        """Indices into ``running`` that skip this step (paced answers), ascending."""
    @property
    def preempt(self) -> list[int]:
        """Indices into ``running`` to preempt before vLLM schedules (preemption on arrival),
        ascending; ``num_admissible`` already counts the room they free."""
    @property
    def prefetch(self) -> list[int]:
        """Indices into ``waiting`` whose prefixes to look up in a staged KV tier now (prefetch)."""
    @property
    def shed(self) -> list[Shed]:
        """Requests to end early before vLLM schedules (late requests of ``shed`` classes); last
        in their list's order and not counted in ``num_admissible``."""
    @property
    def end_thinking(self) -> list[int]:
        """Indices into ``running`` of thinking requests whose reasoning must end now to answer by
        the TTFAT deadline (``degrade`` classes, with a thinking worker attached)."""

@final
class Shed:
    """A request a plan ends early, and what its client is told."""

    @property
    def running(self) -> bool:
        """Whether ``index`` is into ``running`` (else into ``waiting``)."""
    @property
    def index(self) -> int: ...
    @property
    def reason(self) -> str:
        """The target it can no longer meet: ``ttft`` or ``ttfat``."""
    @property
    def message(self) -> str:
        """Starts with ``SHED_MARKER``; names the request, its class and the target."""
    @property
    def retry_after_s(self) -> int:
        """When to try again (HTTP ``Retry-After``), in whole seconds."""

@final
class FinishedRequest:
    """A finished request's report (latencies in the caller's clock units, ms)."""

    @property
    def req_id(self) -> str: ...
    @property
    def slo_class(self) -> str: ...
    @property
    def reason(self) -> Literal["stopped", "length", "aborted", "error"]:
        """Why it ended, in the core's names (``error`` also for an unknown vLLM reason)."""
    @property
    def arrival_ms(self) -> float: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def ttfat_ms(self) -> float | None: ...
    @property
    def transition_gap_ms(self) -> float | None: ...
    @property
    def think_tpot_ms(self) -> float | None: ...
    @property
    def answer_tpot_ms(self) -> float | None: ...
    @property
    def e2e_ms(self) -> float | None: ...
    @property
    def max_answer_gap_ms(self) -> float: ...
    @property
    def num_stalls(self) -> int: ...
    @property
    def num_think_tokens(self) -> int: ...
    @property
    def num_answer_tokens(self) -> int: ...
    @property
    def num_preemptions_prefill(self) -> int: ...
    @property
    def num_preemptions_think(self) -> int: ...
    @property
    def num_preemptions_answer(self) -> int: ...
    @property
    def met_all(self) -> bool: ...
    @property
    def never_reusable_from_token(self) -> int | None: ...
    @property
    def unknown_finish_reason(self) -> str | None:
        """The finish reason as passed when the core does not know it (``reason`` is then ``error``)."""
    @property
    def shed(self) -> str | None:
        """Why a plan ended it early (``ttft`` or ``ttfat``); ``None`` otherwise."""
    @property
    def thinking_stopped_by(self) -> str | None:
        """The thinking-control rule that ended its thinking (reported by the logits processor, or
        the budget vLLM enforced for it); ``None`` when the thinking ended on its own."""
    @property
    def thinking_stopped_after_tokens(self) -> int | None: ...
    @property
    def probe(self) -> bool:
        """An internal EAT probe: its output must not reach a client."""
    @property
    def kv_handoff(self) -> str:
        """Its part in a prefill/decode hand-off (one of ``KV_HANDOFFS``): a request that sent its
        KV on (``sends``) is judged by its TTFT alone."""

@final
class Meridian:
    """The policy engine of one vLLM scheduler."""

    def __new__(
        cls,
        config: Config,
        *,
        block_size: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        reasoning_start_ids: list[int],
        reasoning_end_ids: list[int],
        tool_call_ids: list[list[int]],
        max_num_inflight_kv_loads: int | None = None,
    ) -> Meridian: ...
    @property
    def num_requests(self) -> int: ...
    def add_request(
        self,
        req_id: str,
        arrival_ms: float,
        prompt_token_ids: list[int],
        max_tokens: int,
        slo_class: str | None,
        priority: int,
        waited_ms: float = 0.0,
    ) -> tuple[int, str]:
        """Starts tracking a request; returns its handle and the name of the SLO class it got.
        ``waited_ms``: how long its client already waited elsewhere (its deadlines count it).

        Raises:
            DuplicateRequestError: the id is already tracked.
            UnknownSloClassError: ``slo_class`` is not configured.
            InvalidArgumentError: ``arrival_ms`` is not a finite, non-negative number.
        """
    def add_probe(self, req_id: str, arrival_ms: float, prompt_token_ids: Sequence[int], parent: int) -> int:
        """Tracks an internal EAT probe of ``parent`` (its class, one token, kept out of the counters)."""
    def is_probe(self, handle: int) -> bool:
        """Whether a live request is an internal EAT probe."""
    def num_live_probes(self) -> int:
        """How many internal EAT probes are live."""
    def thinking_endings(self) -> list[str]:
        """The ids of the live requests whose thinking a plan ended, until they finish."""
    def plan_step(
        self,
        now_ms: float,
        running: list[int],
        waiting: list[int],
        num_free_blocks: int,
        *,
        num_async_waiting: int = 0,
        num_inflight_kv_loads: int = 0,
    ) -> StepPlan:
        """One step's plan; the last ``num_async_waiting`` of ``waiting`` are vLLM 0.34's async
        KV-load queue (``--max-num-inflight-kv-loads``), ``num_inflight_kv_loads`` loads holding
        blocks now."""
    def engine_load(
        self, now_ms: float, running: list[int], waiting: list[int]
    ) -> tuple[dict[str, dict[str, int | float | None]], float]:
        """Per class: requests waiting / prefilling / thinking / answering, least slack and TTFAT
        headroom (ms, ``None`` when no request is before its answer), expected remaining output
        tokens; and the phase-weighted queue."""
    def learn_from_history(
        self,
        slo_class: str,
        reason: str,
        answered: bool,
        num_think_tokens: int,
        num_answer_tokens: int,
        kv_handoff: str = "local",
    ) -> bool:
        """Learns one finished request of an earlier run (a request-log line); returns whether it
        taught anything (``False`` for a class this configuration lacks, and for a line of a
        request that only computed its prompt there, ``kv_handoff`` ``"sends"``).

        Raises:
            InvalidArgumentError: ``reason`` is not one of the log's finish reasons, or
                ``kv_handoff`` not one of ``KV_HANDOFFS``.
        """
    def arrival_snapshot(self, now_ms: float, running: list[int], waiting: list[int]) -> str:
        """The engine's queue as an arriving request would meet it, as the JSON text an
        ``ArrivalGate`` reads (``now_ms``: wall clock, also the snapshot's time)."""
    def on_preempted(self, now_ms: float, handle: int) -> tuple[str, bool]: ...
    def on_tokens_batch(
        self, now_ms: float, handles: list[int], counts: list[int], flat_token_ids: list[int]
    ) -> None: ...
    def on_step_output(
        self, now_ms: float, step_id: int, num_prefill_tokens: int, num_decode_requests: int, num_context_tokens: int
    ) -> float | None:
        """Records a step's output; returns its measured duration (ms) when it was folded into the
        step-time model (the step was pending, executed something, and did not end before it started)."""
    def finish(self, now_ms: float, handle: int, finish_reason: str, output_token_ids: list[int]) -> FinishedRequest:
        """Stops tracking a request and reports it.

        ``finish_reason`` is ``str()`` of vLLM's ``FinishReason`` (``stop``, ``length``, ``abort``,
        ``error``); any other string finishes the request as ``error``, sets
        ``unknown_finish_reason`` and counts in ``stats()["num_unknown_finish_reasons"]``.
        ``output_token_ids`` is the request's full output list: the tail beyond the tokens already
        fed is fed at ``now_ms`` first.

        Raises:
            UnknownRequestError: the handle is not live.
            InvalidArgumentError: ``now_ms`` is not a finite, non-negative number.
        """
    def phase(self, handle: int) -> str: ...
    def num_output_tokens(self, handle: int) -> int: ...
    def handle_of(self, req_id: str) -> int | None: ...
    def stats(self) -> dict[str, int]: ...
    def num_thinking_stops(self) -> dict[str, int]:
        """Thinking ended by each rule since start (the processor's reports, or vLLM's budget)."""
    def footprint(self) -> dict[str, int]:
        """What the core holds now: live requests, request slots (the most ever live at once),
        plans awaiting their output, indexed prefix blocks, and heap bytes of all of it."""
    def class_counters(self) -> dict[str, dict[str, int]]: ...
    def recent_ttfat_attainment(self) -> dict[str, float]:
        """TTFAT attainment of each class's recent completions (classes with none are absent)."""
    def predict_step_ms(self, num_prefill_tokens: int, num_decode_requests: int, num_context_tokens: int) -> float:
        """What the step-time model predicts now for a step of this shape (ms)."""
    def planned_decode_step_ms(self) -> float:
        """The decode step the last plan judged every deadline with (ms)."""
    def step_time_coefficients(self) -> tuple[float, float, float, float]:
        """``(base_ms, per_prefill_token_ms, per_decode_request_ms, per_context_token_ms)``."""
    def add_kv_tier(self, name: str, staged: bool = False) -> int:
        """Registers a KV tier by the connector's name for it; the same name gives the same id.
        ``staged``: slower tiers sit behind it, so the plans prefetch."""
    def on_kv_load(self, tier: int, num_tokens: int, duration_ms: float) -> None:
        """Folds a finished load into the tier's fitted cost."""
    def plan_restore(self, handle: int, tiers: list[int], num_tokens: list[int]) -> RestorePlan:
        """How much of a tier hit to load; ``tiers[i]`` holds the next ``num_tokens[i]`` tokens."""
    def vllm_thinking_budget(
        self, handle: int, control: ThinkingControl, client_tokens: int | None = None
    ) -> int | None:
        """The thinking budget vLLM itself should enforce for a request just added (none applies:
        ``None``); remembered, so its thinking ending there is reported with the finish."""
    def on_thinking_stopped(self, handle: int, rule: str, num_think_tokens: int) -> None:
        """The logits processor reports that ``rule`` ended the request's thinking; the first stands."""
    def on_kv_allocated(self, handle: int, num_loaded_tokens: int) -> None:
        """vLLM allocated the request with ``num_loaded_tokens`` from a tier: counts the last offer."""
    def on_kv_stored_batch(self, tier: int, handles: list[int], num_tokens: list[int]) -> None:
        """A tier holds the first ``num_tokens[i]`` tokens of request ``handles[i]``'s KV (0 forgets it)."""
    def set_block_hashes(self, handle: int, block_hashes: bytes, hash_size: int) -> None:
        """The block hashes of a request's prompt, back to back, ``hash_size`` bytes each."""
    def retains_live_tier_blocks(self) -> bool:
        """Whether a KV tier keeps the blocks a live request stored until it finishes (per policy)."""
    def wants_block_events(self) -> bool:
        """Whether prefix-aware admission wants the device cache's and the tiers' block events."""
    def on_block_events(self, tier: int | None, ops: bytes, block_hashes: bytes, hash_size: int) -> None:
        """Block events of one medium (``tier`` None: the device cache), in order: ``ops[i]`` is 1
        (stored) or 0 (removed), each taking the next hash, or 2 (everything cleared)."""
    def cached_prefix(self, handle: int) -> tuple[int, int, int]:
        """``(device blocks, tier blocks, tier)`` of a live request's prompt found cached."""
    def on_prefetched(self, handles: list[int]) -> None:
        """These requests' prefixes are as ready as the tiers can make them: no more prefetch."""
    def set_thinking_worker(self, attached: bool) -> None:
        """Whether a worker that can end a request's thinking is attached: plans end the thinking
        of ``degrade`` classes' requests in time only with one."""
    def num_stored_tokens(self, handle: int) -> int:
        """Tokens of the request's KV a tier holds, as far as the core knows (0 after a failed load)."""
    def on_kv_load_failure(self, handle: int, num_blocks: int) -> None:
        """Loads of ``num_blocks`` of the request's KV blocks failed; it recomputes from now on."""
    def set_kv_handoff(self, handle: int, handoff: str) -> None:
        """Sets a request's part in a prefill/decode hand-off (one of ``KV_HANDOFFS``).

        Raises:
            InvalidArgumentError: ``handoff`` is not one of ``KV_HANDOFFS``.
            UnknownRequestError: ``handle`` is not live.
        """
    def on_remote_kv_started(self, now_ms: float, handle: int) -> None:
        """vLLM gave a receiving request the blocks its KV arrives into."""
    def on_remote_kv_received(self, now_ms: float, handle: int) -> None:
        """A receiving request's KV arrived."""
    def kv_arrival_ms_per_token(self) -> float | None:
        """Milliseconds per prompt token a KV arrival takes here, once one was measured."""
    def handoff_counters(self) -> dict[str, int]:
        """Hand-off counts: ``num_sent``, ``num_received``, ``num_received_tokens``, ``num_failed``."""
    def kv_load_ms_per_token(self, tier: int) -> float:
        """A tier's current fitted load cost (ms per token)."""
    def kv_tier_counters(self) -> dict[str, int]:
        """``num_restores``, ``num_restored_tokens``, ``num_recomputes``, ``num_recomputed_tokens``,
        ``num_failed_load_blocks``."""

@final
class ThinkingControl:
    """The thinking control in force for one request (validated)."""

    @staticmethod
    def for_request(base: ThinkingControl | None, thinking: str | None, budget_tokens: int | None) -> ThinkingControl:
        """``base`` replaced by ``meridian_thinking`` (``"off"`` or a JSON object) and given the hard
        budget ``meridian_thinking_budget_tokens``; raises ``RequestArgsError`` naming the argument."""
    def is_enabled(self) -> bool: ...
    def wants_token_entropy(self) -> bool: ...
    def wants_end_token_stats(self) -> bool: ...
    def wants_eat_probes(self) -> bool: ...
    @property
    def budget_tokens(self) -> int | None:
        """The hard budget in force (the request's own, its class's or its effort's), if any."""
    def admission_budget(self, attainment: float | None, client_tokens: int | None = None) -> int | None:
        """The thinking budget vLLM itself enforces for a request admitted now (the tightest of the
        hard budget, the load-aware budget at ``attainment`` and the client's own), or ``None``."""
    @property
    def closing_text(self) -> str | None: ...

@final
class ThinkingStream:
    """One request's thinking control, fed each sampled token in order."""

    def __new__(
        cls,
        control: ThinkingControl,
        prompt_token_ids: Sequence[int],
        *,
        start_ids: Sequence[int],
        end_ids: Sequence[int],
        forced_ids: Sequence[int],
    ) -> ThinkingStream: ...
    def forced_token(self) -> int | None: ...
    def wants_signals(self) -> bool: ...
    def on_token(
        self,
        token_id: int,
        token_text: str,
        entropy_nats: float | None = None,
        end_prob: float | None = None,
        end_rank: int | None = None,
    ) -> str | None:
        """Feeds one sampled token; returns the name of the rule that fired on it, if any."""
    def take_probe_due(self) -> bool: ...
    def on_eat_probe(self, eat_entropy_nats: float) -> str | None: ...
    def end_for_overload(self) -> str | None:
        """Ends the reasoning now for the scheduler (``degrade``); ``"overload"`` when it does."""
    def set_ttfat_attainment(self, attainment: float) -> None: ...
    @property
    def phase(self) -> str: ...
    @property
    def fired_reason(self) -> str | None: ...
    @property
    def num_think_tokens(self) -> int: ...
    @property
    def num_lines(self) -> int: ...
    @property
    def num_eat_probes(self) -> int: ...
    @property
    def num_forced_tokens(self) -> int: ...
    @property
    def num_mismatched_forced(self) -> int: ...
    @property
    def control(self) -> ThinkingControl: ...
