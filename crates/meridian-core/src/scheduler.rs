//! [`Meridian`], the policy engine: it tracks every request vLLM hands the scheduler (phase, SLO
//! class, ledger) and, once per engine step, turns plain numbers into plain decisions — the order
//! of `running` (its last entry is vLLM's preemption victim), the order of `waiting`, how many
//! waiting requests may be admitted under the answer KV reserve, and the step's token budget.
//! The rules the shim would otherwise repeat live here once: a request's class is resolved when
//! it is added ([`Meridian::add_request`] returns it), a step's duration is measured when its
//! output arrives ([`Meridian::on_step_output`] returns it), and a request finishes with vLLM's
//! own finish reason and output tokens ([`Meridian::finish`] maps the one and feeds the unseen
//! tail of the other). Invariants: a live request has exactly one slot and one handle; a plan's
//! orders are permutations of the lists passed in (nothing lost or duplicated), total and
//! deterministic for the same state; the budget lies in `[1, max_num_batched_tokens]`; phases
//! only move forward; an unknown finish reason never fails or loses a request.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;

use hashbrown::HashMap;

use crate::config::{Config, Policy, ReasoningBlockRule};
use crate::error::{check_time_ms, shown, Error, Result};
use crate::kv_tier::{KvTiers, TierId, TierSpan, MAX_TIERS};
use crate::ledger::{Attainment, ClassCounters, FinishReason, PhaseCountsU64, RequestLedger, RequestMetrics};
use crate::phase::{Phase, PhaseTracker, ReasoningMarkers};
use crate::predictor::{Quantile, ResidualLength};
use crate::prefix_index::PrefixIndex;
use crate::slo::{ClassId, OnOverload, SloTargets, WaitingOrder};
use crate::step_model::{StepCoefficients, StepSample, StepShape, StepTimeModel};

/// Opaque handle of a tracked request: slot index in the low 32 bits, slot generation in the high
/// 32, so a stale handle of a released request is rejected instead of aliasing a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqHandle(pub u64);

impl ReqHandle {
    fn new(slot: u32, generation: u32) -> Self {
        Self(u64::from(generation) << 32 | u64::from(slot))
    }

    fn slot(self) -> usize {
        (self.0 & u64::from(u32::MAX)) as usize
    }

