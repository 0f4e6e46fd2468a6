//! What a step may take on: the running load it starts from, the waiting requests it admits
//! (under the policy's [`super::PolicyTraits::admission`]: the answer KV reserve and the TPOT
//! guard, SCORPIO's virtual batch, or vLLM's own check), the running thinking an arrival may
//! preempt, the step's token budget and PASCAL's paced-out answers. A request in vLLM 0.34's async
//! KV-load queue starts its load without a running seat (it holds blocks, and takes a seat once
//! its KV has arrived), so with that queue the admitted requests are those at the head of the
//! order that find room of their kind — a seat, or a load under the cap — moved ahead of the ones
//! passed over. Invariant: the budget lies in `[1, max_num_batched_tokens]`, and with nothing
//! running at least the head may be tried, so an estimate never wedges the engine; the admitted
//! requests are always the head of the waiting order, in its order.

use super::{ceil_tokens, AdmissionRule, Hot, Meridian, ReqHandle};
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

/// The plan's view of vLLM 0.34's async KV-load queue: which waiting requests start their KV
/// load without a seat, and how many more loads the cap allows.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeatlessLoads {
    /// Waiting indices from here on are in the async KV-load queue.
    first: usize,
    /// Loads the cap still allows (0 without the queue).
    pub(super) left: u32,
}

impl SeatlessLoads {
    pub(super) fn new(first: usize, left: u32) -> Self {
        Self { first, left }
    }

    /// Whether the waiting request at index `i` would start a load rather than take a seat.
    pub(super) fn takes_no_seat(&self, i: u32, r: &Hot) -> bool {
        i as usize >= self.first && !r.kv_arriving
    }
}

