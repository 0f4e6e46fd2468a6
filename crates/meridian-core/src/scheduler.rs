//! [`Meridian`], the policy engine: it tracks every request vLLM hands the scheduler (phase, SLO
//! class, ledger) and, once per engine step, turns plain numbers into plain decisions — the order
//! of `running` (its last entry is vLLM's preemption victim), the order of `waiting`, how many
//! waiting requests may be admitted under the answer KV reserve, and the step's token budget.
//! The rules the shim would otherwise repeat live here once: a request's class is resolved when
//! it is added ([`Meridian::add_request`] returns it), a step's duration is measured when its
//! output arrives ([`Meridian::on_step_output`] returns it), and a request finishes with vLLM's
//! own finish reason and output tokens ([`Meridian::finish`] maps the one and feeds the unseen
//! tail of the other). This file holds the request lifecycle and the plan's sequence; each
//! decision lives in a room of its own: `policy` (what each policy does, [`PolicyTraits`]),
//! `order` (the sort keys of `running` and `waiting`), `admission` (admissions, arrival
//! preemption, the token budget, answer pacing), `overload` (triage: shed, degrade), `prefix`
//! (prefix-aware admission), `tiers` (restore or recompute, prefetch), `load` (what the engine
//! publishes) and `types` (the public vocabulary). Invariants: a live request has exactly one slot and one handle; a plan's
//! orders are permutations of the lists passed in (nothing lost or duplicated), total and
//! deterministic for the same state; the budget lies in `[1, max_num_batched_tokens]`; phases
//! only move forward; an unknown finish reason never fails or loses a request.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;

use hashbrown::HashMap;

use crate::config::{Config, ReasoningBlockRule};
use crate::error::{check_time_ms, shown, Error, Result};
use crate::handoff::{Handoffs, KvHandoff};
use crate::kv_tier::{KvTiers, TierSpan, MAX_TIERS};
use crate::ledger::{Attainment, ClassCounters, FinishReason, RequestLedger};
use crate::phase::{Phase, PhaseTracker, ReasoningMarkers};
use crate::predictor::{Quantile, ResidualLength};
use crate::prefix_index::PrefixIndex;
use crate::slo::{ClassId, OnOverload, SloTargets, WaitingOrder};
use crate::step_model::{StepCoefficients, StepSample, StepShape, StepTimeModel};
use crate::thinking::{FiredAt, StopReason, ThinkingControl};

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
    /// Its part in a prefill/decode hand-off ([`Meridian::set_kv_handoff`]).
    handoff: KvHandoff,
    /// When vLLM gave it the blocks its arriving KV is written into
    /// ([`Meridian::on_remote_kv_started`]), until the KV arrived.
    kv_arriving_since_ms: Option<f64>,
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
    /// The rule that ended its thinking, as the logits processor reported it
    /// ([`Meridian::on_thinking_stopped`]).
    thinking_stop: Option<FiredAt>,
    /// The thinking budget vLLM itself enforces for it, and the rule it stands for
    /// ([`Meridian::vllm_thinking_budget`]): its thinking ending there is that rule's stop.
    vllm_budget: Option<FiredAt>,
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
    /// It reasons here: a reasoning prompt whose thinking this engine generates (not a request
    /// that only computes its prompt for another engine to decode).
    is_reasoning: bool,
    /// Its part in a prefill/decode hand-off.
    handoff: KvHandoff,
    /// Its KV is arriving into blocks it already holds: admitting it takes no more blocks.
    kv_arriving: bool,
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
            is_reasoning: r.tracker.is_reasoning() && r.handoff != KvHandoff::Sends,
            handoff: r.handoff,
            kv_arriving: r.kv_arriving_since_ms.is_some(),
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