    fn generation(self) -> u32 {
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
    /// vLLM's `max_num_seqs`: admission never exceeds it.
    pub max_num_seqs: u32,
}

impl EngineLimits {
    fn validate(self) -> Result<Self> {
        for (name, value) in [
            ("block_size", self.block_size),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
        ] {
            if value == 0 {
                return Err(Error::argument(name, value, "must be at least 1"));
            }
        }
        Ok(self)
    }
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
    /// Token index from which its KV blocks can never be a prefix hit again (DESIGN §3 tier 1),
    /// or `None` when they stay ordinary prefix-cache blocks.
    pub never_reusable_from_token: Option<u32>,
    /// Why a plan ended it early ([`StepPlan::shed`]); `None` for every other request.
    pub shed: Option<ShedReason>,
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
}

#[derive(Debug, Clone)]
struct Tracked {
    req_id: String,
    class: ClassId,
    num_prompt_tokens: u32,
    max_tokens: u32,
    reasoning_start: u32,
    num_output_tokens: u32,
    tracker: PhaseTracker,
    ledger: RequestLedger,
    preempted: bool,
    waiting_since_ms: f64,
    /// When a plan last preempted it on arrival of another request.
    arrival_preempted_ms: Option<f64>,
    /// An internal EAT probe: scheduled like any request of its class, never counted or learnt
    /// from, and its blocks (the parent's reasoning) are not reported never-reusable.
    probe: bool,
    /// Tokens of a KV tier hit last offered to it and not yet allocated
    /// ([`Meridian::plan_restore`], [`Meridian::on_kv_allocated`]).
    offered_restore_tokens: Option<u32>,
    /// A KV load of this request failed: it recomputes from now on.
    kv_load_failed: bool,
    /// The prefix of its KV a tier holds ([`Meridian::on_kv_stored`]): what a resume after a
    /// preemption could load instead of recomputing.
    stored_prefix: Option<TierSpan>,
    /// Its prompt's block hashes (for prefix-aware admission; empty without prefix caching).
    block_hashes: Box<[u64]>,
    /// A plan already had its prefix looked up in a staged tier ([`StepPlan::prefetch`]).
    prefetched: bool,
    /// A plan listed it to end early, for this reason ([`StepPlan::shed`]).
    shed: Option<ShedReason>,
    /// A plan ended its thinking to answer in time ([`StepPlan::end_thinking`]).
    thinking_ended: bool,
}

impl Tracked {
    fn num_tokens(&self) -> u32 {
        self.num_prompt_tokens.saturating_add(self.num_output_tokens)
    }
}

/// The few fields the per-step plan reads, copied out of [`Tracked`] into one dense array so a
/// 1,024-request plan walks 64 kB (one cache line per request) instead of ~300 kB of ledgers. Derived state:
/// [`Meridian::refresh_hot`] rewrites it from the owning [`Tracked`] after every mutation.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))] // one cache line per request
struct Hot {
    /// The handle of the request in this slot.
    handle: ReqHandle,
    /// Whether the slot holds a live request (`handle` is stale otherwise).
    live: bool,
    arrival_ms: f64,
    /// Latest token, or the arrival when none has come yet.
    last_token_ms: f64,
    /// First answer token (the arrival before it comes).
    first_answer_ms: f64,
    waiting_since_ms: f64,
    /// When a plan last preempted it on arrival (−∞: never).
    arrival_preempted_ms: f64,
    num_tokens: u32,
    num_output_tokens: u32,
    max_tokens: u32,
    num_think_tokens: u32,
    num_answer_tokens: u32,
    class: ClassId,
    phase: Phase,
    is_reasoning: bool,
    preempted: bool,
    has_started: bool,
    has_answered: bool,
    /// Tokens of its prefix a tier holds (0 after a failed load: it recomputes), and the tier.
    num_stored_tokens: u32,
    stored_tier: u8,
    /// A plan listed it to end early: it goes last and is never admitted or chosen again.
    shed: bool,
    /// A plan ended its thinking ([`StepPlan::end_thinking`]).
    thinking_ended: bool,
}

impl Hot {
    fn of(r: &Tracked, handle: ReqHandle) -> Self {
        Self {
            handle,
            live: true,
            arrival_ms: r.ledger.arrival_ms,
            last_token_ms: r.ledger.last_token_ms.unwrap_or(r.ledger.arrival_ms),
            first_answer_ms: r.ledger.first_answer_ms.unwrap_or(r.ledger.arrival_ms),
            waiting_since_ms: r.waiting_since_ms,
            arrival_preempted_ms: r.arrival_preempted_ms.unwrap_or(f64::NEG_INFINITY),
            num_tokens: r.num_tokens(),
            num_output_tokens: r.num_output_tokens,
            max_tokens: r.max_tokens,
            num_think_tokens: r.ledger.num_think_tokens,
            num_answer_tokens: r.ledger.num_answer_tokens,
            class: r.class,
            phase: r.tracker.phase(),
            is_reasoning: r.tracker.is_reasoning(),
            preempted: r.preempted,
            has_started: r.ledger.first_token_ms.is_some(),
            has_answered: r.ledger.first_answer_ms.is_some(),
            num_stored_tokens: r
                .stored_prefix
                .filter(|_| !r.kv_load_failed)
                .map_or(0, |s| s.num_tokens.min(r.num_tokens())),
            stored_tier: r.stored_prefix.map_or(0, |s| s.tier.0),
            shed: r.shed.is_some(),
            thinking_ended: r.thinking_ended,
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    generation: u32,
    request: Option<Tracked>,
}

/// The length predictors of one SLO class: each class learns from its own finished requests.
#[derive(Debug, Clone)]
struct ClassLengths {
    think: ResidualLength,
    answer: ResidualLength,
}

/// Aggregates over the running list for one plan.
#[derive(Debug, Clone, Copy)]
struct RunningLoad {
    num_context_tokens: u64,
    num_answering: u32,
    /// Running requests past their prompt: each decodes one token a step.
    num_decoding: u32,
    num_reserved_blocks: u32,
    /// Tightest answer TPOT target among answering requests (∞ when none answers).
    answer_tpot_ms: f64,
    /// The longest step every answering request can absorb with its mean TPOT still within its
    /// target (with `tpot_headroom`) over the answer so far: the time it banked by running faster
    /// than its target, after the step in flight (∞ when none answers). Only banked time is
    /// spent, never time the rest of an answer of unknown length would bring.
    least_banked_ms: f64,
    /// Tightest answer TPOT target among all running requests (∞ when none runs).
    any_tpot_ms: f64,
}

impl RunningLoad {
    /// The step the running requests' decodes alone make.
    fn decodes(&self) -> StepShape {
        StepShape {
            num_prefill_tokens: 0,
            num_decode_requests: self.num_decoding,
            num_context_tokens: self.num_context_tokens,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct PendingStep {
    step_id: u64,
    scheduled_at_ms: f64,
}

/// Sort key before packing: group (0–7), a group-specific primary key, a tie-break key. All
/// three are 64-bit: the key is returned through memory, and a wide load of a narrow store
/// (a `u8` group read back as a word) stalls store forwarding once per request per plan.
type OrderKey = (u64, u64, u64);

/// Lists up to this long sort as packed `u64`s (16 bits of position); longer ones as `u128`s.
const MAX_FAST_SORT_LEN: usize = 1 << 16;

/// Packs a key and the entry's input position into one `u64`: sorting plain integers is what
/// keeps a 1,024-request step within its 20 µs budget. Layout: group (3 bits), the top 45 bits of
/// `primary` (a float key keeps ~10 significant digits), position (16 bits). The tie-break key
/// is dropped: equal keys keep their input order, so ties do not flap from step to step.
fn pack_fast((group, primary, _tie): OrderKey, position: u32) -> u64 {
    group << 61 | (primary >> 19) << 16 | u64::from(position)
}

/// The exact packing for very long lists: group, full primary, tie-break, position.
fn pack_exact((group, primary, tie): OrderKey, position: u32) -> u128 {
    let head = group << 61 | primary >> 3;
    u128::from(head) << 64 | u128::from(tie) << 32 | u128::from(position)
}

/// The rank under which waiting requests safely inside their targets queue in arrival order:
/// behind every rank a class can have below it (late ones queue under `u8::MAX`).
const SAFE_RANK: u8 = u8::MAX - 1;

/// A step that spends banked answer time stays this far below a stall's length (a gap above
/// `stall_factor` × the TPOT target).
const STALL_MARGIN: f64 = 0.5;

/// Waiting requests at the head of the order that prefix-aware admission orders again.
pub const PREFIX_AFFINITY_WINDOW: usize = 64;

/// Unmet steps are remembered at most this long (a shim that never reports outputs cannot grow
/// memory without bound).
const MAX_PENDING_STEPS: usize = 64;

/// How often the predictors learn what the unfinished requests have generated so far (ms): the
/// lengths move by a token a step, the distribution they shift does not need every step.
const CENSORED_REFRESH_MS: f64 = 100.0;

/// The policy engine. See the module docs for its invariants.
#[derive(Debug, Clone)]
pub struct Meridian {
    config: Config,
    limits: EngineLimits,
    markers: ReasoningMarkers,
    slots: Vec<Slot>,
    hot: Vec<Hot>,
    free_slots: Vec<u32>,
    by_req_id: HashMap<String, ReqHandle, RandomState>,
    /// Per class (indexed by [`ClassId`]): what its requests' thinking and answers look like.
    lengths: Vec<ClassLengths>,
    step_model: StepTimeModel,
    class_counters: Vec<ClassCounters>,
    /// Per class: exponentially weighted TTFAT attainment of recent completions (the load-aware
    /// thinking budget reads it), `None` until the class completes a request.
    recent_ttfat_attainment: Vec<Option<f64>>,
    stats: SchedulerStats,
    pending_steps: VecDeque<PendingStep>,
    last_output_ms: Option<f64>,
    /// Whether the engine held requests after the last output (it scheduled its next step at once).
    busy_after_last_output: bool,
    /// When the predictors last saw what the unfinished requests have generated, and the per
    /// class scratch lists for it.
    censored_at_ms: f64,
    censored_think: Vec<Vec<u32>>,
    censored_answer: Vec<Vec<u32>>,
    num_thinking_in_step: u32,
    seen: Vec<u64>,
    scratch_keys: Vec<u64>,
    /// `1 / config.aging_ms`: the plan multiplies instead of dividing per waiting request.
    inv_aging_ms: f64,
    /// `1000 / config.uniboost_gamma_tokens_per_s`: UniBoost's push-back per token of known work.
    uniboost_ms_per_token: f64,
    /// Targets and rank per class, dense (the plan reads them for every request).
    class_table: Vec<(SloTargets, u8)>,
    /// Per class: the median thinking of a request that has not thought yet, refreshed at the
    /// start of every plan (the slack of every waiting request reads it).
    fresh_think_p50_tokens: Vec<f64>,
    /// Per class: the thinking a request that has not thought yet needs to be viable
    /// ([`crate::predictor::Quantile::Viable`]), refreshed with `fresh_think_p50_tokens`.
    fresh_think_viable_tokens: Vec<f64>,
    /// Per class: what becomes of its late requests.
    class_triage: Vec<OnOverload>,
    /// The decode step the last plan predicted (the answer bank of the next plan reads it).
    last_decode_step_ms: f64,
    /// How long before a queued request's first token could come, at the least, as the last
    /// plan saw it (and how long a shed client waits for its notice, at the most): the step in
    /// flight, which may be as long as the step budget allows, then decode steps.
    queued_lead_ms: f64,
    /// The longest the step this plan schedules may take (its budget's worth of prompt chunks
    /// with every running decode): how much later than this plan the next one can come.
    longest_step_ms: f64,
    /// How fast requests get their first token: the rate at which the queue drains (the
    /// saturation gauge reads it).
    start_rate: load::RateMeter,
    /// Whether any class sheds (the plan skips the triage pass otherwise).
    any_shed_class: bool,
    /// Per slot, this plan's judgement of each listed request ([`Self::judge`]): 0 viable, else
    /// 1 + the [`ShedReason`] it would miss. The ordering keys and the triage read it, so a
    /// request is judged once per plan.
    judgements: Vec<u8>,
    /// Whether any class degrades and a worker can end thinking ([`Self::set_thinking_worker`]).
    degrades: bool,
    /// The KV tiers beyond the device and their load costs.
    kv_tiers: KvTiers,
    /// The shape of the last step measured: the extra step a KV load costs is priced as one
    /// more like it; `None` before the first measurement.
    last_step_shape: Option<StepShape>,
    /// Per tier, refreshed at the start of every plan: the shortest stored prefix a resume would
    /// load rather than recompute ([`KvTiers::min_restore_tokens`]).
    min_restore_tokens: [f64; MAX_TIERS],
    /// Where prompt prefixes are cached (device and tiers), for prefix-aware admission.
    prefix_index: PrefixIndex,
}

/// About how many recent completions the recent TTFAT attainment remembers: enough that one
/// miss moves it by 3 %, few enough that it follows a load change within a minute of traffic.
pub const RECENT_ATTAINMENT_REQUESTS: f64 = 32.0;

/// Folds one completion into a class's recent attainment; the first one starts it.
fn blend_attainment(recent: Option<f64>, met: bool) -> f64 {
    let x = if met { 1.0 } else { 0.0 };
    match recent {
        None => x,
        Some(r) => r + (x - r) / RECENT_ATTAINMENT_REQUESTS,
    }
}

impl Meridian {
    /// A policy engine for one vLLM scheduler.
    pub fn new(config: Config, limits: EngineLimits, markers: ReasoningMarkers) -> Result<Self> {
        let limits = limits.validate()?;
        let inv_aging_ms = 1.0 / config.aging_ms;
        let uniboost_ms_per_token = 1_000.0 / config.uniboost_gamma_tokens_per_s;
        let class_table: Vec<_> = config.classes.iter().map(|c| (c.targets, c.rank)).collect();
        // Triage is Meridian's: the ablations and the emulated baselines run as published, so a
        // class's `on_overload` is read as `queue` under them.
        let class_triage: Vec<_> = config
            .classes
            .iter()
            .map(|c| if config.policy == Policy::Meridian { c.on_overload } else { OnOverload::Queue })
            .collect();
        let kv_tiers = KvTiers::new(config.kv_tier);
        let viable_level = config.overload.min_success_probability;
        Ok(Self {
            lengths: (0..config.classes.len())
                .map(|_| {
                    let mut think = ResidualLength::with_rate(&config.think_tokens_prior, config.predictor);
                    think.set_viable_level(viable_level);
                    think.refresh();
                    ClassLengths {
                        think,
                        answer: ResidualLength::with_rate(&config.answer_tokens_prior, config.predictor),
                    }
                })
                .collect(),
            any_shed_class: class_triage.contains(&OnOverload::Shed),
            judgements: Vec::new(),
            degrades: false,
            last_decode_step_ms: 0.0,
            queued_lead_ms: 0.0,
            longest_step_ms: 0.0,
            start_rate: load::RateMeter::default(),
            class_triage,
            fresh_think_viable_tokens: vec![0.0; class_table.len()],
            step_model: StepTimeModel::new(&config.step_time),
            class_counters: vec![ClassCounters::default(); config.classes.len()],
            recent_ttfat_attainment: vec![None; config.classes.len()],
            config,
            limits,
            markers,
            slots: Vec::new(),
            hot: Vec::new(),
            free_slots: Vec::new(),
            by_req_id: HashMap::with_hasher(RandomState::new()),
            stats: SchedulerStats::default(),
            pending_steps: VecDeque::new(),
            last_output_ms: None,
            busy_after_last_output: false,
            censored_at_ms: f64::NEG_INFINITY,
            censored_think: Vec::new(),
            censored_answer: Vec::new(),
            num_thinking_in_step: 0,
            seen: Vec::new(),
            scratch_keys: Vec::new(),
            inv_aging_ms,
            uniboost_ms_per_token,
            fresh_think_p50_tokens: vec![0.0; class_table.len()],
            class_table,
            kv_tiers,
            last_step_shape: None,
            min_restore_tokens: [f64::INFINITY; MAX_TIERS],
            prefix_index: PrefixIndex::new(),
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Engine-wide counters.
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// What the core holds now; see [`Footprint`].
    pub fn footprint(&self) -> Footprint {
        use std::mem::size_of;
        let live = self.slots.iter().filter_map(|slot| slot.request.as_ref());
        let requests_bytes: usize = live
            .map(|r| r.req_id.capacity() + r.block_hashes.len() * size_of::<u64>() + r.tracker.heap_bytes())
            .sum();
        let collections_bytes = self.slots.capacity() * size_of::<Slot>()
            + self.hot.capacity() * size_of::<Hot>()
            + self.free_slots.capacity() * size_of::<u32>()
            + self.by_req_id.allocation_size()
            + self.pending_steps.capacity() * size_of::<PendingStep>()
            + (self.seen.capacity() + self.scratch_keys.capacity()) * size_of::<u64>()
            + self.judgements.capacity()
            + self.prefix_index.heap_bytes();
        Footprint {
            num_live_requests: self.by_req_id.len(),
            num_slots: self.slots.len(),
            num_pending_steps: self.pending_steps.len(),
            num_indexed_blocks: self.prefix_index.len(),
            heap_bytes: collections_bytes + requests_bytes,
        }
    }

    /// Per-class attainment counters, indexed by [`ClassId`].
    pub fn class_counters(&self) -> &[ClassCounters] {
        &self.class_counters
    }

    /// Per class (indexed by [`ClassId`]): the TTFAT attainment of recent completions, weighted
    /// toward the last [`RECENT_ATTAINMENT_REQUESTS`] or so; `None` before the first completion.
    pub fn recent_ttfat_attainment(&self) -> &[Option<f64>] {
        &self.recent_ttfat_attainment
    }

    /// The step-time model's current coefficients `(base_ms, per_token_ms, per_context_token_ms)`.
    pub fn step_time_coefficients(&self) -> StepCoefficients {
        self.step_model.coefficients()
    }

    /// Number of live requests.
    pub fn num_requests(&self) -> usize {
        self.by_req_id.len()
    }

    /// Handle of a live request by vLLM id.
    pub fn handle_of(&self, req_id: &str) -> Option<ReqHandle> {
        self.by_req_id.get(req_id).copied()
    }

    /// Phase of a live request.
    pub fn phase(&self, handle: ReqHandle) -> Result<Phase> {
        Ok(self.get(handle)?.tracker.phase())
    }

    /// Output tokens observed so far for a live request.
    pub fn num_output_tokens(&self, handle: ReqHandle) -> Result<u32> {
        Ok(self.get(handle)?.num_output_tokens)
    }

    /// The SLO class a request gets: the one it names, else the one its priority maps to.
    fn resolve_class(&self, req_id: &str, slo_class: Option<&str>, priority: i64) -> Result<ClassId> {
        match slo_class {
            Some(name) => self.config.class_by_name(name).ok_or_else(|| Error::UnknownSloClass {
                req_id: shown(req_id),
                name: shown(name),
                known: self.config.class_names(),
            }),
            None => Ok(self.config.class_for_priority(priority)),
        }
    }

    /// Starts tracking a request; returns its handle and the SLO class it was given (the class it
    /// names, else the class its priority maps to, [`Config::class_for_priority`]). Nothing is
    /// tracked when it fails: a class that is not configured is [`Error::UnknownSloClass`].
    pub fn add_request(&mut self, req: NewRequest<'_>) -> Result<(ReqHandle, ClassId)> {
        let arrival_ms = check_time_ms("arrival_ms", req.arrival_ms)?;
        let waited_ms = crate::request_args::check_waited_ms(req.waited_ms)?;
        if self.by_req_id.contains_key(req.req_id) {
            return Err(Error::DuplicateRequest { req_id: req.req_id.to_owned() });
        }
        let class = self.resolve_class(req.req_id, req.slo_class, req.priority)?;
        let num_prompt_tokens = u32::try_from(req.prompt_token_ids.len()).map_err(|_| {
            Error::argument("prompt_token_ids", req.prompt_token_ids.len(), "prompt is too long")
        })?;
        let prompt = self.markers.classify_prompt(req.prompt_token_ids, num_prompt_tokens);
        let tracked = Tracked {
            req_id: req.req_id.to_owned(),
            class,
            num_prompt_tokens,
            max_tokens: req.max_tokens,
            reasoning_start: prompt.reasoning_start,
            num_output_tokens: 0,
            tracker: PhaseTracker::new(&self.markers, prompt),
            // The client's clock: its targets count the time it waited elsewhere (never before 0).
            ledger: RequestLedger::new((arrival_ms - waited_ms).max(0.0)),
            preempted: false,
            waiting_since_ms: arrival_ms,
            arrival_preempted_ms: None,
            offered_restore_tokens: None,
            kv_load_failed: false,
            stored_prefix: None,
            block_hashes: Box::default(),
            prefetched: false,
            probe: false,
            shed: None,
            thinking_ended: false,
        };
        let handle = self.insert(tracked);
        self.by_req_id.insert(req.req_id.to_owned(), handle);
        self.stats.num_added += 1;
        Ok((handle, class))
    }

    /// Adds an internal EAT probe for `parent` (the parent's class; one token): its prompt is
    /// the parent's tokens so far plus the reasoning-end marker, so it is mostly a prefix-cache
    /// hit and runs in the answer phase. It is scheduled like any request of its class but kept
    /// out of the books: never in the added, finished or class counters, never learnt from, and
    /// its blocks (the parent's reasoning) are not reported never-reusable.
    pub fn add_probe(
        &mut self,
        req_id: &str,
        arrival_ms: f64,
        prompt_token_ids: &[u32],
        parent: ReqHandle,
    ) -> Result<ReqHandle> {
        let class = self.get(parent)?.class;
        let class_name = self.config.classes[class.index()].name.clone();
        let (handle, _) = self.add_request(NewRequest {
            req_id,
            arrival_ms,
            prompt_token_ids,
            max_tokens: 1,
            slo_class: Some(&class_name),
            priority: 0,
            waited_ms: 0.0,
        })?;
        self.stats.num_added -= 1;
        self.stats.num_probes += 1;
        self.stats.num_probe_prompt_tokens += prompt_token_ids.len() as u64;
        if let Some(tracked) = self.slots[handle.slot()].request.as_mut() {
            tracked.probe = true;
        }
        Ok(handle)
    }

    /// Decides the step. `running` and `waiting` are the handles of vLLM's `running` list and
    /// waiting queue in their current order; `num_free_blocks` is the block pool's free count.
    pub fn plan_step(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        num_free_blocks: u32,
    ) -> Result<StepPlan> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        self.check_distinct(running, waiting)?;
        if now_ms - self.censored_at_ms >= CENSORED_REFRESH_MS || now_ms < self.censored_at_ms {
            self.censored_at_ms = now_ms;
            self.refresh_censored(running, waiting);
        }
        for (i, lengths) in self.lengths.iter_mut().enumerate() {
            lengths.think.refresh();
            lengths.answer.refresh();
            self.fresh_think_p50_tokens[i] = lengths.think.remaining_quantile(0, Quantile::P50);
            self.fresh_think_viable_tokens[i] = lengths.think.remaining_quantile(0, Quantile::Viable);
        }
        self.refresh_restore_bounds();
        let load = self.running_load(now_ms, running);
        let decode_step_ms = self.step_model.predict_ms(load.decodes());
        self.last_decode_step_ms = decode_step_ms;
        let token_budget = self.token_budget(&load);
        self.longest_step_ms = self.longest_step_ms(&load, !running.is_empty(), token_budget, decode_step_ms);
        self.queued_lead_ms = self.longest_step_ms + (overload::QUEUED_LEAD_STEPS - 1.0) * decode_step_ms;
        let candidates = self.judge(now_ms, running, waiting, decode_step_ms);
        let shed = self.triage(running, waiting, num_free_blocks, candidates);
        let end_thinking = self.degrade(now_ms, running, decode_step_ms);
        let running_order = self.order_running(now_ms, running, decode_step_ms);
        let mut waiting_order = self.order_waiting(now_ms, waiting, decode_step_ms);
        let num_reserved_blocks = load.num_reserved_blocks;
        let (preempt, freed_blocks) = self.arrival_victims(
            now_ms,
            running,
            waiting,
            &waiting_order,
            num_free_blocks.saturating_sub(num_reserved_blocks),
            decode_step_ms,
        );
        let (shed_seats, shed_blocks) = self.freed_by_shed(running, &shed);
        let num_admissible = self.num_admissible(
            now_ms,
            waiting,
            &mut waiting_order,
            num_free_blocks.saturating_add(freed_blocks).saturating_add(shed_blocks),
            num_reserved_blocks,
            running.len().saturating_sub(preempt.len() + shed_seats),
            &load,
        );
        // Only shed classes are judged again; the walk over the running list is skipped without.
        let shed = if self.any_shed_class {
            let tokens_left = self.tokens_left_for_waiting(running, token_budget);
            self.shed_the_unadmitted(now_ms, waiting, &waiting_order, num_admissible, tokens_left, shed)
        } else {
            shed
        };
        let prefetch = self.prefetch(waiting, &waiting_order, num_admissible);
        let held = self.paced_out(now_ms, running, decode_step_ms);
        self.num_thinking_in_step = running.len() as u32 - load.num_answering;
        let step_id = self.stats.num_steps;
        self.stats.num_steps += 1;
        self.remember_step(PendingStep { step_id, scheduled_at_ms: now_ms });
        self.stats.num_shed += shed.len() as u64;
        self.stats.num_degraded += end_thinking.len() as u64;
        Ok(StepPlan {
            step_id,
            running_order,
            waiting_order,
            num_admissible,
            token_budget,
            num_reserved_blocks,
            held,
            preempt,
            prefetch,
            shed,
            end_thinking,
        })
    }

    /// Records that vLLM preempted a request during the step being scheduled.
    pub fn on_preempted(&mut self, now_ms: f64, handle: ReqHandle) -> Result<Preemption> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        let thinking_left = self.num_thinking_in_step;
        let request = self.get_mut(handle)?;
        let phase = request.tracker.phase();
        request.ledger.num_preemptions.bump(phase);
        request.preempted = true;
        // Its KV goes to the tiers again (and from the fastest down): worth a new prefetch.
        request.prefetched = false;
        request.waiting_since_ms = now_ms;
        // PASCAL preempts answers first on purpose: there it is the policy, not a failure.
        let alarm = phase == Phase::Answer && thinking_left > 0 && self.config.policy != Policy::Pascal;
        self.refresh_hot(handle);
        if phase != Phase::Answer {
            self.num_thinking_in_step = thinking_left.saturating_sub(1);
        }
        match phase {
            Phase::Prefill => self.stats.num_preemptions.prefill += 1,
            Phase::Think => self.stats.num_preemptions.think += 1,
            Phase::Answer => self.stats.num_preemptions.answer += 1,
            Phase::Done => {}
        }
        self.stats.num_answer_preemption_alarms += u64::from(alarm);
        Ok(Preemption { phase, alarm })
    }

    /// Feeds the tokens vLLM appended to a request in one output (in order).
    pub fn on_tokens(&mut self, now_ms: f64, handle: ReqHandle, token_ids: &[u32]) -> Result<()> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        let stall_factor = self.config.stall_factor;
        let markers = &self.markers;
        let classes = &self.config.classes;
        let slot = self.slots.get_mut(handle.slot()).filter(|s| s.generation == handle.generation());
        let request =
            slot.and_then(|s| s.request.as_mut()).ok_or(Error::UnknownRequest { handle: handle.0 })?;
        let stall_gap_ms = stall_factor * classes[request.class.index()].targets.answer_tpot_ms;
        for &token in token_ids {
            let kind = request.tracker.on_token(markers, token);
            request.ledger.on_token(now_ms, kind, stall_gap_ms);
        }
        let started = request.num_output_tokens == 0 && !token_ids.is_empty() && !request.probe;
        request.num_output_tokens = request.num_output_tokens.saturating_add(token_ids.len() as u32);
        if !token_ids.is_empty() {
            request.preempted = false;
        }
        if started {
            self.start_rate.record(now_ms);
        }
        self.refresh_hot(handle);
        Ok(())
    }

    /// Records the end of a step's execution (its output reached the scheduler at `now_ms`) and
    /// folds the measured duration into the step-time model. The step started when both it was
    /// scheduled and the previous output had arrived: `max(scheduled_at, previous output)`.
    /// Returns that measured duration exactly when it was folded in — the step matches a plan
    /// still pending (an older or unknown `step_id` matches none), it executed something
    /// (`shape` has prefill tokens or decoding requests) and the duration is non-negative — and
    /// `None` otherwise.
    pub fn on_step_output(&mut self, now_ms: f64, step_id: u64, shape: StepShape) -> Result<Option<f64>> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        while self.pending_steps.front().is_some_and(|p| p.step_id < step_id) {
            self.pending_steps.pop_front();
        }
        let pending = match self.pending_steps.front() {
            Some(p) if p.step_id == step_id => self.pending_steps.pop_front(),
            _ => None,
        };
        let mut measured_ms = None;
        if let Some(p) = pending {
            // A step's time is what a deadline sees of it: from the previous output while the
            // engine held requests then — it went straight on, so what it did between the two
            // (its outputs to the API server, scheduling; under synchronous scheduling, as on
            // vLLM's CPU build, a third of the loop's time measured on 2 cores) is part of every
            // step — else from when it was scheduled. Under async scheduling the step was
            // scheduled before the previous output, and that output is its start either way.
            let started_ms = match self.last_output_ms {
                Some(last) if self.busy_after_last_output => last,
                Some(last) => last.max(p.scheduled_at_ms),
                None => p.scheduled_at_ms,
            };
            let executed = shape.num_prefill_tokens > 0 || shape.num_decode_requests > 0;
            if executed && now_ms >= started_ms && now_ms >= p.scheduled_at_ms {
                let duration_ms = now_ms - started_ms;
                self.step_model.observe(StepSample { shape, duration_ms });
                self.stats.num_step_samples += 1;
                self.last_step_shape = Some(shape);
                measured_ms = Some(duration_ms);
            }
        }
        self.last_output_ms = Some(now_ms);
        self.busy_after_last_output = !self.by_req_id.is_empty();
        Ok(measured_ms)
    }

    /// Stops tracking a request and reports what it did. `finish_reason` is vLLM's finish reason
    /// as vLLM names it (`stop`, `length`, `abort`, `error`; [`FinishReason::from_vllm`]) and
    /// `output_token_ids` the request's full output as vLLM holds it now: the tokens beyond the
    /// [`Self::num_output_tokens`] already seen are fed first, at `now_ms`, exactly as
    /// [`Self::on_tokens`] would (nothing when the list is not longer).
    ///
    /// A reason the core does not know never fails and never loses the request: it is released
    /// and reported as [`FinishReason::Error`] with the string in
    /// [`FinishedRequest::unknown_finish_reason`], counted in
    /// [`SchedulerStats::num_unknown_finish_reasons`], and neither length predictor learns from
    /// it. Only a bad `now_ms` or a handle that is not live fails, and then nothing changes.
    pub fn finish(
        &mut self,
        now_ms: f64,
        handle: ReqHandle,
        finish_reason: &str,
        output_token_ids: &[u32],
    ) -> Result<FinishedRequest> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        let num_seen = self.get(handle)?.num_output_tokens as usize;
        if let Some(unseen) = output_token_ids.get(num_seen..).filter(|tail| !tail.is_empty()) {
            self.on_tokens(now_ms, handle, unseen)?;
        }
        let (reason, unknown_finish_reason) = match FinishReason::from_vllm(finish_reason) {
            Some(reason) => (reason, None),
            None => (FinishReason::Error, Some(finish_reason.to_owned())),
        };
        let slot = &mut self.slots[handle.slot()];
        let mut request = slot.request.take().ok_or(Error::UnknownRequest { handle: handle.0 })?;
        slot.generation = slot.generation.wrapping_add(1);
        self.hot[handle.slot()].live = false;
        self.free_slots.push(handle.slot() as u32);
        self.by_req_id.remove(&request.req_id);

        let end_ms = request.ledger.last_token_ms.unwrap_or(request.ledger.arrival_ms);
        request.ledger.finish_ms = Some(now_ms.max(end_ms));
        request.tracker.finish();
        let targets = self.config.classes[request.class.index()].targets;
        let metrics = request.ledger.metrics();
        if request.probe {
            return Ok(FinishedRequest {
                attainment: Attainment::judge(&metrics, &targets),
                metrics,
                never_reusable_from_token: None,
                shed: None,
                reason,
                unknown_finish_reason,
                class: request.class,
                ledger: request.ledger,
                req_id: request.req_id,
            });
        }
        let counters = &mut self.class_counters[request.class.index()];
        counters.record(&request.ledger, reason, &targets);
        if let Some(shed) = request.shed {
            counters.num_shed[shed as usize] += 1;
        }
        if reason.completed() {
            let met = Attainment::judge(&request.ledger.metrics(), &targets).ttfat;
            let recent = &mut self.recent_ttfat_attainment[request.class.index()];
            *recent = Some(blend_attainment(*recent, met));
        }
        if unknown_finish_reason.is_none() {
            // Nothing is known about how an unknown reason ended the request: learn nothing.
            self.learn_lengths(&request, reason);
        }
        let never_reusable_from_token = self.never_reusable_from(&request);
        self.stats.num_finished += 1;
        self.stats.num_unknown_finish_reasons += u64::from(unknown_finish_reason.is_some());
        self.stats.num_reasoning_evictions += u64::from(never_reusable_from_token.is_some());
        Ok(FinishedRequest {
            attainment: Attainment::judge(&metrics, &targets),
            metrics,
            never_reusable_from_token,
            shed: request.shed,
            reason,
            unknown_finish_reason,
            class: request.class,
            ledger: request.ledger,
            req_id: request.req_id,
        })
    }

    // ---- ordering -------------------------------------------------------------------------

    fn order_running(&mut self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        self.order_by(
            running,
            #[inline(always)]
            |core, h| core.running_step_key(now_ms, h, step_ms),
        )
    }

    /// [`Self::running_key`] for the step being scheduled: a request computing its tokens again
    /// after a preemption (none has come since) goes after the requests of its phase that
    /// decode — an answering one after the decoding answers, a thinking one after every decode —
    /// and before new prompts, more sunk work first. vLLM gives the step's budget to the running
    /// requests in this order, each up to what it still has to compute: ahead of them, a
    /// recompute took the whole budget for step after step and left every answer without its
    /// token (measured: 308 ms answer gaps, 7 stalls on a Mooncake scenario).
    #[inline(always)]
    fn running_step_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.hot(handle);
        if self.config.policy == Policy::Meridian && r.preempted && !r.shed {
            let more_sunk_first = u64::from(u32::MAX - (r.num_tokens - self.restorable_tokens(r)));
            let group = if r.phase == Phase::Answer { 0 } else { 2 };
            return (group, u64::MAX, more_sunk_first);
        }
        self.running_key(now_ms, handle, step_ms)
    }

    fn order_waiting(&mut self, now_ms: f64, waiting: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        let mut order = self.order_by(
            waiting,
            #[inline(always)]
            |core, h| core.waiting_key(now_ms, h, step_ms, false),
        );
        self.rerank_by_prefix(now_ms, waiting, &mut order, step_ms);
        order
    }

    /// Prefix-aware admission on the head of the waiting order: the first
    /// [`PREFIX_AFFINITY_WINDOW`] entries (those that can be admitted soon) are ordered again with
    /// the cached-prefix part of their keys ([`Self::affinity_key`]), a stable sort, so the rest of
    /// the queue keeps its order and the cost stays bounded whatever the queue's length (SGLang's
    /// longest-prefix-match likewise falls back to FCFS on long queues).
    fn rerank_by_prefix(&self, now_ms: f64, waiting: &[ReqHandle], order: &mut [u32], step_ms: f64) {
        if !self.wants_block_events() || self.prefix_index.is_empty() {
            return;
        }
        let window = order.len().min(PREFIX_AFFINITY_WINDOW);
        let head = &mut order[..window];
        let mut keyed: Vec<(OrderKey, u32)> =
            head.iter().map(|&i| (self.waiting_key(now_ms, waiting[i as usize], step_ms, true), i)).collect();
        keyed.sort_by_key(|&(key, _)| (key.0, key.1));
        for (slot, (_, i)) in head.iter_mut().zip(keyed) {
            *slot = i;
        }
    }

    fn order_by(&mut self, handles: &[ReqHandle], key: impl Fn(&Self, ReqHandle) -> OrderKey) -> Vec<u32> {
        if handles.len() > MAX_FAST_SORT_LEN {
            let mut keys: Vec<u128> =
                handles.iter().enumerate().map(|(i, &h)| pack_exact(key(self, h), i as u32)).collect();
            keys.sort_unstable();
            return keys.iter().map(|&k| k as u32).collect();
        }
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.clear();
        keys.extend(handles.iter().enumerate().map(|(i, &h)| pack_fast(key(self, h), i as u32)));
        // The shim hands back lists in the previous plan's order, so they arrive nearly sorted:
        // the run-detecting stable sort is close to linear on them.
        keys.sort();
        let order = keys.iter().map(|&k| (k & 0xFFFF) as u32).collect();
        self.scratch_keys = keys;
        order
    }

    /// Answer queue by next-token deadline; then thinking by slack while the TTFAT deadline is
    /// still reachable; then thinking that can no longer make it (best effort), most sunk work
    /// first; then prompts being computed, by slack, late ones last. Every decode comes before
    /// every prompt chunk (Sarathi-Serve's stall-free rule): vLLM fills the budget in this order
    /// and a long chunk takes all of it, so a late thinker placed after the chunks would skip
    /// most steps while long prompts stream in — measured on the Mooncake replay, the longest
    /// thinkers thought at half speed and TTFAT p99 rose 30 % above FCFS's. The last entry
    /// (vLLM's victim) is then a prompt still being computed, the least work lost, or when none
    /// is, the late thinker with the least sunk work.
    #[inline(always)]
    fn running_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.hot(handle);
        match self.config.policy {
            Policy::Meridian => {}
            Policy::AnswerFirst => return (u64::from(r.phase != Phase::Answer), sortable(r.arrival_ms), 0),
            // Round robin within each phase: the request served longest ago goes first.
            Policy::Pascal => return (u64::from(r.phase == Phase::Answer), sortable(r.last_token_ms), 0),
            Policy::UniBoost => return (0, sortable(self.boosted_arrival_ms(r)), 0),
            Policy::Scorpio => return (0, sortable(r.arrival_ms), 0),
        }
        if r.shed {
            // The shim ends it before vLLM schedules the step: last, out of everyone's way.
            return (7, 0, 0);
        }
        let targets = self.targets(r.class);
        let restorable = self.restorable_tokens(r);
        // Sunk work is what a preemption would throw away: a prefix a tier gives back is kept.
        let more_sunk_first = u32::MAX - (r.num_tokens - restorable);
        let sunk_key = u64::from(more_sunk_first);
        if r.phase == Phase::Answer {
            return (
                0,
                sortable(self.next_answer_deadline_ms(r, &targets)),
                u64::from(sortable32(r.arrival_ms)),
            );
        }
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        let viable = self.judged(handle).is_none();
        match (r.has_started, viable) {
            (true, true) => (1, sortable(slack_ms), sunk_key),
            (true, false) if now_ms - r.arrival_ms >= self.late_think_bound_ms(&targets) => {
                (2, sunk_key << 32, u64::from(sortable32(r.arrival_ms)))
            }
            (true, false) => (5, sunk_key << 32, u64::from(sortable32(r.arrival_ms))),
            (false, true) => (3, sortable(slack_ms), sunk_key),
            (false, false) => (4, sortable(-slack_ms), sunk_key),
        }
    }

    /// The step-time model's time to compute `num_tokens` of prompt (a first prefill, or the
    /// recompute of a preempted request's tokens).
    #[inline]
    fn prefill_ms(&self, num_tokens: u32) -> f64 {
        self.step_model.predict_ms(StepShape { num_prefill_tokens: num_tokens, ..StepShape::default() })
    }

    /// Tokens of a running request's context a tier would give back if it were preempted now:
    /// its stored prefix when a resume would load rather than recompute it, else none.
    #[inline]
    fn restorable_tokens(&self, r: &Hot) -> u32 {
        let stored = r.num_stored_tokens;
        if stored > 0 && f64::from(stored) > self.min_restore_tokens[usize::from(r.stored_tier)] {
            stored
        } else {
            0
        }
    }

    /// Engine time a preemption's resume saves when `restorable` tokens load instead of being
    /// recomputed (0 without a tier).
    #[inline]
    fn tier_savings_ms(&self, r: &Hot, restorable: u32) -> f64 {
        if restorable == 0 {
            return 0.0;
        }
        let load_ms_per_token =
            self.kv_tiers.load_ms_per_token(TierId(r.stored_tier)).unwrap_or(f64::INFINITY);
        let per_token_ms = self.step_model.coefficients().per_prefill_token_ms - load_ms_per_token;
        (f64::from(restorable) * per_token_ms).max(0.0)
    }

    /// Recomputes the per-tier restore bounds for this plan from the step-time model, pricing
    /// the extra step a load takes as [`Self::plan_restore`] does.
    fn refresh_restore_bounds(&mut self) {
        let shape =
            self.last_step_shape.unwrap_or(StepShape { num_decode_requests: 1, ..StepShape::default() });
        let step_ms = self.step_model.predict_ms(shape);
        let prefill_ms_per_token = self.step_model.coefficients().per_prefill_token_ms;
        let num_tiers = self.kv_tiers.num_tiers();
        for (i, bound) in self.min_restore_tokens.iter_mut().enumerate().take(num_tiers) {
            *bound = self.kv_tiers.min_restore_tokens(
                TierId(i as u8),
                step_ms,
                prefill_ms_per_token,
                shape.num_decode_requests,
            );
        }
    }

    /// How long a late thinker yields its decode to prompt chunks: until it has been in the
    /// system `1 + late_think_ttfat_factor` times its class's TTFAT target.
    #[inline]
    fn late_think_bound_ms(&self, targets: &SloTargets) -> f64 {
        (1.0 + self.config.late_think_ttfat_factor) * targets.ttfat_ms
    }

    #[inline]
    fn next_answer_deadline_ms(&self, r: &Hot, targets: &SloTargets) -> f64 {
        let last_ms = r.last_token_ms;
        let next_ms = last_ms + targets.answer_tpot_ms;
        if !r.has_answered {
            next_ms.min(r.arrival_ms + targets.ttfat_ms)
        } else {
            next_ms
        }
    }

    /// Time to spare before the request's next milestone, given the expected remaining work:
    /// the TTFAT deadline after the expected remaining thinking, and the TTFT deadline for a
    /// request that has not produced a token yet.
    #[inline(always)]
    fn think_slack_ms(&self, now_ms: f64, r: &Hot, targets: &SloTargets, step_ms: f64) -> f64 {
        let expected_think_tokens = self.expected_think_tokens(r);
        let ttfat_slack = r.arrival_ms + targets.ttfat_ms - now_ms - (expected_think_tokens + 1.0) * step_ms;
        if !r.has_started {
            let prefill_ms = self.prefill_ms(r.num_tokens);
            let ttft_slack = r.arrival_ms + targets.ttft_ms - now_ms - prefill_ms;
            ttfat_slack.min(ttft_slack)
        } else {
            ttfat_slack
        }
    }

    /// The median of the request's remaining thinking given what it has already thought (the
    /// mean of a heavy tail is dominated by the few longest and would judge most requests late
    /// long before they are); 0 for a request that does not reason.
    #[inline(always)]
    fn expected_think_tokens(&self, r: &Hot) -> f64 {
        if r.is_reasoning && r.num_think_tokens == 0 {
            // Every waiting request: the class's value, read once per plan.
            self.fresh_think_p50_tokens[r.class.index()]
        } else if r.is_reasoning {
            self.lengths[r.class.index()].think.remaining_quantile(r.num_think_tokens, Quantile::P50)
        } else {
            0.0
        }
    }

    /// Preempted requests first (in running order), then requests waiting past the starvation
    /// bound (oldest first), then by aged class rank and urgency. Urgency is the slack while the
    /// request can still make its targets (least slack first: earliest deadline); a request
    /// expected to miss loses priority gradually — it is ordered as if its slack were its
    /// lateness — but never further back than its class's TTFT target, so within its rank it
    /// always goes ahead of requests with more slack than that. Why not a cliff: a hard "hopeless
    /// → best effort" rule leaves late requests waiting behind every on-time one until the
    /// starvation bound (measured: interactive TTFT p90 63 s on a held-out trace); why not plain
    /// earliest-deadline-first: under overload the late requests would take the capacity and
    /// make everyone late (EDF collapse). Among late requests at the bound, the oldest goes first.
    #[inline(always)]
    fn waiting_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64, with_affinity: bool) -> OrderKey {
        let r = self.hot(handle);
        match self.config.policy {
            Policy::Meridian => {}
            // vLLM's own order: preempted requests (back at the head) first, then arrival.
            Policy::AnswerFirst | Policy::Pascal => {
                return (u64::from(!r.preempted), sortable(r.arrival_ms), 0)
            }
            Policy::UniBoost => return (0, sortable(self.boosted_arrival_ms(r)), 0),
            Policy::Scorpio => return self.scorpio_waiting_key(now_ms, r),
        }
        if r.shed {
            // The shim ends it before vLLM schedules the step: behind everyone, never admitted.
            return (7, u64::MAX, 0);
        }
        if r.preempted {
            return self.running_key(now_ms, handle, step_ms);
        }
        let waited_ms = (now_ms - r.waiting_since_ms).max(0.0);
        let targets = self.targets(r.class);
        let late_bound_ms =
            (self.config.late_wait_ttft_factor * targets.ttft_ms).min(self.config.starvation_ms);
        if waited_ms >= self.config.starvation_ms {
            return (6, sortable(r.arrival_ms), 0);
        }
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        if self.judged(handle).is_some() {
            if waited_ms >= late_bound_ms {
                return (6, sortable(r.arrival_ms), 0);
            }
            // Behind every request that can still make it, nearest its bound first.
            return (
                7,
                u64::from(u8::MAX) << 56 | sortable(late_bound_ms - waited_ms) >> 8,
                u64::from(sortable32(r.arrival_ms)),
            );
        }
        let fcfs_factor = self.config.overload.fcfs_slack_ttft_factor;
        let safe = fcfs_factor > 0.0 && slack_ms >= fcfs_factor * targets.ttft_ms;
        let (rank, urgency) = if safe {
            // Safely inside its targets: arrival order, behind every request with less slack
            // (light load: no class's slack is spent for another's small gain).
            (SAFE_RANK, r.arrival_ms)
        } else {
            let rank = self.class_table[r.class.index()].1.min(SAFE_RANK - 1);
            // Value density only where the requests it passes over may be shed: under `queue`
            // every request is served anyway, and the cheap ones first only bring many to
            // their answers together (measured on the scripted KV-pressure scenario).
            let density = self.config.overload.waiting_order == WaitingOrder::ValueDensity
                && self.class_triage[r.class.index()] == OnOverload::Shed;
            // Highest density first: the key sorts ascending.
            let urgency = if density { -self.value_density(now_ms, r, &targets, step_ms) } else { slack_ms };
            (rank.saturating_sub((waited_ms * self.inv_aging_ms).min(255.0) as u8), urgency)
        };
        let rank = u64::from(rank);
        if let Some(affinity) = with_affinity.then(|| self.affinity_key(r, &targets, slack_ms)).flatten() {
            // Within the rank: requests within their slack guard by urgency, then the others
            // with the longest cached prefix first, by urgency among equals.
            let primary = rank << 56 | affinity << 50 | sortable(urgency) >> 14;
            return (7, primary, u64::from(sortable32(r.arrival_ms)));
        }
        (7, rank << 56 | sortable(urgency) >> 8, u64::from(sortable32(r.arrival_ms)))
    }

