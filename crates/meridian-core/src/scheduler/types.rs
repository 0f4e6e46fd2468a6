//! The scheduler's public vocabulary: the handle of a tracked request, the engine's limits, a new
//! request, one step's plan, a preemption's and a finish's reports, and the footprint and
//! counters the bindings expose. Plain data: every decision is made elsewhere in the scheduler.
//! Invariant: a [`ReqHandle`] names one slot generation, so a stale handle never aliases a newer
//! request.

use super::{Shed, ShedReason};
use crate::error::{Error, Result};
use crate::handoff::KvHandoff;
use crate::ledger::{Attainment, FinishReason, PhaseCountsU64, RequestLedger, RequestMetrics};
use crate::phase::Phase;
use crate::slo::ClassId;
use crate::thinking::{FiredAt, StopReason};

/// Opaque handle of a tracked request: slot index in the low 32 bits, slot generation in the high
/// 32, so a stale handle of a released request is rejected instead of aliasing a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqHandle(pub u64);

impl ReqHandle {
    pub(super) fn new(slot: u32, generation: u32) -> Self {
        Self(u64::from(generation) << 32 | u64::from(slot))
    }

    pub(super) fn slot(self) -> usize {
        (self.0 & u64::from(u32::MAX)) as usize
    }

    pub(super) fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Static limits of the vLLM engine the policy steers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// KV block size in tokens.
    pub block_size: u32,
    /// vLLM's `max_num_batched_tokens`: the budget never exceeds it.
    pub max_num_batched_tokens: u32,
    /// The requests vLLM admits into its running list (`max_num_seqs`, or the lower
    /// `max_num_active_seqs`): admission never exceeds it.
    pub max_num_seqs: u32,
    /// vLLM's `max_num_inflight_kv_loads` (0.34): requests in its async KV-load queue start their
    /// load without a running seat, at most this many holding blocks for a load at once. `None`:
    /// every admission takes a seat.
    pub max_num_inflight_kv_loads: Option<u32>,
}

impl EngineLimits {
    /// Limits without an async KV-load queue.
    pub fn new(block_size: u32, max_num_batched_tokens: u32, max_num_seqs: u32) -> Self {
        Self { block_size, max_num_batched_tokens, max_num_seqs, max_num_inflight_kv_loads: None }
    }

    pub(super) fn validate(self) -> Result<Self> {
        for (name, value) in [
            ("block_size", self.block_size),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_inflight_kv_loads", self.max_num_inflight_kv_loads.unwrap_or(1)),
        ] {
            if value == 0 {
                return Err(Error::argument(name, value, "must be at least 1"));
            }
        }
        Ok(self)
    }
}

/// What a plan needs of vLLM 0.34's async KV-load queue (`async_kv_waiting`, on with
/// `--max-num-inflight-kv-loads`): which waiting requests are in it and how many loads hold
/// blocks now. Such a request starts its KV load without a running seat (it takes one once its
/// KV has arrived), so the plan may admit it while every seat is taken, within the cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AsyncKvLoads {
    /// How many of the plan's `waiting` handles, at its end, are in vLLM's async KV-load queue.
    pub num_waiting: usize,
    /// Requests holding blocks for an async load now (loads in flight, or arrived and waiting
    /// for a seat): what vLLM counts against the cap.
    pub num_inflight: u32,
}

/// A request as vLLM's `add_request` sees it, reduced to plain values.
#[derive(Debug, Clone, Copy)]
pub struct NewRequest<'a> {
    /// vLLM's request id.
    pub req_id: &'a str,
    /// Arrival time on the caller's monotonic clock.
    pub arrival_ms: f64,
    /// The prompt's token ids (scanned once for reasoning markers).
    pub prompt_token_ids: &'a [u32],
    /// `sampling_params.max_tokens`.
    pub max_tokens: u32,
    /// Explicit SLO class (the request argument [`crate::CLASS_ARG`]), if the client gave one.
    pub slo_class: Option<&'a str>,
    /// vLLM priority (lower is more important); maps onto a class when none is named.
    pub priority: i64,
    /// How long its client had already waited for it before it arrived here, ms (the request
    /// argument [`crate::WAITED_ARG`]: a retry of a request shed elsewhere). Its deadlines run
    /// from when its client first sent it, so a retry is not given a fresh TTFT target.
    pub waited_ms: f64,
}