#[derive(Debug, Clone, Copy)]
struct PendingStep {
    step_id: u64,
    scheduled_at_ms: f64,
}

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
    /// What the configured policy does (`config.policy`'s row of [`crate::Policy::traits`]).
    traits: PolicyTraits,
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
    /// How long a request left waiting by this plan waits for the next admission, lately: the
    /// time between two requests' first tokens, at least a decode step (the value-at-risk order
    /// prices a wait that long).
    next_start_wait_ms: f64,
    /// How fast requests have been getting their first token lately: with the seat meter, the
    /// rate at which the queue drains (`drain_starts_per_ms`; the saturation gauge and the
    /// arrival snapshot read it).
    start_rate: load::RateMeter,
    /// What a started request held its seat for, lately: the queue's drain rate when every seat
    /// is busy (see [`load::SeatMeter`]).
    seat_meter: load::SeatMeter,
    /// Whether any class sheds (the plan skips the triage pass otherwise).
    any_shed_class: bool,
    /// Live requests whose thinking a plan ended ([`Tracked::thinking_ended`]): while none,
    /// [`Self::thinking_endings`] reads no slot.
    num_thinking_ended: usize,
    /// Live EAT probes ([`Self::add_probe`]).
    num_live_probes: usize,
    /// Per slot, this plan's judgement of each listed request ([`Self::judge`]): 0 viable, else
    /// 1 + the [`ShedReason`] it would miss. The ordering keys and the triage read it, so a
    /// request is judged once per plan.
    judgements: Vec<u8>,
    /// Whether any class degrades and a worker can end thinking ([`Self::set_thinking_worker`]).
    degrades: bool,
    /// The KV tiers beyond the device and their load costs.
    kv_tiers: KvTiers,
    /// Prefill/decode hand-offs: the fitted arrival cost and the counts.
    handoffs: Handoffs,
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
            .map(|c| if config.policy.traits().triage { c.on_overload } else { OnOverload::Queue })
            .collect();
        let kv_tiers = KvTiers::new(config.kv_tier);
        let viable_level = config.overload.min_success_probability;
        Ok(Self {
            traits: config.policy.traits(),
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
            num_thinking_ended: 0,
            num_live_probes: 0,
            judgements: Vec::new(),
            degrades: false,
            last_decode_step_ms: 0.0,
            queued_lead_ms: 0.0,
            longest_step_ms: 0.0,
            next_start_wait_ms: 0.0,
            start_rate: load::RateMeter::default(),
            seat_meter: load::SeatMeter::default(),
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
            handoffs: Handoffs::default(),
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

    /// What the step-time model predicts, now, for a step of `shape` (read before the step's own
    /// duration is folded in, the model's error on it).
    pub fn predict_step_ms(&self, shape: StepShape) -> f64 {
        self.step_model.predict_ms(shape)
    }

    /// The decode step the last plan judged every deadline with (ms).
    pub fn planned_decode_step_ms(&self) -> f64 {
        self.last_decode_step_ms
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
            handoff: KvHandoff::Local,
            kv_arriving_since_ms: None,
            stored_prefix: None,
            block_hashes: Box::default(),
            prefetched: false,
            probe: false,
            shed: None,
            thinking_ended: false,
            thinking_stop: None,
            vllm_budget: None,
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
            self.num_live_probes += 1;
        }
        Ok(handle)
    }

    /// Whether a live request is an internal EAT probe ([`Self::add_probe`]); a finished one says
    /// so in [`FinishedRequest::probe`].
    pub fn is_probe(&self, handle: ReqHandle) -> Result<bool> {
        Ok(self.get(handle)?.probe)
    }

    /// How many internal EAT probes are live: while none, no output needs [`Self::is_probe`].
    pub fn num_live_probes(&self) -> usize {
        self.num_live_probes
    }

    /// The ids of the live requests whose thinking a plan ended ([`StepPlan::end_thinking`]),
    /// until they finish: what the thinking worker (the logits processor over the bus, the
    /// replay's scripted model) must keep ending. In slot order.
    pub fn thinking_endings(&self) -> Vec<&str> {
        if self.num_thinking_ended == 0 {
            return Vec::new();
        }
        let live = self.slots.iter().filter_map(|slot| slot.request.as_ref());
        live.filter(|r| r.thinking_ended).map(|r| r.req_id.as_str()).collect()
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
        self.plan_step_with_async_loads(now_ms, running, waiting, num_free_blocks, AsyncKvLoads::default())
    }

    /// [`Self::plan_step`] for an engine with vLLM 0.34's async KV-load queue: the last
    /// `async_loads.num_waiting` handles of `waiting` are that queue's, in its order; the plan
    /// orders them with the rest, and may admit them to start their loads without a seat
    /// ([`EngineLimits::max_num_inflight_kv_loads`]).
    pub fn plan_step_with_async_loads(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        num_free_blocks: u32,
        async_loads: AsyncKvLoads,
    ) -> Result<StepPlan> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        self.check_distinct(running, waiting)?;
        let async_loads = self.seatless_loads(waiting.len(), async_loads)?;
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
        if self.config.overload.waiting_order == WaitingOrder::ValueAtRisk {
            // Only that order reads it: no rate read on the other orders' plans.
            let starts_per_ms = self.drain_starts_per_ms(now_ms);
            self.next_start_wait_ms = (1.0 / starts_per_ms).max(decode_step_ms);
        }
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
            &async_loads,
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
            &async_loads,
        );
        // Only shed classes are judged again; the walk over the running list is skipped without.
        let shed = if self.any_shed_class {
            let tokens_left = self.tokens_left_for_waiting(running, token_budget);
            self.shed_the_unadmitted(now_ms, waiting, &waiting_order, num_admissible, tokens_left, shed)
        } else {
            shed
        };
        overload::shed_waiting_last(&mut waiting_order, num_admissible, &shed);
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
        let alarm = phase == Phase::Answer && thinking_left > 0 && !self.traits.preempts_answers;
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
        let seat = {
            let r = self.hot(handle);
            (r.num_tokens.saturating_sub(r.num_output_tokens), r.num_output_tokens)
        };
        let slot = &mut self.slots[handle.slot()];
        let mut request = slot.request.take().ok_or(Error::UnknownRequest { handle: handle.0 })?;
        slot.generation = slot.generation.wrapping_add(1);
        self.hot[handle.slot()].live = false;
        self.free_slots.push(handle.slot() as u32);
        self.by_req_id.remove(&request.req_id);
        self.num_thinking_ended -= usize::from(request.thinking_ended);
        self.num_live_probes -= usize::from(request.probe);

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
                thinking_stop: None,
                probe: true,
                kv_handoff: request.handoff,
                reason,
                unknown_finish_reason,
                class: request.class,
                ledger: request.ledger,
                req_id: request.req_id,
            });
        }
        if seat.1 > 0 {
            self.seat_meter.record(seat.0, seat.1);
        }
        let attainment = request.handoff.judge(&metrics, &targets);
        let counters = &mut self.class_counters[request.class.index()];
        counters.record_judged(&request.ledger, reason, attainment);
        if let Some(shed) = request.shed {
            counters.num_shed[shed as usize] += 1;
        }
        let sends = request.handoff == KvHandoff::Sends;
        if reason.completed() && !sends {
            let met = Attainment::judge(&request.ledger.metrics(), &targets).ttfat;
            let recent = &mut self.recent_ttfat_attainment[request.class.index()];
            *recent = Some(blend_attainment(*recent, met));
        }
        if sends {
            // Its one token says nothing of how long thinking or answers run.
            self.handoffs.on_sent();
        } else if unknown_finish_reason.is_none() {
            // Nothing is known about how an unknown reason ended the request: learn nothing.
            self.learn_lengths(&request, reason);
        }
        let never_reusable_from_token = self.never_reusable_from(&request);
        let thinking_stop = request.thinking_stop.or_else(|| Self::stopped_by_vllm_budget(&request));
        if request.thinking_stop.is_none() {
            if let Some(stop) = thinking_stop {
                self.stats.num_thinking_stops[stop.reason as usize] += 1;
            }
        }
        self.stats.num_finished += 1;
        self.stats.num_unknown_finish_reasons += u64::from(unknown_finish_reason.is_some());
        self.stats.num_reasoning_evictions += u64::from(never_reusable_from_token.is_some());
        Ok(FinishedRequest {
            attainment,
            metrics,
            never_reusable_from_token,
            shed: request.shed,
            thinking_stop,
            probe: false,
            kv_handoff: request.handoff,
            reason,
            unknown_finish_reason,
            class: request.class,
            ledger: request.ledger,
            req_id: request.req_id,
        })
    }

    /// The thinking budget vLLM itself should enforce for a request just added, under `control`
    /// (its thinking control, [`crate::thinking_control_for_request`]) and the client's own
    /// `thinking_token_budget`: [`ThinkingControl::admission_budget`] at its class's TTFAT
    /// attainment now. Remembered, so that its thinking ending there is reported as that rule's
    /// stop with the finish. For engines where the logits processor does not run.
    pub fn vllm_thinking_budget(
        &mut self,
        handle: ReqHandle,
        control: &ThinkingControl,
        client_tokens: Option<u32>,
    ) -> Result<Option<u32>> {
        let class = self.get(handle)?.class;
        let attainment = self.recent_ttfat_attainment[class.index()];
        let Some(tokens) = control.admission_budget(attainment, client_tokens) else { return Ok(None) };
        // The rule the budget stands for: the hard one (the request's, its class's, its effort's,
        // or the client's own) unless the load-aware budget alone is that tight.
        let hard = [control.budget_tokens, client_tokens].into_iter().flatten().min();
        let reason =
            if hard.is_some_and(|h| h <= tokens) { StopReason::Budget } else { StopReason::LoadAwareBudget };
        self.get_mut(handle)?.vllm_budget = Some(FiredAt { reason, num_think_tokens: tokens });
        Ok(Some(tokens))
    }

    /// Records that a thinking-control rule ended a request's thinking after `num_think_tokens`
    /// (the logits processor's report); the first report stands. Reported with the finish.
    pub fn on_thinking_stopped(
        &mut self,
        handle: ReqHandle,
        reason: StopReason,
        num_think_tokens: u32,
    ) -> Result<()> {
        let request = self.get_mut(handle)?;
        if request.thinking_stop.is_none() {
            request.thinking_stop = Some(FiredAt { reason, num_think_tokens });
            self.stats.num_thinking_stops[reason as usize] += 1;
        }
        Ok(())
    }

    /// A finished request whose thinking ended at the budget vLLM enforced for it: that rule's stop.
    fn stopped_by_vllm_budget(request: &Tracked) -> Option<FiredAt> {
        let budget = request.vllm_budget?;
        let ledger = &request.ledger;
        (ledger.num_answer_tokens > 0 && ledger.num_think_tokens >= budget.num_think_tokens).then_some(budget)
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
    /// (a log of another configuration) and for a request that only computed its prompt there
    /// (`handoff` [`KvHandoff::Sends`]: its one token says nothing of lengths). An unknown
    /// `reason` is an error naming it.
    pub fn learn_from_history(
        &mut self,
        slo_class: &str,
        reason: &str,
        answered: bool,
        num_think_tokens: u32,
        num_answer_tokens: u32,
        handoff: KvHandoff,
    ) -> Result<bool> {
        let Some(class) = self.config.class_by_name(slo_class) else { return Ok(false) };
        let reason = FinishReason::ALL.into_iter().find(|r| r.name() == reason).ok_or_else(|| {
            Error::argument("reason", shown(reason), "not a finish reason of the request log")
        })?;
        if handoff == KvHandoff::Sends {
            return Ok(false);
        }
        let think = (answered && num_think_tokens > 0).then_some(num_think_tokens);
        self.learn(class, think, reason, num_answer_tokens);
        Ok(think.is_some() || (reason == FinishReason::Stopped && num_answer_tokens > 0))
    }

    fn never_reusable_from(&self, r: &Tracked) -> Option<u32> {
        if !r.tracker.is_reasoning() || !self.traits.reasoning_eviction {
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

    /// The plan's view of the async KV-load queue: none without `max_num_inflight_kv_loads`
    /// (every admission takes a seat, wherever vLLM keeps the request).
    fn seatless_loads(&self, num_waiting: usize, async_loads: AsyncKvLoads) -> Result<SeatlessLoads> {
        if async_loads.num_waiting > num_waiting {
            return Err(Error::argument(
                "num_async_waiting",
                async_loads.num_waiting,
                "counts more requests than the waiting list holds",
            ));
        }
        Ok(match self.limits.max_num_inflight_kv_loads {
            Some(cap) => SeatlessLoads::new(
                num_waiting - async_loads.num_waiting,
                cap.saturating_sub(async_loads.num_inflight),
            ),
            None => SeatlessLoads::new(num_waiting, 0),
        })
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

/// `x.ceil() as u64` for a non-negative token estimate, without `ceil` (a library call on the
/// baseline x86-64 target, once per answering request per step); saturates like the cast.
#[inline]
fn ceil_tokens(x: f64) -> u64 {
    let whole = x as u64;
    whole + u64::from((whole as f64) < x)
}

mod admission;
mod handoff;
mod load;
mod order;
mod overload;
mod policy;
mod prefix;
mod tiers;
mod types;

use admission::{RunningLoad, SeatlessLoads};
pub use load::{ClassLoad, EngineLoad};
pub use overload::{parse_shed_notice, Shed, ShedNotice, ShedReason, SHED_MARKER};
pub use policy::{AdmissionRule, PolicyTraits, RunningOrder, WaitingOrderRule};
pub use types::{
    AsyncKvLoads, EngineLimits, FinishedRequest, Footprint, NewRequest, Preemption, ReqHandle,
    SchedulerStats, StepPlan,
};

#[cfg(test)]
mod state_machine;
#[cfg(test)]
mod tests;