    /// The probability that a waiting request meets its TTFAT target if admitted now, per
    /// millisecond of engine time it is expected to take (its prefill, then its median remaining
    /// thinking and answer at `step_ms` a token). Why per engine time: while the work does not
    /// fit, each admission displaces others; two cheap likely requests finish on time where one
    /// long one would (the value density of a knapsack's greedy order). Why the probability and
    /// not the slack: a request far from its deadline but with a long expected thinking is
    /// worth little once its chance is gone, one close to it but short still finishes.
    #[inline]
    fn value_density(&self, now_ms: f64, r: &Hot, targets: &SloTargets, step_ms: f64) -> f64 {
        let prefill_ms = if r.has_started { 0.0 } else { self.prefill_ms(r.num_tokens) };
        let lengths = &self.lengths[r.class.index()];
        let prob = if r.is_reasoning && r.phase != Phase::Answer {
            let left_ms = r.arrival_ms + targets.ttfat_ms - now_ms - prefill_ms;
            // One decode step produces the first answer token after the thinking ends.
            lengths.think.prob_within(r.num_think_tokens, left_ms / step_ms - 1.0)
        } else {
            1.0
        };
        let think_tokens = if r.phase == Phase::Answer { 0.0 } else { self.expected_think_tokens(r) };
        let answer_tokens = lengths.answer.remaining_quantile(r.num_answer_tokens, Quantile::P50);
        let cost_ms = prefill_ms + (think_tokens + answer_tokens) * step_ms;
        prob / cost_ms.max(f64::MIN_POSITIVE)
    }

