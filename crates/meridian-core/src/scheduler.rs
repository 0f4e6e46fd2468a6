//! [`Meridian`], the policy engine: it tracks every request vLLM hands the scheduler (phase, SLO
//! class, ledger) and, once per engine step, turns plain numbers into plain decisions — the order
//! of `running` (its last entry is vLLM's preemption victim), the order of `waiting`, how many
//! waiting requests may be admitted under the answer KV reserve, and the step's token budget.
//! Invariants: a live request has exactly one slot and one handle; a plan's orders are
//! permutations of the lists passed in (nothing lost or duplicated), total and deterministic for
//! the same state; the budget lies in `[1, max_num_batched_tokens]`; phases only move forward.

use std::collections::{HashMap, VecDeque};

use crate::config::{Config, ReasoningBlockRule};
use crate::error::{check_time_ms, Error, Result};
use crate::ledger::{Attainment, ClassCounters, FinishReason, PhaseCountsU64, RequestLedger, RequestMetrics};
use crate::phase::{Phase, PhaseTracker, ReasoningMarkers};
use crate::predictor::ResidualLength;
use crate::slo::{ClassId, SloTargets};
use crate::step_model::{StepSample, StepTimeModel};

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
    /// Explicit SLO class (`meridian_class`), if the client gave one.
    pub slo_class: Option<&'a str>,
    /// vLLM priority (lower is more important); maps onto a class when none is named.
    pub priority: i64,
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
    /// Why it ended.
    pub reason: FinishReason,
    /// Timestamps and counters.
    pub ledger: RequestLedger,
    /// Derived latencies.
    pub metrics: RequestMetrics,
    /// Targets met (meaningful for completed requests).
    pub attainment: Attainment,
    /// Token index from which its KV blocks can never be a prefix hit again (DESIGN §3 tier 1),
    /// or `None` when they stay ordinary prefix-cache blocks.
    pub never_reusable_from_token: Option<u32>,
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
}

impl Tracked {
    fn num_tokens(&self) -> u32 {
        self.num_prompt_tokens.saturating_add(self.num_output_tokens)
    }
}

#[derive(Debug, Clone)]
struct Slot {
    generation: u32,
    request: Option<Tracked>,
}

#[derive(Debug, Clone, Copy)]
struct PendingStep {
    step_id: u64,
    scheduled_at_ms: f64,
    num_context_tokens: u64,
}

/// Sort key: group, two group-specific keys, handle (makes the order total).
type OrderKey = (u8, u64, u64, u64);

/// Unmet steps are remembered at most this long (a shim that never reports outputs cannot grow
/// memory without bound).
const MAX_PENDING_STEPS: usize = 64;

/// The policy engine. See the module docs for its invariants.
#[derive(Debug, Clone)]
pub struct Meridian {
    config: Config,
    limits: EngineLimits,
    markers: ReasoningMarkers,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    by_req_id: HashMap<String, ReqHandle>,
    think_len: ResidualLength,
    answer_len: ResidualLength,
    step_model: StepTimeModel,
    class_counters: Vec<ClassCounters>,
    stats: SchedulerStats,
    pending_steps: VecDeque<PendingStep>,
    last_output_ms: Option<f64>,
    num_thinking_in_step: u32,
    seen: Vec<u64>,
    scratch_keys: Vec<(OrderKey, u32)>,
}

