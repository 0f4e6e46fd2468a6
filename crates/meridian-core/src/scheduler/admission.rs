//! What a step may take on: the running load it starts from, the waiting requests it admits
//! (under the policy's [`super::PolicyTraits::admission`]: the answer KV reserve and the TPOT
//! guard, SCORPIO's virtual batch, or vLLM's own check), the running thinking an arrival may
//! preempt, the step's token budget and PASCAL's paced-out answers. Invariant: the budget lies in
//! `[1, max_num_batched_tokens]`, and with nothing running at least the head may be tried, so an
//! estimate never wedges the engine.

use super::{ceil_tokens, AdmissionRule, Meridian, ReqHandle};
use crate::phase::Phase;
use crate::step_model::StepShape;

/// A step that spends banked answer time stays this far below a stall's length (a gap above
/// `stall_factor` × the TPOT target).
pub(super) const STALL_MARGIN: f64 = 0.5;

/// Aggregates over the running list for one plan.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunningLoad {
    pub(super) num_context_tokens: u64,
    pub(super) num_answering: u32,
    /// Running requests past their prompt: each decodes one token a step.
    pub(super) num_decoding: u32,
    pub(super) num_reserved_blocks: u32,
    /// Tightest answer TPOT target among answering requests (∞ when none answers).
    pub(super) answer_tpot_ms: f64,
    /// The longest step every answering request can absorb with its mean TPOT still within its
    /// target (with `tpot_headroom`) over the answer so far: the time it banked by running faster
    /// than its target, after the step in flight (∞ when none answers). Only banked time is
    /// spent, never time the rest of an answer of unknown length would bring.
    pub(super) least_banked_ms: f64,
    /// Tightest answer TPOT target among all running requests (∞ when none runs).
    pub(super) any_tpot_ms: f64,
}

impl RunningLoad {
    /// The step the running requests' decodes alone make.
    pub(super) fn decodes(&self) -> StepShape {
        StepShape {
            num_prefill_tokens: 0,
            num_decode_requests: self.num_decoding,
            num_context_tokens: self.num_context_tokens,
        }
    }
}

/// With nothing running nothing can free memory: let vLLM try the head itself, so a request
/// whose estimate is too pessimistic can never wedge the engine.
pub(super) fn at_least_one_when_idle(
    admitted: u32,
    num_running: usize,
    num_waiting: usize,
    seats: usize,
) -> u32 {
    if admitted == 0 && num_running == 0 && num_waiting > 0 && seats > 0 {
        1
    } else {
        admitted
    }
}

impl Meridian {
    /// One pass over `running` for everything the budget and the reserve need.
    pub(super) fn running_load(&self, now_ms: f64, running: &[ReqHandle]) -> RunningLoad {
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
    pub(super) fn arrival_victims(
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
        if !rule.enabled || !self.traits.arrival_preemption {
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
    pub(super) fn best_arrival_victim(
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
    pub(super) fn num_admissible(
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
        match self.traits.admission {
            AdmissionRule::AnswerKvReserve => {}
            AdmissionRule::VirtualBatch => {
                return self.virtual_batch_admissible(waiting, order, seats, num_running, load)
            }
            // Stock vLLM's admission: whatever its KV check lets in.
            AdmissionRule::Vllm => return order.len().min(seats) as u32,
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
            // One block more than the tokens need: the first decode step must fit too. A request
            // whose KV is arriving holds its blocks already.
            let need = if r.kv_arriving { 0 } else { (u64::from(r.num_tokens) + 1).div_ceil(block_size) };
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
    pub(super) fn virtual_batch_admissible(
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
    pub(super) fn token_budget(&self, load: &RunningLoad) -> u32 {
        if !self.traits.step_budget {
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
    pub(super) fn paced_out(&self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        if !self.traits.answer_pacing {
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
}