    /// UniBoost's key: the arrival pushed back by the work the request has made known (prompt and
    /// output so far) at γ tokens per second.
    #[inline]
    fn boosted_arrival_ms(&self, r: &Hot) -> f64 {
        r.arrival_ms + f64::from(r.num_tokens) * self.uniboost_ms_per_token
    }

    /// SCORPIO's TTFT guard: preempted requests first (vLLM's own rule), then least TTFT deadline
    /// first among requests that can still make it, then the unattainable ones (SCORPIO's
    /// rejections, queued last), also by deadline.
    fn scorpio_waiting_key(&self, now_ms: f64, r: &Hot) -> OrderKey {
        if r.preempted {
            return (0, sortable(r.arrival_ms), 0);
        }
        let deadline_ms = r.arrival_ms + self.targets(r.class).ttft_ms;
        let prefill_ms = self.prefill_ms(r.num_tokens);
        let attainable = now_ms + prefill_ms <= deadline_ms;
        (if attainable { 1 } else { 2 }, sortable(deadline_ms), 0)
    }

    // ---- admission and budget -------------------------------------------------------------

    /// One pass over `running` for everything the budget and the reserve need.
    fn running_load(&self, now_ms: f64, running: &[ReqHandle]) -> RunningLoad {
        let block_size = u64::from(self.limits.block_size);
        let mut load = RunningLoad {
            num_context_tokens: 0,
            num_answering: 0,
            num_decoding: 0,
            num_reserved_blocks: 0,
            answer_tpot_ms: f64::INFINITY,
            least_banked_ms: f64::INFINITY,
            any_tpot_ms: f64::INFINITY,
        };
        let mut reserve = 0u64;
        for &h in running {
            let r = self.hot(h);
            let num_tokens = u64::from(r.num_tokens);
            load.num_context_tokens += num_tokens;
            load.num_decoding += u32::from(r.has_started);
            let tpot_ms = self.class_table[r.class.index()].0.answer_tpot_ms;
            load.any_tpot_ms = load.any_tpot_ms.min(tpot_ms);
            let left_by_limit = u64::from(r.max_tokens.saturating_sub(r.num_output_tokens));
            if r.phase != Phase::Answer {
                let fraction = self.config.think_kv_reserve;
                if fraction > 0.0 {
                    // Thinking requests will need room for the rest of their thinking and their
                    // whole answer; hold back a fraction of it so admissions do not push them out.
                    let lengths = &self.lengths[r.class.index()];
                    let expected =
                        lengths.think.expected_remaining(r.num_think_tokens) + lengths.answer.mean();
                    let growth = ceil_tokens(expected * fraction).min(left_by_limit);
                    reserve += (num_tokens + growth).div_ceil(block_size) - num_tokens.div_ceil(block_size);
                }
                continue;
            }
            load.num_answering += 1;
            load.answer_tpot_ms = load.answer_tpot_ms.min(tpot_ms);
            // n tokens so far over `spent`; the step in flight adds one at the decode step, this
            // step one more: (spent + decode + x) / (n + 1) ≤ target.
            let target_ms = tpot_ms * self.config.tpot_headroom;
            let spent_ms = if r.has_answered { now_ms - r.first_answer_ms } else { 0.0 };
            let banked_ms =
                target_ms * (f64::from(r.num_answer_tokens) + 1.0) - spent_ms - self.last_decode_step_ms;
            load.least_banked_ms = load.least_banked_ms.min(banked_ms);
            if self.config.answer_kv_reserve {
                // Blocks this answer is expected to need before it finishes.
                let expected =
                    ceil_tokens(self.lengths[r.class.index()].answer.expected_remaining(r.num_answer_tokens));
                let growth = expected.min(left_by_limit);
                reserve += (num_tokens + growth).div_ceil(block_size) - num_tokens.div_ceil(block_size);
            }
        }
        load.num_reserved_blocks = reserve.min(u64::from(u32::MAX)) as u32;
        load
    }