/// The decisions for one engine step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Identifies the step in [`Meridian::on_step_output`].
    pub step_id: u64,
    /// Permutation of the `running` list passed in: indices, most important first. The last
    /// entry is the first preemption victim.
    pub running_order: Vec<u32>,
    /// Permutation of the `waiting` list passed in, first to admit first.
    pub waiting_order: Vec<u32>,
    /// How many entries at the head of `waiting_order` may be admitted this step.
    pub num_admissible: u32,
    /// Tokens the step may schedule in all.
    pub token_budget: u32,
    /// KV blocks held back for running answering requests.
    pub num_reserved_blocks: u32,
    /// Indices into `running` of requests that must not be scheduled this step (paced answers
    /// under the `pascal` policy; always empty otherwise), ascending.
    pub held: Vec<u32>,
    /// Indices into `running` of requests to preempt before vLLM schedules the step, to make room
    /// for a more important waiting request (preemption on arrival); `num_admissible` already
    /// counts the seats and blocks they free. Thinking (or still prefilling) requests only.
    pub preempt: Vec<u32>,
    /// Indices into `waiting` of requests next in line whose prefixes the shim should look up in
    /// a staged KV tier now, so that slower tiers move them up before their turn (prefetch);
    /// empty without a staged tier. Each request at most once.
    pub prefetch: Vec<u32>,
    /// Requests to end early, before vLLM schedules the step: late requests of `shed` classes
    /// ([`OnOverload::Shed`]), each with the target it can no longer meet. They are last in their
    /// list's order and not counted in `num_admissible`. Each request at most once.
    pub shed: Vec<Shed>,
    /// Indices into `running` (ascending) of thinking requests whose reasoning must end now so
    /// that their answer starts by the TTFAT deadline (classes under [`OnOverload::Degrade`],
    /// once a worker that can end it is attached, [`Meridian::set_thinking_worker`]). Each
    /// request at most once.
    pub end_thinking: Vec<u32>,
}

/// What a preemption meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    /// Phase of the victim when preempted.
    pub phase: Phase,
    /// An answering request was preempted while a thinking one was running: a policy failure.
    pub alarm: bool,
}

/// Everything known about a request when it leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequest {
    /// vLLM's request id.
    pub req_id: String,
    /// Its SLO class.
    pub class: ClassId,
    /// Why it ended ([`FinishReason::Error`] for a finish reason the core does not know).
    pub reason: FinishReason,
    /// The finish reason as the caller passed it when [`FinishReason::from_vllm`] does not know
    /// it (`reason` is then [`FinishReason::Error`]); `None` for every known reason.
    pub unknown_finish_reason: Option<String>,
    /// Timestamps and counters.
    pub ledger: RequestLedger,
    /// Derived latencies.
    pub metrics: RequestMetrics,
    /// Targets met (meaningful for completed requests).
    pub attainment: Attainment,
    /// Token index from which its KV blocks can never be a prefix hit again (docs/request-life.md §3 tier 1),
    /// or `None` when they stay ordinary prefix-cache blocks.
    pub never_reusable_from_token: Option<u32>,
    /// Why a plan ended it early ([`StepPlan::shed`]); `None` for every other request.
    pub shed: Option<ShedReason>,
    /// The thinking-control rule that ended its thinking and after how many thinking tokens:
    /// reported by the logits processor, or inferred from the budget vLLM enforced for it; `None`
    /// when its thinking ended on its own.
    pub thinking_stop: Option<FiredAt>,
    /// It was an internal EAT probe ([`crate::Meridian::add_probe`]): its output must not reach
    /// a client, and it is in no counter.
    pub probe: bool,
    /// Its part in a prefill/decode hand-off: a request that sent its KV on is judged
    /// ([`Self::attainment`]) and counted by its TTFT alone.
    pub kv_handoff: KvHandoff,
}

/// What the core holds on the heap, for checking that a long-running engine stays flat: every
/// term scales with the requests live now, the most that were ever live at once (slots are
/// reused, never freed), or the blocks some cache holds, never with requests that finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Requests tracked now (probes included).
    pub num_live_requests: usize,
    /// Request slots allocated: the most requests ever live at once.
    pub num_slots: usize,
    /// Plans whose step output has not come back yet.
    pub num_pending_steps: usize,
    /// Block hashes the prefix index holds ([`PrefixIndex::len`]).
    pub num_indexed_blocks: usize,
    /// Bytes of the core's collections and of its live requests' own heap data (ids, prompt block
    /// hashes, tool-call matchers), by capacity; the configuration and the fixed-size predictors
    /// are left out.
    pub heap_bytes: usize,
}

/// Engine-wide counters; monotone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Plans produced.
    pub num_steps: u64,
    /// Requests added.
    pub num_added: u64,
    /// Requests finished (any reason).
    pub num_finished: u64,
    /// Preemptions by the victim's phase.
    pub num_preemptions: PhaseCountsU64,
    /// Answering requests preempted while a thinking one ran.
    pub num_answer_preemption_alarms: u64,
    /// Finished requests whose reasoning blocks were reported never-reusable.
    pub num_reasoning_evictions: u64,
    /// Step-time samples folded into the model.
    pub num_step_samples: u64,
    /// EAT probes added (internal requests; never in `num_added`, `num_finished` or any class
    /// counter).
    pub num_probes: u64,
    /// Prompt tokens of those probes (their cost before prefix-cache hits).
    pub num_probe_prompt_tokens: u64,
    /// Running requests the plan preempted on arrival of a more important one.
    pub num_arrival_preemptions: u64,
    /// Requests finished with a finish reason the core does not know (each also counts in
    /// `num_finished`, as [`FinishReason::Error`]; probes are not counted).
    pub num_unknown_finish_reasons: u64,
    /// Requests a plan listed to end early ([`StepPlan::shed`]).
    pub num_shed: u64,
    /// Thinking requests a plan ended to answer in time ([`StepPlan::end_thinking`]).
    pub num_degraded: u64,
    /// Thinking ended by each rule, indexed by [`StopReason`] in declaration order.
    pub num_thinking_stops: [u64; StopReason::ALL.len()],
}