/// Moves the admitted positions of `order` ahead of the `passed_over` ones (ascending); together
/// they are `order`'s first `num_admitted + passed_over.len()` positions (a scan that stopped
/// there). Both keep their relative order.
fn admitted_first(order: &mut [u32], passed_over: &[usize], num_admitted: usize) {
    if num_admitted == 0 || passed_over.is_empty() {
        return;
    }
    let last = passed_over.len() + num_admitted;
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
    #[allow(clippy::too_many_arguments)]
    pub(super) fn arrival_victims(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        order: &[u32],
        blocks_available: u32,
        step_ms: f64,
        loads: &SeatlessLoads,
    ) -> (Vec<u32>, u32) {
        let rule = self.config.arrival_preemption;
        let Some(&head) = order.first() else { return (Vec::new(), 0) };
        if !rule.enabled || !self.traits.arrival_preemption {
            return (Vec::new(), 0);
        }
        let w = self.hot(waiting[head as usize]);
        let loads_without_seat = loads.takes_no_seat(head, w);
        if w.shed || (loads_without_seat && loads.left == 0) {
            // A load the cap holds back gains nothing from a victim's seat or blocks.
            return (Vec::new(), 0);
        }
        let block_size = u64::from(self.limits.block_size);
        let need_blocks = (u64::from(w.num_tokens) + 1).div_ceil(block_size);
        let need_seat = !loads_without_seat && running.len() >= self.limits.max_num_seqs as usize;
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
    /// `starvation_ms`, when it blocks again so it cannot be passed over for ever. Likewise a
    /// request with no room of its kind (every seat taken, or the async KV-load cap reached)
    /// holds up none behind it that has room of the other kind.
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
        loads: &SeatlessLoads,
    ) -> u32 {
        let seats = (self.limits.max_num_seqs as usize).saturating_sub(num_running);
        match self.traits.admission {
            AdmissionRule::AnswerKvReserve => {}
            AdmissionRule::VirtualBatch => {
                let admitted = self.virtual_batch_admissible(waiting, order, seats, num_running, load);
                return self.with_seatless_loads(waiting, order, admitted, loads);
            }
            // Stock vLLM's admission: whatever its KV check lets in.
            AdmissionRule::Vllm => {
                return self.with_seatless_loads(waiting, order, order.len().min(seats) as u32, loads)
            }
        }
        let mut blocks_left = u64::from(num_free_blocks.saturating_sub(num_reserved_blocks));
        let block_size = u64::from(self.limits.block_size);
        let tpot_guard = self.config.overload.tpot_guard;
        let headroom = self.config.tpot_headroom;
        let (mut shape, mut tpot_ms) = (load.decodes(), load.any_tpot_ms);
        let (mut seated, mut loads_left) = (0usize, loads.left);
        let mut seats_open = seats > 0;
        let mut admitted = 0usize;
        let mut passed_over: Vec<usize> = Vec::new();
        for (position, &i) in order.iter().enumerate() {
            if !seats_open && loads_left == 0 {
                break;
            }
            let r = self.hot(waiting[i as usize]);
            if r.shed {
                break; // shed requests are last: nothing after them is admitted either
            }
            let seatless = loads.takes_no_seat(i, r);
            if (seatless && loads_left == 0) || (!seatless && !seats_open) {
                passed_over.push(position);
                continue;
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
            if tpot_guard && !seatless {
                // SCORPIO's virtual batch size: the decode step with it must still meet the
                // tightest answer TPOT target among the batch (a load decodes nothing yet).
                shape.num_decode_requests += 1;
                shape.num_context_tokens += u64::from(r.num_tokens);
                tpot_ms = tpot_ms.min(self.targets(r.class).answer_tpot_ms);
                if self.step_model.predict_ms(shape) > tpot_ms * headroom {
                    seats_open = false;
                    passed_over.push(position);
                    continue;
                }
            }
            blocks_left -= need;
            admitted += 1;
            if seatless {
                loads_left -= 1;
            } else {
                seated += 1;
                seats_open = seated < seats;
            }
        }
        admitted_first(order, &passed_over, admitted);
        let admissible = order.iter().take_while(|&&i| !self.hot(waiting[i as usize]).shed).count();
        at_least_one_when_idle(admitted as u32, num_running, admissible, seats)
    }

    /// A rule that admits by seats alone (vLLM's own, SCORPIO's virtual batch) with vLLM 0.34's
    /// async KV-load queue: behind the `admitted` head of `order`, requests of that queue start
    /// their loads without a seat, up to the cap, moved right behind the head (vLLM's KV check
    /// still applies to them).
    fn with_seatless_loads(
        &self,
        waiting: &[ReqHandle],
        order: &mut [u32],
        admitted: u32,
        loads: &SeatlessLoads,
    ) -> u32 {
        if loads.left == 0 {
            return admitted;
        }
        let head = admitted as usize;
        let mut loads_left = loads.left;
        let mut passed_over = Vec::new();
        let mut num_loads = 0usize;
        for (offset, &i) in order[head..].iter().enumerate() {
            if loads_left == 0 {
                break;
            }
            let r = self.hot(waiting[i as usize]);
            if r.shed {
                break;
            }
            if loads.takes_no_seat(i, r) {
                loads_left -= 1;
                num_loads += 1;
            } else {
                passed_over.push(offset);
            }
        }
        admitted_first(&mut order[head..], &passed_over, num_loads);
        admitted + num_loads as u32
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::config::Config;
    use crate::{AsyncKvLoads, EngineLimits, KvHandoff, Meridian, NewRequest, ReasoningMarkers, ReqHandle};

    /// Two classes (`fast` ranks first), queueing under overload, a step model without a fit.
    const CLASSES: &str = r#"{"classes": {
        "fast": {"ttft_ms": 60000, "ttfat_ms": 600000, "answer_tpot_ms": 1000, "rank": 0, "on_overload": "queue"},
        "slow": {"ttft_ms": 600000, "ttfat_ms": 6000000, "answer_tpot_ms": 1000, "rank": 1, "on_overload": "queue"}},
        "default_class": "slow", "step_time": {"online_fit": false}}"#;

    fn core(max_num_seqs: u32, cap: Option<u32>) -> Meridian {
        let limits =
            EngineLimits { max_num_inflight_kv_loads: cap, ..EngineLimits::new(16, 2048, max_num_seqs) };
        let markers = ReasoningMarkers::new(vec![1], vec![2], vec![]);
        Meridian::new(Config::from_json(CLASSES).unwrap(), limits, markers).unwrap()
    }

    fn add(core: &mut Meridian, req_id: &str, class: &str, receives: bool) -> ReqHandle {
        let prompt = vec![7u32; 31]; // two blocks with its first decode
        let new = NewRequest {
            req_id,
            arrival_ms: 0.0,
            prompt_token_ids: &prompt,
            max_tokens: 64,
            slo_class: Some(class),
            priority: 0,
            waited_ms: 0.0,
        };
        let handle = core.add_request(new).unwrap().0;
        if receives {
            core.set_kv_handoff(handle, KvHandoff::Receives).unwrap();
        }
        handle
    }

    /// `num_running` requests holding every seat, and a waiting list of plain requests followed by
    /// the async KV-load queue's.
    fn full_engine(
        cap: Option<u32>,
        plain: usize,
        loads: usize,
    ) -> (Meridian, Vec<ReqHandle>, Vec<ReqHandle>) {
        let mut core = core(2, cap);
        let running: Vec<_> = (0..2).map(|i| add(&mut core, &format!("run{i}"), "slow", false)).collect();
        let mut waiting: Vec<_> =
            (0..plain).map(|i| add(&mut core, &format!("w{i}"), "fast", false)).collect();
        waiting.extend((0..loads).map(|i| add(&mut core, &format!("a{i}"), "slow", true)));
        (core, running, waiting)
    }

    #[test]
    fn with_every_seat_taken_async_loads_start_up_to_the_cap_and_move_to_the_head() {
        let (mut core, running, waiting) = full_engine(Some(2), 1, 3);
        let loads = AsyncKvLoads { num_waiting: 3, num_inflight: 0 };
        let plan = core.plan_step_with_async_loads(10.0, &running, &waiting, 1000, loads).unwrap();
        assert_eq!(plan.num_admissible, 2, "two loads under the cap of 2; the plain request has no seat");
        assert_eq!(plan.waiting_order, vec![1, 2, 0, 3], "the admitted loads first, in their order");
        let loads = AsyncKvLoads { num_waiting: 3, num_inflight: 1 };
        let plan = core.plan_step_with_async_loads(11.0, &running, &waiting, 1000, loads).unwrap();
        assert_eq!(plan.num_admissible, 1, "one load already holds blocks");
        let loads = AsyncKvLoads { num_waiting: 3, num_inflight: 5 };
        let plan = core.plan_step_with_async_loads(12.0, &running, &waiting, 1000, loads).unwrap();
        assert_eq!(plan.num_admissible, 0, "past the cap (vLLM's count may exceed it after aborts)");
    }

    #[test]
    fn without_the_cap_the_async_queue_takes_seats_like_any_request() {
        let (mut core, running, waiting) = full_engine(None, 1, 3);
        let loads = AsyncKvLoads { num_waiting: 3, num_inflight: 0 };
        let plan = core.plan_step_with_async_loads(10.0, &running, &waiting, 1000, loads).unwrap();
        assert_eq!(plan.num_admissible, 0);
        let plain = core.plan_step(10.0, &running, &waiting, 1000).unwrap();
        assert_eq!((plan.waiting_order, plan.num_admissible), (plain.waiting_order, plain.num_admissible));
    }

    #[test]
    fn the_queues_are_ordered_together_by_class_and_a_load_takes_no_seat() {
        // One free seat: the fast class's plain request takes it, the slow class's load starts
        // beside it; a second plain request has no seat left.
        let mut core = core(3, Some(4));
        let running = vec![add(&mut core, "run0", "slow", false), add(&mut core, "run1", "slow", false)];
        let load = add(&mut core, "a0", "slow", true);
        let fast = add(&mut core, "w0", "fast", false);
        let slow = add(&mut core, "w1", "slow", false);
        let waiting = [fast, slow, load];
        let loads = AsyncKvLoads { num_waiting: 1, num_inflight: 0 };
        let plan = core.plan_step_with_async_loads(10.0, &running, &waiting, 1000, loads).unwrap();
        assert_eq!(plan.num_admissible, 2);
        assert_eq!(plan.waiting_order[0], 0, "the fast class goes first");
        assert_eq!(plan.waiting_order[1], 2, "the load, which needs no seat, is admitted next");
    }

    #[test]
    fn a_load_needs_its_blocks_under_the_answer_reserve() {
        let (mut core, running, waiting) = full_engine(Some(4), 0, 2);
        let loads = AsyncKvLoads { num_waiting: 2, num_inflight: 0 };
        let plan = core.plan_step_with_async_loads(10.0, &running, &waiting, 3, loads).unwrap();
        assert_eq!(plan.num_admissible, 1, "3 free blocks hold one two-block load, not two");
    }

    #[test]
    fn a_queue_longer_than_the_waiting_list_is_named() {
        let (mut core, running, waiting) = full_engine(Some(2), 1, 1);
        let loads = AsyncKvLoads { num_waiting: 3, num_inflight: 0 };
        let err = core.plan_step_with_async_loads(10.0, &running, &waiting, 1000, loads).unwrap_err();
        assert!(err.to_string().contains("num_async_waiting"), "{err}");
        let limits = EngineLimits { max_num_inflight_kv_loads: Some(0), ..EngineLimits::new(16, 2048, 2) };
        let err = Meridian::new(Config::default(), limits, ReasoningMarkers::new(vec![], vec![], vec![]))
            .unwrap_err();
        assert!(err.to_string().contains("max_num_inflight_kv_loads"), "{err}");
    }

    proptest! {
        /// Whatever the mix: seat-taking admissions stay within the free seats, loads within the
        /// cap's room, the admitted requests lead the order, and the order is a permutation.
        #[test]
        fn admissions_respect_seats_and_the_cap(
            num_running in 0usize..4, plain in 0usize..5, loads in 0usize..5,
            cap in proptest::option::of(1u32..4), inflight in 0u32..4, free_blocks in 0u32..40,
        ) {
            let mut core = core(3, cap);
            let running: Vec<_> = (0..num_running.min(3)).map(|i| add(&mut core, &format!("r{i}"), "slow", false)).collect();
            let mut waiting: Vec<_> = (0..plain).map(|i| add(&mut core, &format!("w{i}"), "fast", false)).collect();
            waiting.extend((0..loads).map(|i| add(&mut core, &format!("a{i}"), "slow", true)));
            let async_loads = AsyncKvLoads { num_waiting: loads, num_inflight: inflight };
            let plan = core.plan_step_with_async_loads(10.0, &running, &waiting, free_blocks, async_loads).unwrap();
            let mut sorted = plan.waiting_order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..waiting.len() as u32).collect::<Vec<_>>());
            let admitted = &plan.waiting_order[..plan.num_admissible as usize];
            let first_load = plain as u32;
            let num_loads = admitted.iter().filter(|&&i| i >= first_load).count() as u32;
            let num_seated = admitted.len() as u32 - num_loads;
            let seats = 3 - running.len() as u32;
            match cap {
                Some(cap) => {
                    prop_assert!(num_seated <= seats);
                    if !running.is_empty() {
                        prop_assert!(num_loads <= cap.saturating_sub(inflight));
                    }
                }
                None => prop_assert!(admitted.len() as u32 <= seats),
            }
        }
    }
}