    /// Preemption on arrival (nano-vllm-qos; vLLM #40004, where vLLM never preempts running work
    /// to admit a waiting request): when the most urgent waiting request cannot be admitted (no
    /// seat, or not enough KV blocks), has not started, and has waited through half of its
    /// class's TTFT target, running requests of a lower class make room — thinking or still
    /// prefilling ones only, never an answering one; most slack net of their recompute cost
    /// (the step-time model's time to recompute their tokens) first; none preempted on arrival
    /// within `min_interval_ms` of the last time; at most `max_per_step`. Returns the victims'
    /// indices into `running` (ascending) and the blocks they free.
    fn arrival_victims(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        order: &[u32],
        blocks_available: u32,
        step_ms: f64,
    ) -> (Vec<u32>, u32) {
        let rule = self.config.arrival_preemption;
        let Some(&head) = order.first() else { return (Vec::new(), 0) };
        if !rule.enabled || self.config.policy != Policy::Meridian {
            return (Vec::new(), 0);
        }
        let w = self.hot(waiting[head as usize]);
        if w.shed {
            return (Vec::new(), 0);
        }
        let block_size = u64::from(self.limits.block_size);
        let need_blocks = (u64::from(w.num_tokens) + 1).div_ceil(block_size);
        let need_seat = running.len() >= self.limits.max_num_seqs as usize;
        let mut missing_blocks = need_blocks.saturating_sub(u64::from(blocks_available));
        let (w_rank, w_targets) = (self.class_table[w.class.index()].1, self.targets(w.class));
        let waited_ms = now_ms - w.arrival_ms;
        if w.has_started
            || w.preempted
            || (!need_seat && missing_blocks == 0)
            || waited_ms < 0.5 * w_targets.ttft_ms
        {
            return (Vec::new(), 0);
        }
        // Pick the victims one at a time, best first (at most `max_per_step`, a handful): no
        // allocation and no sort on a path that runs every step while the head waits.
        let mut victims = Vec::new();
        let mut freed = 0u64;
        while (victims.len() as u32) < rule.max_per_step && (victims.is_empty() || missing_blocks > 0) {
            let Some((i, blocks)) = self.best_arrival_victim(now_ms, running, w_rank, &victims, step_ms)
            else {
                break;
            };
            victims.push(i);
            freed += blocks;
            missing_blocks = missing_blocks.saturating_sub(blocks);
        }
        if missing_blocks > 0 {
            // The victims allowed would not make room: preempting them would only waste work.
            return (Vec::new(), 0);
        }
        for &i in &victims {
            let h = running[i as usize];
            if let Some(r) = self.slots[h.slot()].request.as_mut() {
                r.arrival_preempted_ms = Some(now_ms);
                self.class_counters[r.class.index()].num_arrival_preemptions += 1;
            }
            self.refresh_hot(h);
        }
        self.stats.num_arrival_preemptions += victims.len() as u64;
        victims.sort_unstable();
        (victims, freed.min(u64::from(u32::MAX)) as u32)
    }

