//! The orders of `running` and `waiting`: each request's sort key under the configured policy's
//! [`super::PolicyTraits::running_order`] and [`super::PolicyTraits::waiting_order`], the
//! estimates the keys read (slack, next answer deadline, expected thinking, value density, what
//! a tier would restore) and the packed integer sort. Invariant: an order is a permutation of the
//! list given, total and deterministic for the same state; equal keys keep their input order.

use super::policy::group;
use super::{Hot, Meridian, ReqHandle, RunningOrder, WaitingOrderRule, PREFIX_AFFINITY_WINDOW};
use crate::kv_tier::TierId;
use crate::phase::Phase;
use crate::predictor::Quantile;
use crate::slo::{OnOverload, SloTargets, WaitingOrder};
use crate::step_model::StepShape;

/// Sort key before packing: group (0–7), a group-specific primary key, a tie-break key. All
/// three are 64-bit: the key is returned through memory, and a wide load of a narrow store
/// (a `u8` group read back as a word) stalls store forwarding once per request per plan.
pub(super) type OrderKey = (u64, u64, u64);

/// Lists up to this long sort as packed `u64`s (16 bits of position); longer ones as `u128`s.
pub(super) const MAX_FAST_SORT_LEN: usize = 1 << 16;

/// Packs a key and the entry's input position into one `u64`: sorting plain integers is what
/// keeps a 1,024-request step within its 20 µs budget. Layout: group (3 bits), the top 45 bits of
/// `primary` (a float key keeps ~10 significant digits), position (16 bits). The tie-break key
/// is dropped: equal keys keep their input order, so ties do not flap from step to step.
pub(super) fn pack_fast((group, primary, _tie): OrderKey, position: u32) -> u64 {
    group << 61 | (primary >> 19) << 16 | u64::from(position)
}

/// The exact packing for very long lists: group, full primary, tie-break, position.
pub(super) fn pack_exact((group, primary, tie): OrderKey, position: u32) -> u128 {
    let head = group << 61 | primary >> 3;
    u128::from(head) << 64 | u128::from(tie) << 32 | u128::from(position)
}

/// The rank under which waiting requests safely inside their targets queue in arrival order:
/// behind every rank a class can have below it (late ones queue under `u8::MAX`).
pub(super) const SAFE_RANK: u8 = u8::MAX - 1;

/// [`sortable`] for a tie-break key, at f32 precision.
pub(super) fn sortable32(x: f64) -> u32 {
    let bits = (x as f32).to_bits();
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
}