impl Meridian {
    /// A policy engine for one vLLM scheduler.
    pub fn new(config: Config, limits: EngineLimits, markers: ReasoningMarkers) -> Result<Self> {
        let limits = limits.validate()?;
        Ok(Self {
            think_len: ResidualLength::new(&config.think_tokens_prior),
            answer_len: ResidualLength::new(&config.answer_tokens_prior),
            step_model: StepTimeModel::new(&config.step_time),
            class_counters: vec![ClassCounters::default(); config.classes.len()],
            config,
            limits,
            markers,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_req_id: HashMap::new(),
            stats: SchedulerStats::default(),
            pending_steps: VecDeque::new(),
            last_output_ms: None,
            num_thinking_in_step: 0,
            seen: Vec::new(),
            scratch_keys: Vec::new(),
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The engine limits.
    pub fn limits(&self) -> EngineLimits {
        self.limits
    }

    /// Engine-wide counters.
    pub fn stats(&self) -> SchedulerStats {
        self.stats
    }

    /// Per-class attainment counters, indexed by [`ClassId`].
    pub fn class_counters(&self) -> &[ClassCounters] {
        &self.class_counters
    }

    /// The step-time model's current coefficients `(base_ms, per_token_ms, per_context_token_ms)`.
    pub fn step_time_coefficients(&self) -> (f64, f64, f64) {
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

    /// SLO class of a live request.
    pub fn class_of(&self, handle: ReqHandle) -> Result<ClassId> {
        Ok(self.get(handle)?.class)
    }

    /// Ledger of a live request.
    pub fn ledger(&self, handle: ReqHandle) -> Result<&RequestLedger> {
        Ok(&self.get(handle)?.ledger)
    }

    /// Resolves the SLO class a request would get, without adding it: lets the caller reject a
    /// bad class for one request before it reaches the engine.
    pub fn resolve_class(&self, req_id: &str, slo_class: Option<&str>, priority: i64) -> Result<ClassId> {
        match slo_class {
            Some(name) => self.config.class_by_name(name).ok_or_else(|| Error::UnknownSloClass {
                req_id: req_id.to_owned(),
                name: name.to_owned(),
                known: self.config.class_names(),
            }),
            None => Ok(self.config.class_for_priority(priority)),
        }
    }

    /// Starts tracking a request.
    pub fn add_request(&mut self, req: NewRequest<'_>) -> Result<ReqHandle> {
        let arrival_ms = check_time_ms("arrival_ms", req.arrival_ms)?;
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
            ledger: RequestLedger::new(arrival_ms),
            preempted: false,
            waiting_since_ms: arrival_ms,
        };
        let handle = self.insert(tracked);
        self.by_req_id.insert(req.req_id.to_owned(), handle);
        self.stats.num_added += 1;
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
        self.think_len.refresh();
        self.answer_len.refresh();
        let num_context_tokens = self.context_tokens(running);
        let decode_step_ms = self.step_model.predict_ms(running.len() as u32, num_context_tokens);
        let running_order = self.order_running(now_ms, running, decode_step_ms);
        let waiting_order = self.order_waiting(now_ms, waiting, decode_step_ms);
        let num_reserved_blocks = self.answer_reserve_blocks(running);
        let num_admissible =
            self.num_admissible(waiting, &waiting_order, num_free_blocks, num_reserved_blocks, running.len());
        let token_budget = self.token_budget(running, num_context_tokens);
        self.num_thinking_in_step =
            running.iter().filter(|&&h| self.slot_ref(h).tracker.phase() != Phase::Answer).count() as u32;
        let step_id = self.stats.num_steps;
        self.stats.num_steps += 1;
        self.remember_step(PendingStep { step_id, scheduled_at_ms: now_ms, num_context_tokens });
        Ok(StepPlan {
            step_id,
            running_order,
            waiting_order,
            num_admissible,
            token_budget,
            num_reserved_blocks,
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
        request.waiting_since_ms = now_ms;
        let alarm = phase == Phase::Answer && thinking_left > 0;
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
        request.num_output_tokens = request.num_output_tokens.saturating_add(token_ids.len() as u32);
        if !token_ids.is_empty() {
            request.preempted = false;
        }
        Ok(())
    }

    /// Records the end of a step's execution (its output reached the scheduler at `now_ms`) and
    /// folds the measured duration into the step-time model.
    pub fn on_step_output(&mut self, now_ms: f64, step_id: u64, num_scheduled_tokens: u32) -> Result<()> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        while self.pending_steps.front().is_some_and(|p| p.step_id < step_id) {
            self.pending_steps.pop_front();
        }
        let pending = match self.pending_steps.front() {
            Some(p) if p.step_id == step_id => self.pending_steps.pop_front(),
            _ => None,
        };
        if let Some(p) = pending {
            // Under async scheduling the step started when both it was scheduled and the previous
            // output had arrived; before that the device was busy with the previous step.
            let started_ms =
                self.last_output_ms.map_or(p.scheduled_at_ms, |last| last.max(p.scheduled_at_ms));
            if num_scheduled_tokens > 0 && now_ms >= started_ms {
                self.step_model.observe(StepSample {
                    num_scheduled_tokens,
                    num_context_tokens: p.num_context_tokens,
                    duration_ms: now_ms - started_ms,
                });
                self.stats.num_step_samples += 1;
            }
        }
        self.last_output_ms = Some(now_ms);
        Ok(())
    }

    /// Stops tracking a request and reports what it did.
    pub fn finish(
        &mut self,
        now_ms: f64,
        handle: ReqHandle,
        reason: FinishReason,
    ) -> Result<FinishedRequest> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        self.get(handle)?;
        let slot = &mut self.slots[handle.slot()];
        let mut request = slot.request.take().ok_or(Error::UnknownRequest { handle: handle.0 })?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(handle.slot() as u32);
        self.by_req_id.remove(&request.req_id);

        let end_ms = request.ledger.last_token_ms.unwrap_or(request.ledger.arrival_ms);
        request.ledger.finish_ms = Some(now_ms.max(end_ms));
        request.tracker.finish();
        let targets = self.config.classes[request.class.index()].targets;
        self.class_counters[request.class.index()].record(&request.ledger, reason, &targets);
        self.learn_lengths(&request, reason);
        let never_reusable_from_token = self.never_reusable_from(&request);
        self.stats.num_finished += 1;
        self.stats.num_reasoning_evictions += u64::from(never_reusable_from_token.is_some());
        let metrics = request.ledger.metrics();
        Ok(FinishedRequest {
            attainment: Attainment::judge(&metrics, &targets),
            metrics,
            never_reusable_from_token,
            reason,
            class: request.class,
            ledger: request.ledger,
            req_id: request.req_id,
        })
    }

    // ---- ordering -------------------------------------------------------------------------

    fn order_running(&mut self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.clear();
        keys.extend(
            running.iter().enumerate().map(|(i, &h)| (self.running_key(now_ms, h, step_ms), i as u32)),
        );
        keys.sort_unstable();
        let order = keys.iter().map(|&(_, i)| i).collect();
        self.scratch_keys = keys;
        order
    }

    /// Answer queue by next-token deadline; then thinking/prefill by slack while the TTFAT
    /// deadline is still reachable; then best effort, most sunk work first, so the last entry
    /// (the victim) is the cheapest to recompute among requests that have already missed.
    fn running_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.slot_ref(handle);
        let targets = self.targets(r.class);
        let sunk = u64::from(r.num_tokens());
        if r.tracker.phase() == Phase::Answer {
            return (
                0,
                sortable(self.next_answer_deadline_ms(r, &targets)),
                r.ledger.arrival_ms.to_bits(),
                handle.0,
            );
        }
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        if slack_ms >= 0.0 {
            (1, sortable(slack_ms), u64::MAX - sunk, handle.0)
        } else {
            (2, u64::MAX - sunk, sortable(r.ledger.arrival_ms), handle.0)
        }
    }

    fn next_answer_deadline_ms(&self, r: &Tracked, targets: &SloTargets) -> f64 {
        let last_ms = r.ledger.last_token_ms.unwrap_or(r.ledger.arrival_ms);
        let next_ms = last_ms + targets.answer_tpot_ms;
        if r.ledger.first_answer_ms.is_none() {
            next_ms.min(r.ledger.arrival_ms + targets.ttfat_ms)
        } else {
            next_ms
        }
    }

    /// Time to spare before the request's next milestone, given the expected remaining work:
    /// the TTFAT deadline after the expected remaining thinking, and the TTFT deadline for a
    /// request that has not produced a token yet.
    fn think_slack_ms(&self, now_ms: f64, r: &Tracked, targets: &SloTargets, step_ms: f64) -> f64 {
        let expected_think_tokens = if r.tracker.is_reasoning() {
            self.think_len.expected_remaining(r.ledger.num_think_tokens)
        } else {
            0.0
        };
        let ttfat_slack =
            r.ledger.arrival_ms + targets.ttfat_ms - now_ms - (expected_think_tokens + 1.0) * step_ms;
        if r.ledger.first_token_ms.is_none() {
            let prefill_ms = self.step_model.predict_ms(r.num_tokens(), 0);
            let ttft_slack = r.ledger.arrival_ms + targets.ttft_ms - now_ms - prefill_ms;
            ttfat_slack.min(ttft_slack)
        } else {
            ttfat_slack
        }
    }

    fn order_waiting(&mut self, now_ms: f64, waiting: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.clear();
        keys.extend(
            waiting.iter().enumerate().map(|(i, &h)| (self.waiting_key(now_ms, h, step_ms), i as u32)),
        );
        keys.sort_unstable();
        let order = keys.iter().map(|&(_, i)| i).collect();
        self.scratch_keys = keys;
        order
    }

    /// Preempted requests first (in running order), then requests waiting past the starvation
    /// bound (oldest first), then by aged class rank and slack, then those that can no longer
    /// meet their targets (aged class rank, oldest first).
    fn waiting_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.slot_ref(handle);
        if r.preempted {
            let (group, a, b, h) = self.running_key(now_ms, handle, step_ms);
            return (group, a, b, h);
        }
        let waited_ms = (now_ms - r.waiting_since_ms).max(0.0);
        if waited_ms >= self.config.starvation_ms {
            return (3, sortable(r.ledger.arrival_ms), 0, handle.0);
        }
        let rank = self.config.classes[r.class.index()].rank;
        let aged_rank = u64::from(rank.saturating_sub((waited_ms / self.config.aging_ms).min(255.0) as u8));
        let targets = self.targets(r.class);
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        if slack_ms >= 0.0 {
            (4, aged_rank, sortable(slack_ms), handle.0)
        } else {
            (5, aged_rank, sortable(r.ledger.arrival_ms), handle.0)
        }
    }

    // ---- admission and budget -------------------------------------------------------------

    /// Blocks the running answering requests are expected to need before they finish.
    fn answer_reserve_blocks(&self, running: &[ReqHandle]) -> u32 {
        if !self.config.answer_kv_reserve {
            return 0;
        }
        let block_size = u64::from(self.limits.block_size);
        let mut reserve = 0u64;
        for &h in running {
            let r = self.slot_ref(h);
            if r.tracker.phase() != Phase::Answer {
                continue;
            }
            let left_by_limit = r.max_tokens.saturating_sub(r.num_output_tokens);
            let expected = self.answer_len.expected_remaining(r.ledger.num_answer_tokens).ceil() as u64;
            let growth = expected.min(u64::from(left_by_limit));
            let now_tokens = u64::from(r.num_tokens());
            reserve += (now_tokens + growth).div_ceil(block_size) - now_tokens.div_ceil(block_size);
        }
        reserve.min(u64::from(u32::MAX)) as u32
    }

    fn num_admissible(
        &self,
        waiting: &[ReqHandle],
        order: &[u32],
        num_free_blocks: u32,
        num_reserved_blocks: u32,
        num_running: usize,
    ) -> u32 {
        let seats = (self.limits.max_num_seqs as usize).saturating_sub(num_running);
        let mut blocks_left = u64::from(num_free_blocks.saturating_sub(num_reserved_blocks));
        let block_size = u64::from(self.limits.block_size);
        let mut admitted = 0usize;
        for &i in order.iter().take(seats) {
            let r = self.slot_ref(waiting[i as usize]);
            // One block more than the tokens need: the first decode step must fit too.
            let need = (u64::from(r.num_tokens()) + 1).div_ceil(block_size);
            if need > blocks_left {
                break;
            }
            blocks_left -= need;
            admitted += 1;
        }
        // With nothing running nothing can free memory: let vLLM try the head itself, so a
        // request whose estimate is too pessimistic can never wedge the engine.
        if admitted == 0 && num_running == 0 && !order.is_empty() && seats > 0 {
            admitted = 1;
        }
        admitted as u32
    }

    /// Sarathi-style stall-free budget: while anyone answers, the step must fit the tightest
    /// answer TPOT target; otherwise thinking and prefill may use `think_batch_multiplier` × it.
    fn token_budget(&self, running: &[ReqHandle], num_context_tokens: u64) -> u32 {
        let mut num_answering = 0u32;
        let mut answer_tpot_ms = f64::INFINITY;
        let mut any_tpot_ms = f64::INFINITY;
        for &h in running {
            let r = self.slot_ref(h);
            let tpot_ms = self.targets(r.class).answer_tpot_ms;
            any_tpot_ms = any_tpot_ms.min(tpot_ms);
            if r.tracker.phase() == Phase::Answer {
                num_answering += 1;
                answer_tpot_ms = answer_tpot_ms.min(tpot_ms);
            }
        }
        if any_tpot_ms.is_infinite() {
            any_tpot_ms = self.targets(self.config.default_class).answer_tpot_ms;
        }
        let max_tokens = self.limits.max_num_batched_tokens;
        let headroom = self.config.tpot_headroom;
        let (budget, floor) = if num_answering > 0 {
            let tokens = self.step_model.tokens_within(answer_tpot_ms * headroom, num_context_tokens);
            (u64::from(tokens), num_answering.max(self.config.min_token_budget))
        } else {
            let tokens = self.step_model.tokens_within(any_tpot_ms * headroom, num_context_tokens);
            ((f64::from(tokens) * self.config.think_batch_multiplier) as u64, self.config.min_token_budget)
        };
        budget.max(u64::from(floor)).min(u64::from(max_tokens)) as u32
    }

    // ---- bookkeeping ----------------------------------------------------------------------

    fn context_tokens(&self, running: &[ReqHandle]) -> u64 {
        running.iter().map(|&h| u64::from(self.slot_ref(h).num_tokens())).sum()
    }

    fn remember_step(&mut self, step: PendingStep) {
        if self.pending_steps.len() == MAX_PENDING_STEPS {
            self.pending_steps.pop_front();
        }
        self.pending_steps.push_back(step);
    }

    fn learn_lengths(&mut self, r: &Tracked, reason: FinishReason) {
        if r.tracker.is_reasoning() && r.ledger.first_answer_ms.is_some() {
            self.think_len.observe(r.ledger.num_think_tokens);
        }
        // A length-capped answer is truncated: it would teach the predictor lengths that are
        // too short.
        if reason == FinishReason::Stopped && r.ledger.num_answer_tokens > 0 {
            self.answer_len.observe(r.ledger.num_answer_tokens);
        }
    }

    fn never_reusable_from(&self, r: &Tracked) -> Option<u32> {
        if !r.tracker.is_reasoning() {
            return None;
        }
        match self.config.evict_reasoning_blocks {
            ReasoningBlockRule::Never => None,
            ReasoningBlockRule::UnlessToolCall if r.tracker.ended_in_tool_call() => None,
            _ => Some(r.reasoning_start),
        }
    }

    fn targets(&self, class: ClassId) -> SloTargets {
        self.config.classes[class.index()].targets
    }

    fn check_distinct(&mut self, running: &[ReqHandle], waiting: &[ReqHandle]) -> Result<()> {
        let words = self.slots.len().div_ceil(64);
        self.seen.clear();
        self.seen.resize(words, 0);
        for (list, &h) in running.iter().map(|h| ("running", h)).chain(waiting.iter().map(|h| ("waiting", h)))
        {
            self.get(h)?;
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
                entry.request = Some(tracked);
                ReqHandle::new(slot, entry.generation)
            }
            None => {
                let slot = self.slots.len() as u32;
                self.slots.push(Slot { generation: 0, request: Some(tracked) });
                ReqHandle::new(slot, 0)
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

    /// Only for handles already validated by [`Self::check_distinct`] in this call.
    fn slot_ref(&self, handle: ReqHandle) -> &Tracked {
        self.slots[handle.slot()].request.as_ref().expect("handle validated by check_distinct")
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

#[cfg(test)]
mod tests;