    /// The running request of a class below `w_rank`, not answering, not rested, not already in
    /// `taken`, with the most slack net of its recompute cost (ties to the later position,
    /// vLLM's own victim end); with the blocks it would free.
    fn best_arrival_victim(
        &self,
        now_ms: f64,
        running: &[ReqHandle],
        w_rank: u8,
        taken: &[u32],
        step_ms: f64,
    ) -> Option<(u32, u64)> {
        let min_interval_ms = self.config.arrival_preemption.min_interval_ms;
        let block_size = u64::from(self.limits.block_size);
        let mut best: Option<(f64, u32, u64)> = None;
        for (i, &h) in running.iter().enumerate() {
            let r = self.hot(h);
            let eligible = self.class_table[r.class.index()].1 > w_rank
                && !r.shed
                && r.phase != Phase::Answer
                && now_ms - r.arrival_preempted_ms >= min_interval_ms
                && !taken.contains(&(i as u32));
            if !eligible {
                continue;
            }
            // What the victim loses: its recompute, less what a tier gives back.
            let recompute_ms =
                self.prefill_ms(r.num_tokens) - self.tier_savings_ms(r, self.restorable_tokens(r));
            let net_ms = self.think_slack_ms(now_ms, r, &self.targets(r.class), step_ms) - recompute_ms;
            if best.is_none_or(|(b, _, _)| net_ms >= b) {
                best = Some((net_ms, i as u32, u64::from(r.num_tokens).div_ceil(block_size)));
            }
        }
        best.map(|(_, i, blocks)| (i, blocks))
    }