/// Maps a finite f64 onto u64 so that integer order is numeric order.
pub(super) fn sortable(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

impl Meridian {
    pub(super) fn order_running(&mut self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
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
    pub(super) fn running_step_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.hot(handle);
        if self.traits.recompute_after_decodes && r.preempted && !r.shed {
            let more_sunk_first = u64::from(u32::MAX - (r.num_tokens - self.restorable_tokens(r)));
            let group = if r.phase == Phase::Answer { group::ANSWERING } else { group::THINKING_PAST_BOUND };
            return (group, u64::MAX, more_sunk_first);
        }
        self.running_key(now_ms, handle, step_ms)
    }

    pub(super) fn order_waiting(&mut self, now_ms: f64, waiting: &[ReqHandle], step_ms: f64) -> Vec<u32> {
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
    pub(super) fn rerank_by_prefix(
        &self,
        now_ms: f64,
        waiting: &[ReqHandle],
        order: &mut [u32],
        step_ms: f64,
    ) {
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

    pub(super) fn order_by(
        &mut self,
        handles: &[ReqHandle],
        key: impl Fn(&Self, ReqHandle) -> OrderKey,
    ) -> Vec<u32> {
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
    pub(super) fn running_key(&self, now_ms: f64, handle: ReqHandle, step_ms: f64) -> OrderKey {
        let r = self.hot(handle);
        match self.traits.running_order {
            RunningOrder::PhaseAndSlack => {}
            RunningOrder::AnswersFirst => {
                return (u64::from(r.phase != Phase::Answer), sortable(r.arrival_ms), 0)
            }
            // Round robin within each phase: the request served longest ago goes first.
            RunningOrder::ThinkingFirstRoundRobin => {
                return (u64::from(r.phase == Phase::Answer), sortable(r.last_token_ms), 0)
            }
            RunningOrder::BoostedArrival => return (0, sortable(self.boosted_arrival_ms(r)), 0),
            RunningOrder::Arrival => return (0, sortable(r.arrival_ms), 0),
        }
        if r.shed {
            // The shim ends it before vLLM schedules the step: last, out of everyone's way.
            return (group::SHED, 0, 0);
        }
        let targets = self.targets(r.class);
        let restorable = self.restorable_tokens(r);
        // Sunk work is what a preemption would throw away: a prefix a tier gives back is kept.
        let more_sunk_first = u32::MAX - (r.num_tokens - restorable);
        let sunk_key = u64::from(more_sunk_first);
        if r.phase == Phase::Answer {
            return (
                group::ANSWERING,
                sortable(self.next_answer_deadline_ms(r, &targets)),
                u64::from(sortable32(r.arrival_ms)),
            );
        }
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        let viable = self.judged(handle).is_none();
        match (r.has_started, viable) {
            (true, true) => (group::THINKING, sortable(slack_ms), sunk_key),
            (true, false) if now_ms - r.arrival_ms >= self.late_think_bound_ms(&targets) => {
                (group::THINKING_PAST_BOUND, sunk_key << 32, u64::from(sortable32(r.arrival_ms)))
            }
            (true, false) => (group::LATE_THINKING, sunk_key << 32, u64::from(sortable32(r.arrival_ms))),
            (false, true) => (group::PROMPT, sortable(slack_ms), sunk_key),
            (false, false) => (group::LATE_PROMPT, sortable(-slack_ms), sunk_key),
        }
    }

    /// The step-time model's time to compute `num_tokens` of prompt (a first prefill, or the
    /// recompute of a preempted request's tokens).
    #[inline]
    pub(super) fn prefill_ms(&self, num_tokens: u32) -> f64 {
        self.step_model.predict_ms(StepShape { num_prefill_tokens: num_tokens, ..StepShape::default() })
    }

    /// Tokens of a running request's context a tier would give back if it were preempted now:
    /// its stored prefix when a resume would load rather than recompute it, else none.
    #[inline]
    pub(super) fn restorable_tokens(&self, r: &Hot) -> u32 {
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
    pub(super) fn tier_savings_ms(&self, r: &Hot, restorable: u32) -> f64 {
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
    pub(super) fn refresh_restore_bounds(&mut self) {
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
    pub(super) fn late_think_bound_ms(&self, targets: &SloTargets) -> f64 {
        (1.0 + self.config.late_think_ttfat_factor) * targets.ttfat_ms
    }

    #[inline]
    pub(super) fn next_answer_deadline_ms(&self, r: &Hot, targets: &SloTargets) -> f64 {
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
    pub(super) fn think_slack_ms(&self, now_ms: f64, r: &Hot, targets: &SloTargets, step_ms: f64) -> f64 {
        let expected_think_tokens = self.expected_think_tokens(r);
        let ttfat_slack = r.arrival_ms + targets.ttfat_ms - now_ms - (expected_think_tokens + 1.0) * step_ms;
        if !r.has_started {
            let prefill_ms = self.prompt_ms(r);
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
    pub(super) fn expected_think_tokens(&self, r: &Hot) -> f64 {
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
    pub(super) fn waiting_key(
        &self,
        now_ms: f64,
        handle: ReqHandle,
        step_ms: f64,
        with_affinity: bool,
    ) -> OrderKey {
        let r = self.hot(handle);
        match self.traits.waiting_order {
            WaitingOrderRule::ClassAndSlack => {}
            // vLLM's own order: preempted requests (back at the head) first, then arrival.
            WaitingOrderRule::PreemptedThenArrival => {
                return (u64::from(!r.preempted), sortable(r.arrival_ms), 0)
            }
            WaitingOrderRule::BoostedArrival => return (0, sortable(self.boosted_arrival_ms(r)), 0),
            WaitingOrderRule::TtftDeadline => return self.scorpio_waiting_key(now_ms, r),
        }
        if r.shed {
            // The shim ends it before vLLM schedules the step: behind everyone, never admitted.
            return (group::SHED, u64::MAX, 0);
        }
        if r.preempted {
            return self.running_key(now_ms, handle, step_ms);
        }
        let waited_ms = (now_ms - r.waiting_since_ms).max(0.0);
        let targets = self.targets(r.class);
        let late_bound_ms =
            (self.config.late_wait_ttft_factor * targets.ttft_ms).min(self.config.starvation_ms);
        if waited_ms >= self.config.starvation_ms {
            return (group::OVERDUE, sortable(r.arrival_ms), 0);
        }
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        if self.judged(handle).is_some() {
            if waited_ms >= late_bound_ms {
                return (group::OVERDUE, sortable(r.arrival_ms), 0);
            }
            // Behind every request that can still make it, nearest its bound first.
            return (
                group::RANKED,
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
            let shed_class = self.class_triage[r.class.index()] == OnOverload::Shed;
            // Highest density first: the key sorts ascending.
            let urgency = match self.config.overload.waiting_order {
                WaitingOrder::ValueDensity if shed_class => -self.value_density(now_ms, r, &targets, step_ms),
                WaitingOrder::ValueAtRisk if shed_class => {
                    -self.value_at_risk(now_ms, r, &targets, step_ms, self.next_start_wait_ms)
                }
                _ => slack_ms,
            };
            (rank.saturating_sub((waited_ms * self.inv_aging_ms).min(255.0) as u8), urgency)
        };
        let rank = u64::from(rank);
        if let Some(affinity) = with_affinity.then(|| self.affinity_key(r, &targets, slack_ms)).flatten() {
            // Within the rank: requests within their slack guard by urgency, then the others
            // with the longest cached prefix first, by urgency among equals.
            let primary = rank << 56 | affinity << 50 | sortable(urgency) >> 14;
            return (group::RANKED, primary, u64::from(sortable32(r.arrival_ms)));
        }
        (group::RANKED, rank << 56 | sortable(urgency) >> 8, u64::from(sortable32(r.arrival_ms)))
    }

    /// The probability that a waiting request meets its TTFAT target if admitted now, per
    /// millisecond of engine time it is expected to take (its prefill, then its median remaining
    /// thinking and answer at `step_ms` a token). Why per engine time: while the work does not
    /// fit, each admission displaces others; two cheap likely requests finish on time where one
    /// long one would (the value density of a knapsack's greedy order). Why the probability and
    /// not the slack: a request far from its deadline but with a long expected thinking is
    /// worth little once its chance is gone, one close to it but short still finishes.
    #[inline]
    pub(super) fn value_density(&self, now_ms: f64, r: &Hot, targets: &SloTargets, step_ms: f64) -> f64 {
        let prefill_ms = if r.has_started { 0.0 } else { self.prompt_ms(r) };
        let prob = self.ttfat_probability(now_ms, r, targets, step_ms, prefill_ms);
        prob / self.engine_cost_ms(r, step_ms, prefill_ms)
    }

    /// What the request loses by waiting `wait_ms` more for its admission, per millisecond of
    /// engine time ([`WaitingOrder::ValueAtRisk`]): its probability of meeting its targets if
    /// admitted now less that if admitted `wait_ms` later, where a request not yet started
    /// whose prefill would then end past its TTFT deadline has none left. Why the difference:
    /// value density ranks a fresh request, which has the most time left, first, and requests
    /// that have waited run out their TTFT target behind fresh ones that could have waited
    /// (measured on the live overload workloads: most TTFT sheds met every target when queued).
    #[inline]
    pub(super) fn value_at_risk(
        &self,
        now_ms: f64,
        r: &Hot,
        targets: &SloTargets,
        step_ms: f64,
        wait_ms: f64,
    ) -> f64 {
        let prefill_ms = if r.has_started { 0.0 } else { self.prompt_ms(r) };
        let value_at = |at_ms: f64| {
            let misses_ttft = !r.has_started && at_ms + prefill_ms > r.arrival_ms + targets.ttft_ms;
            if misses_ttft {
                0.0
            } else {
                self.ttfat_probability(at_ms, r, targets, step_ms, prefill_ms)
            }
        };
        let lost = (value_at(now_ms) - value_at(now_ms + wait_ms)).max(0.0);
        lost / self.engine_cost_ms(r, step_ms, prefill_ms)
    }

    /// The probability that the request, admitted at `at_ms`, gives its first answer token by
    /// its TTFAT deadline (1 once it answers or for a request that does not reason).
    #[inline]
    fn ttfat_probability(
        &self,
        at_ms: f64,
        r: &Hot,
        targets: &SloTargets,
        step_ms: f64,
        prefill_ms: f64,
    ) -> f64 {
        if !r.is_reasoning || r.phase == Phase::Answer {
            return 1.0;
        }
        let left_ms = r.arrival_ms + targets.ttfat_ms - at_ms - prefill_ms;
        // One decode step produces the first answer token after the thinking ends.
        self.lengths[r.class.index()].think.prob_within(r.num_think_tokens, left_ms / step_ms - 1.0)
    }

    /// The engine time a request is expected to take from admission: its prefill, then its
    /// median remaining thinking and answer at `step_ms` a token (never 0).
    #[inline]
    fn engine_cost_ms(&self, r: &Hot, step_ms: f64, prefill_ms: f64) -> f64 {
        let think_tokens = if r.phase == Phase::Answer { 0.0 } else { self.expected_think_tokens(r) };
        let answer_tokens =
            self.lengths[r.class.index()].answer.remaining_quantile(r.num_answer_tokens, Quantile::P50);
        (prefill_ms + (think_tokens + answer_tokens) * step_ms).max(f64::MIN_POSITIVE)
    }

    /// UniBoost's key: the arrival pushed back by the work the request has made known (prompt and
    /// output so far) at γ tokens per second.
    #[inline]
    pub(super) fn boosted_arrival_ms(&self, r: &Hot) -> f64 {
        r.arrival_ms + f64::from(r.num_tokens) * self.uniboost_ms_per_token
    }

    /// SCORPIO's TTFT guard: preempted requests first (vLLM's own rule), then least TTFT deadline
    /// first among requests that can still make it, then the unattainable ones (SCORPIO's
    /// rejections, queued last), also by deadline.
    pub(super) fn scorpio_waiting_key(&self, now_ms: f64, r: &Hot) -> OrderKey {
        if r.preempted {
            return (0, sortable(r.arrival_ms), 0);
        }
        let deadline_ms = r.arrival_ms + self.targets(r.class).ttft_ms;
        let prefill_ms = self.prompt_ms(r);
        let attainable = now_ms + prefill_ms <= deadline_ms;
        (if attainable { 1 } else { 2 }, sortable(deadline_ms), 0)
    }
}