    /// How many requests at the head of `order` to admit this step. Under `meridian` a request
    /// whose KV does not fit the free blocks now holds up none behind it that fit (they move
    /// ahead of it in `order`, which keeps its place otherwise) — measured: a preempted 855-token
    /// thinker at the head, one block short, kept twelve seats and 27 free blocks idle for 0.9 s
    /// while interactive requests behind it were shed for their TTFT — until it has waited
    /// `starvation_ms`, when it blocks again so it cannot be passed over for ever.
    #[allow(clippy::too_many_arguments)]
    fn num_admissible(
        &self,
        now_ms: f64,
        waiting: &[ReqHandle],
        order: &mut [u32],
        num_free_blocks: u32,
        num_reserved_blocks: u32,
        num_running: usize,
        load: &RunningLoad,
    ) -> u32 {
        let seats = (self.limits.max_num_seqs as usize).saturating_sub(num_running);
        match self.config.policy {
            Policy::Meridian => {}
            Policy::Scorpio => {
                return self.virtual_batch_admissible(waiting, order, seats, num_running, load)
            }
            // The other baselines admit like stock vLLM: whatever its KV check lets in.
            Policy::AnswerFirst | Policy::Pascal | Policy::UniBoost => return order.len().min(seats) as u32,
        }
        let mut blocks_left = u64::from(num_free_blocks.saturating_sub(num_reserved_blocks));
        let block_size = u64::from(self.limits.block_size);
        let tpot_guard = self.config.overload.tpot_guard;
        let headroom = self.config.tpot_headroom;
        let (mut shape, mut tpot_ms) = (load.decodes(), load.any_tpot_ms);
        let mut admitted = 0usize;
        let mut passed_over: Vec<usize> = Vec::new();
        for (position, &i) in order.iter().enumerate() {
            if admitted == seats {
                break;
            }
            let r = self.hot(waiting[i as usize]);
            if r.shed {
                break; // shed requests are last: nothing after them is admitted either
            }
            // One block more than the tokens need: the first decode step must fit too.
            let need = (u64::from(r.num_tokens) + 1).div_ceil(block_size);
            if need > blocks_left {
                if now_ms - r.waiting_since_ms >= self.config.starvation_ms {
                    break;
                }
                passed_over.push(position);
                continue;
            }
            if tpot_guard {
                // SCORPIO's virtual batch size: the decode step with it must still meet the
                // tightest answer TPOT target among the batch.
                shape.num_decode_requests += 1;
                shape.num_context_tokens += u64::from(r.num_tokens);
                tpot_ms = tpot_ms.min(self.targets(r.class).answer_tpot_ms);
                if self.step_model.predict_ms(shape) > tpot_ms * headroom {
                    break;
                }
            }
            blocks_left -= need;
            admitted += 1;
        }
        if admitted > 0 && !passed_over.is_empty() {
            // The admitted ones first, in their order; the passed-over ones right behind them.
            let last = passed_over.len() + admitted;
            let (mut head, mut behind) = (Vec::with_capacity(last), Vec::with_capacity(passed_over.len()));
            for (position, &i) in order[..last].iter().enumerate() {
                if passed_over.binary_search(&position).is_ok() {
                    behind.push(i)
                } else {
                    head.push(i)
                }
            }
            head.extend(behind);
            order[..last].copy_from_slice(&head);
        }
        let admissible = order.iter().take_while(|&&i| !self.hot(waiting[i as usize]).shed).count();
        at_least_one_when_idle(admitted as u32, num_running, admissible, seats)
    }

    /// SCORPIO's TPOT guard (virtual batch size): admit from the head of `order` while the decode
    /// step the running requests and the admitted ones would make stays within the tightest answer
    /// TPOT target among them (with the configured headroom), by the step-time model; at least
    /// one when nothing runs, so the engine never wedges. vLLM's KV check still applies.
    fn virtual_batch_admissible(
        &self,
        waiting: &[ReqHandle],
        order: &[u32],
        seats: usize,
        num_running: usize,
        load: &RunningLoad,
    ) -> u32 {
        let headroom = self.config.tpot_headroom;
        let mut shape = load.decodes();
        let mut tpot_ms = load.any_tpot_ms;
        let mut admitted = 0u32;
        for &i in order.iter().take(seats) {
            let r = self.hot(waiting[i as usize]);
            shape.num_decode_requests += 1;
            shape.num_context_tokens += u64::from(r.num_tokens);
            tpot_ms = tpot_ms.min(self.targets(r.class).answer_tpot_ms);
            if self.step_model.predict_ms(shape) > tpot_ms * headroom {
                break;
            }
            admitted += 1;
        }
        at_least_one_when_idle(admitted, num_running, order.len(), seats)
    }

    /// Sarathi-style stall-free budget: while anyone answers, the step must fit the tightest
    /// answer TPOT target; otherwise thinking and prefill may use `think_batch_multiplier` × it.
    fn token_budget(&self, load: &RunningLoad) -> u32 {
        if self.config.policy != Policy::Meridian {
            return self.limits.max_num_batched_tokens;
        }
        let headroom = self.config.tpot_headroom;
        let target_ms = if load.num_answering > 0 {
            // A step may spend what every answer has banked below its mean-TPOT target (less the
            // step in flight), never less than the target itself nor a stall's length.
            let tpot_ms = load.answer_tpot_ms * headroom;
            let stall_ms = self.config.stall_factor * tpot_ms * STALL_MARGIN;
            load.least_banked_ms.clamp(tpot_ms, stall_ms.max(tpot_ms))
        } else {
            let any_tpot_ms = if load.any_tpot_ms.is_finite() {
                load.any_tpot_ms
            } else {
                self.targets(self.config.default_class).answer_tpot_ms
            };
            any_tpot_ms * headroom * self.config.think_batch_multiplier
        };
        // Every running decode gets its token (Sarathi-Serve's stall-free batching: cutting a
        // decode saves next to nothing on a memory-bound step and stalls its stream); prompt
        // chunks fill what is left of the target, never less than the floor.
        let prefill_tokens = self.step_model.prefill_tokens_within(target_ms, load.decodes());
        let budget =
            u64::from(load.num_decoding) + u64::from(prefill_tokens.max(self.config.min_token_budget));
        budget.min(u64::from(self.limits.max_num_batched_tokens)) as u32
    }

    /// PASCAL's token pacer: an answering request that has already shown its first answer token
    /// skips the step unless its next token would otherwise come later than the pace (its class's
    /// answer TPOT target with the configured headroom). Its KV stays put; only the step's
    /// compute goes to reasoning instead.
    fn paced_out(&self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        if self.config.policy != Policy::Pascal {
            return Vec::new();
        }
        let headroom = self.config.tpot_headroom;
        running
            .iter()
            .enumerate()
            .filter(|&(_, &h)| {
                let r = self.hot(h);
                let pace_ms = self.targets(r.class).answer_tpot_ms * headroom;
                r.phase == Phase::Answer && r.has_answered && r.last_token_ms + pace_ms > now_ms + step_ms
            })
            .map(|(i, _)| i as u32)
            .collect()
    }

    // ---- bookkeeping ----------------------------------------------------------------------

    fn remember_step(&mut self, step: PendingStep) {
        if self.pending_steps.len() == MAX_PENDING_STEPS {
            self.pending_steps.pop_front();
        }
        self.pending_steps.push_back(step);
    }

    /// Hands each class's predictors what its unfinished requests have generated so far: the
    /// thinking of those still thinking (or waiting to), the answer of those answering — the
    /// censored observations that keep the first completions, the short ones, from passing for
    /// the whole distribution. Probes are no requests of the books.
    fn refresh_censored(&mut self, running: &[ReqHandle], waiting: &[ReqHandle]) {
        let mut think = std::mem::take(&mut self.censored_think);
        let mut answer = std::mem::take(&mut self.censored_answer);
        think.resize(self.lengths.len(), Vec::new());
        answer.resize(self.lengths.len(), Vec::new());
        think.iter_mut().chain(answer.iter_mut()).for_each(Vec::clear);
        for &h in running.iter().chain(waiting) {
            if self.slots[h.slot()].request.as_ref().is_some_and(|t| t.probe) {
                continue;
            }
            let r = self.hot(h);
            match r.phase {
                Phase::Answer => answer[r.class.index()].push(r.num_answer_tokens),
                _ if r.is_reasoning => think[r.class.index()].push(r.num_think_tokens),
                _ => {}
            }
        }
        for ((lengths, think), answer) in self.lengths.iter_mut().zip(&think).zip(&answer) {
            lengths.think.set_censored(think.iter().copied());
            lengths.answer.set_censored(answer.iter().copied());
        }
        self.censored_think = think;
        self.censored_answer = answer;
    }

    fn learn_lengths(&mut self, r: &Tracked, reason: FinishReason) {
        let think = (r.tracker.is_reasoning() && r.ledger.first_answer_ms.is_some())
            .then_some(r.ledger.num_think_tokens);
        self.learn(r.class, think, reason, r.ledger.num_answer_tokens);
    }

    /// One finished request's lengths: its thinking when it reached its answer (a request shed or
    /// aborted while thinking says only that it thought longer), its answer when it ended
    /// naturally — a length-capped answer is truncated and would teach lengths that are too short.
    fn learn(&mut self, class: ClassId, think_tokens: Option<u32>, reason: FinishReason, answer_tokens: u32) {
        let lengths = &mut self.lengths[class.index()];
        if let Some(think_tokens) = think_tokens {
            lengths.think.observe(think_tokens);
        }
        if reason == FinishReason::Stopped && answer_tokens > 0 {
            lengths.answer.observe(answer_tokens);
        }
    }

    /// Learns one finished request of an earlier run, as its request-log line gives it: its
    /// class's name, how it ended (the log's `reason`: `stopped`, `length`, `aborted`, `error`),
    /// whether it answered, and its thinking and answer tokens (a request that answered without
    /// thinking is taken for a non-reasoning one). The same rules as for the requests this core
    /// serves. Returns whether it taught anything: `false` for a class this configuration lacks
    /// (a log of another configuration). An unknown `reason` is an error naming it.
    pub fn learn_from_history(
        &mut self,
        slo_class: &str,
        reason: &str,
        answered: bool,
        num_think_tokens: u32,
        num_answer_tokens: u32,
    ) -> Result<bool> {
        let Some(class) = self.config.class_by_name(slo_class) else { return Ok(false) };
        let reason = FinishReason::ALL.into_iter().find(|r| r.name() == reason).ok_or_else(|| {
            Error::argument("reason", shown(reason), "not a finish reason of the request log")
        })?;
        let think = (answered && num_think_tokens > 0).then_some(num_think_tokens);
        self.learn(class, think, reason, num_answer_tokens);
        Ok(think.is_some() || (reason == FinishReason::Stopped && num_answer_tokens > 0))
    }

    fn never_reusable_from(&self, r: &Tracked) -> Option<u32> {
        if !r.tracker.is_reasoning() || self.config.policy != Policy::Meridian {
            return None;
        }
        match self.config.evict_reasoning_blocks {
            ReasoningBlockRule::Never => None,
            ReasoningBlockRule::UnlessToolCall if r.tracker.ended_in_tool_call() => None,
            _ => Some(r.reasoning_start),
        }
    }

    fn targets(&self, class: ClassId) -> SloTargets {
        self.class_table[class.index()].0
    }

    fn check_distinct(&mut self, running: &[ReqHandle], waiting: &[ReqHandle]) -> Result<()> {
        let words = self.slots.len().div_ceil(64);
        self.seen.clear();
        self.seen.resize(words, 0);
        for (list, &h) in running.iter().map(|h| ("running", h)).chain(waiting.iter().map(|h| ("waiting", h)))
        {
            if !self.hot.get(h.slot()).is_some_and(|hot| hot.live && hot.handle == h) {
                return Err(Error::UnknownRequest { handle: h.0 });
            }
            let (word, bit) = (h.slot() / 64, 1u64 << (h.slot() % 64));
            if self.seen[word] & bit != 0 {
                return Err(Error::argument(list, h.0, "request handle listed twice in running/waiting"));
            }
            self.seen[word] |= bit;
        }
        Ok(())
    }

    fn insert(&mut self, tracked: Tracked) -> ReqHandle {
        match self.free_slots.pop() {
            Some(slot) => {
                let entry = &mut self.slots[slot as usize];
                let handle = ReqHandle::new(slot, entry.generation);
                self.hot[slot as usize] = Hot::of(&tracked, handle);
                entry.request = Some(tracked);
                handle
            }
            None => {
                let slot = self.slots.len() as u32;
                let handle = ReqHandle::new(slot, 0);
                self.hot.push(Hot::of(&tracked, handle));
                self.slots.push(Slot { generation: 0, request: Some(tracked) });
                handle
            }
        }
    }

    fn get(&self, handle: ReqHandle) -> Result<&Tracked> {
        self.slots
            .get(handle.slot())
            .filter(|s| s.generation == handle.generation())
            .and_then(|s| s.request.as_ref())
            .ok_or(Error::UnknownRequest { handle: handle.0 })
    }

    fn get_mut(&mut self, handle: ReqHandle) -> Result<&mut Tracked> {
        self.slots
            .get_mut(handle.slot())
            .filter(|s| s.generation == handle.generation())
            .and_then(|s| s.request.as_mut())
            .ok_or(Error::UnknownRequest { handle: handle.0 })
    }

    /// The hot copy of a live request's scheduling state; only for handles already validated by
    /// [`Self::check_distinct`] in this call.
    #[inline]
    fn hot(&self, handle: ReqHandle) -> &Hot {
        &self.hot[handle.slot()]
    }

    /// Re-derives a slot's hot copy after its request changed (the one place that writes it).
    fn refresh_hot(&mut self, handle: ReqHandle) {
        if let Some(r) = self.slots.get(handle.slot()).and_then(|s| s.request.as_ref()) {
            self.hot[handle.slot()] = Hot::of(r, handle);
        }
    }
}

/// With nothing running nothing can free memory: let vLLM try the head itself, so a request
/// whose estimate is too pessimistic can never wedge the engine.
fn at_least_one_when_idle(admitted: u32, num_running: usize, num_waiting: usize, seats: usize) -> u32 {
    if admitted == 0 && num_running == 0 && num_waiting > 0 && seats > 0 {
        1
    } else {
        admitted
    }
}

/// `x.ceil() as u64` for a non-negative token estimate, without `ceil` (a library call on the
/// baseline x86-64 target, once per answering request per step); saturates like the cast.
#[inline]
fn ceil_tokens(x: f64) -> u64 {
    let whole = x as u64;
    whole + u64::from((whole as f64) < x)
}

/// [`sortable`] for a tie-break key, at f32 precision.
fn sortable32(x: f64) -> u32 {
    let bits = (x as f32).to_bits();
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
}

/// Maps a finite f64 onto u64 so that integer order is numeric order.
fn sortable(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

mod load;
mod overload;
mod prefix;
mod tiers;

pub use load::{ClassLoad, EngineLoad};
pub use overload::{parse_shed_notice, Shed, ShedNotice, ShedReason, SHED_MARKER};

#[cfg(test)]
mod state_machine;
#[cfg(test)]
mod tests;
