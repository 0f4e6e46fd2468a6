//! [`Meridian`] under overload: it owns the judgement whether a request can still meet its
//! targets and the triage of those that cannot. A request is *viable* when, with the predicted
//! decode step, the time left to its deadlines still holds its remaining thinking with at least
//! `overload.min_success_probability` (its class's remaining-thinking distribution given what it
//! has thought, [`crate::predictor::Quantile::Viable`]) and, before its first token, its prefill
//! fits before the TTFT deadline. A late request of a `shed` class is ended early: the plan lists
//! it with the target it can no longer meet ([`Shed`]), the core marks it, and its finish is
//! recorded as shed — for its TTFAT until it answers, or with `overload.shed_until: ttft` only
//! while its client would hear it by the class's TTFT target, after which it runs on as under
//! `queue`. A thinking request of a `degrade` class has its reasoning ended when only
//! the closing margin is left before its TTFAT deadline (the thinking is capped to what fits),
//! once a worker that can end it is attached. Invariants: an answering request is never shed,
//! nor an internal probe; a request is listed at most once (a shed one stays marked until vLLM
//! finishes it; an ended thinking is ended once); the reason names the first target the request
//! would miss.

use super::{Hot, Meridian, ReqHandle};
use crate::error::Result;
use crate::phase::Phase;
use crate::predictor::Quantile;
use crate::slo::{OnOverload, ShedUntil, SloTargets};

/// Decode steps kept before a degraded request's TTFAT deadline for its closing sequence (the
/// closing text and the end marker) and the step in flight.
pub const DEGRADE_MARGIN_STEPS: f64 = 4.0;

/// Steps between a plan and the first token of a request it leaves waiting, at the least (and
/// between a plan that sheds it and its client's notice, at the most): the step in flight,
/// which may be as long as the step budget allows, then decode steps.
pub const QUEUED_LEAD_STEPS: f64 = 3.0;

/// The target a late request can no longer meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// Its first token cannot come by its TTFT deadline: its prefill alone ends past it.
    Ttft,
    /// Its first answer token is unlikely to come by its TTFAT deadline: the time left holds its
    /// remaining thinking with less than the configured probability.
    Ttfat,
}

impl ShedReason {
    /// Every reason, for label sets.
    pub const ALL: [ShedReason; 2] = [ShedReason::Ttft, ShedReason::Ttfat];

    /// The name metrics, logs and error messages use: `ttft` or `ttfat`.
    pub const fn name(self) -> &'static str {
        match self {
            ShedReason::Ttft => "ttft",
            ShedReason::Ttfat => "ttfat",
        }
    }
}

/// What every shed request's message starts with (the stop reason its client sees): a client,
/// a router or Meridian's middleware that finds it knows triage ended the request, why, and when
/// to try again: `meridian:shed:<reason>:<retry after, s>: <sentence>` ([`parse_shed_notice`]).
pub const SHED_MARKER: &str = "meridian:shed";

/// The reason and the retry-after seconds of a shed request's message, or `None` when the text
/// is not one ([`ShedNotice::message`]).
pub fn parse_shed_notice(text: &str) -> Option<(ShedReason, u32)> {
    let rest = text.strip_prefix(SHED_MARKER)?.strip_prefix(':')?;
    let mut fields = rest.splitn(3, ':');
    let reason = fields.next()?;
    let retry_after_s = fields.next()?.parse().ok()?;
    fields.next()?;
    let reason = ShedReason::ALL.into_iter().find(|r| r.name() == reason)?;
    Some((reason, retry_after_s))
}

/// What the client of a shed request is told.
#[derive(Debug, Clone, PartialEq)]
pub struct ShedNotice {
    /// Starts with [`SHED_MARKER`], then the reason; names the request, its class and the target.
    pub message: String,
    /// When to try again (HTTP `Retry-After`), in whole seconds: the class's TTFT target, at
    /// least 1.
    pub retry_after_s: u32,
}

/// The late requests of `shed` classes one plan found ([`Meridian::judge`]): those that have not
/// started, those that have (running, or preempted), and the waiting requests not shed: how
/// many, and the KV blocks they need.
#[derive(Debug, Default)]
pub(super) struct ShedCandidates {
    fresh: Vec<Shed>,
    started: Vec<Shed>,
    num_waiting: usize,
    /// KV blocks the not-shed waiting requests need to start.
    waiting_blocks: u64,
}

/// One request the plan ends early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    /// Whether `index` is into `running` (else into `waiting`).
    pub running: bool,
    /// Index into the list it sits in.
    pub index: u32,
    /// The target it can no longer meet.
    pub reason: ShedReason,
}

impl Meridian {
    /// What the client of a live request shed for `reason` is told.
    pub fn shed_notice(&self, handle: ReqHandle, reason: ShedReason) -> Result<ShedNotice> {
        let r = self.get(handle)?;
        let class = &self.config.classes[r.class.index()];
        let (target, target_ms) = match reason {
            ShedReason::Ttft => ("TTFT", class.targets.ttft_ms),
            ShedReason::Ttfat => ("TTFAT", class.targets.ttfat_ms),
        };
        let retry_after_s = (class.targets.ttft_ms / 1000.0).ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
        Ok(ShedNotice {
            message: format!(
                "{SHED_MARKER}:{}:{retry_after_s}: request `{}` of class `{}` cannot meet its {target} target of \
                 {target_ms} ms under the current load; retry in {retry_after_s} s or on another instance",
                reason.name(),
                r.req_id,
                class.name
            ),
            retry_after_s,
        })
    }

    /// The longest a step may take this plan: with requests running, the budget's worth
    /// (`token_budget` tokens: their decodes and prompt chunks), else a decode step. The step in
    /// flight is one such step, which is why [`QUEUED_LEAD_STEPS`] counts it at this length: a
    /// step of prompt chunks lasts many decode steps, and counting it as one told shed clients
    /// their fate up to a step after their deadline.
    pub(super) fn longest_step_ms(
        &self,
        load: &super::RunningLoad,
        any_running: bool,
        token_budget: u32,
        decode_step_ms: f64,
    ) -> f64 {
        let mut longest = load.decodes();
        longest.num_prefill_tokens = token_budget.saturating_sub(longest.num_decode_requests);
        if any_running {
            self.step_model.predict_ms(longest).max(decode_step_ms)
        } else {
            decode_step_ms
        }
    }

    /// The target the request would miss, judged with `step_ms` per decode step, or `None` while
    /// it is viable (always `None` once it answers). `queued`: it waits in the queue, so its
    /// whole prompt is still to compute (a running one's progress is vLLM's, so only its TTFT
    /// deadline itself is checked).
    #[inline(always)]
    pub(super) fn lateness(
        &self,
        now_ms: f64,
        r: &Hot,
        targets: &SloTargets,
        step_ms: f64,
        queued: bool,
    ) -> Option<ShedReason> {
        if r.has_answered {
            return None;
        }
        let mut time_left_ms = r.arrival_ms + targets.ttfat_ms - now_ms;
        if !r.has_started {
            // A queued request starts a step or more from now, and its client learns a shed a step
            // or two after the plan (the step in flight, then the output): judged that far ahead,
            // a request shed for its TTFT is told before its deadline.
            let to_first_token_ms = if queued {
                self.prompt_ms(r) + self.queued_lead_ms.max(QUEUED_LEAD_STEPS * step_ms)
            } else {
                0.0
            };
            if now_ms + to_first_token_ms > r.arrival_ms + targets.ttft_ms {
                return Some(ShedReason::Ttft);
            }
            time_left_ms -= to_first_token_ms;
        }
        // The thinking it needs with the configured probability, and the end marker.
        let needed_tokens = if !r.is_reasoning || r.phase == Phase::Answer {
            0.0
        } else if r.num_think_tokens == 0 {
            self.fresh_think_viable_tokens[r.class.index()]
        } else {
            self.lengths[r.class.index()].think.remaining_quantile(r.num_think_tokens, Quantile::Viable)
        };
        ((needed_tokens + 1.0) * step_ms > time_left_ms).then_some(ShedReason::Ttfat)
    }

    /// Judges every listed request once for this plan ([`Self::lateness`]; running ones by their
    /// deadlines, waiting ones with their prompt still to compute), and gathers the late ones of
    /// `shed` classes as candidates for [`Self::triage`], in the same pass.
    pub(super) fn judge(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        step_ms: f64,
    ) -> ShedCandidates {
        let mut judgements = std::mem::take(&mut self.judgements);
        judgements.resize(self.slots.len(), 0);
        let mut candidates = ShedCandidates::default();
        for (in_running, list) in [(true, running), (false, waiting)] {
            for (i, &h) in list.iter().enumerate() {
                let r = self.hot(h);
                let late = self.lateness(now_ms, r, &self.targets(r.class), step_ms, !in_running);
                judgements[h.slot()] = late.map_or(0, |reason| reason as u8 + 1);
                if !in_running && !r.shed {
                    candidates.num_waiting += 1;
                    // A request whose KV is arriving holds its blocks already.
                    if !r.kv_arriving {
                        candidates.waiting_blocks +=
                            u64::from(r.num_tokens + 1).div_ceil(u64::from(self.limits.block_size));
                    }
                }
                let Some(reason) = late else { continue };
                let sheddable = self.any_shed_class
                    && !r.shed
                    && !r.has_answered
                    && r.phase != Phase::Answer
                    && self.class_triage[r.class.index()] == OnOverload::Shed
                    && self.within_shed_window(now_ms, r, reason);
                if sheddable {
                    let shed = Shed { running: in_running, index: i as u32, reason };
                    let started = in_running || r.has_started || r.preempted;
                    if started {
                        candidates.started.push(shed)
                    } else {
                        candidates.fresh.push(shed)
                    }
                }
            }
        }
        self.judgements = judgements;
        candidates
    }

    /// Whether a late request may still be shed (`overload.shed_until`): under `ttft` a TTFAT
    /// shed only while its client would hear it (the plan's lead to the client) by the class's
    /// TTFT target; past that the request runs on as under `queue`. A TTFT shed always: it is
    /// judged that lead ahead of the deadline, so its client hears it around the deadline, and
    /// a request skipped between two plans would otherwise wait on for nothing.
    #[inline(always)]
    fn within_shed_window(&self, now_ms: f64, r: &Hot, reason: ShedReason) -> bool {
        match (self.config.overload.shed_until, reason) {
            (ShedUntil::Ttfat, _) | (_, ShedReason::Ttft) => true,
            (ShedUntil::Ttft, ShedReason::Ttfat) => {
                now_ms + self.queued_lead_ms <= r.arrival_ms + self.targets(r.class).ttft_ms
            }
        }
    }

    /// This plan's judgement of a listed request: the target it would miss, if any.
    #[inline(always)]
    pub(super) fn judged(&self, handle: ReqHandle) -> Option<ShedReason> {
        match self.judgements[handle.slot()] {
            0 => None,
            1 => Some(ShedReason::Ttft),
            _ => Some(ShedReason::Ttfat),
        }
    }

    /// The requests to end early this step, of the plan's `candidates`: late ones of `shed`
    /// classes. A waiting one that can no longer start by its TTFT deadline always (it has waited
    /// for room and would only wait on); the others — waiting ones unlikely to answer in time, and
    /// (with `overload.shed_running`) running or preempted ones that have not started answering —
    /// only while the engine has no room for every waiting request (seats or KV blocks): shedding
    /// work the engine has room for helps no one. Marks each, so it is listed once and its finish
    /// counts as shed.
    pub(super) fn triage(
        &mut self,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
        num_free_blocks: u32,
        candidates: ShedCandidates,
    ) -> Vec<Shed> {
        let ShedCandidates { fresh, started, num_waiting, waiting_blocks } = candidates;
        let contended = running.len() + num_waiting > self.limits.max_num_seqs as usize
            || waiting_blocks > u64::from(num_free_blocks);
        let mut out = Vec::new();
        if contended && self.config.overload.shed_running {
            out = started;
        }
        out.extend(fresh.into_iter().filter(|s| contended || s.reason == ShedReason::Ttft));
        out.sort_by_key(|s| (!s.running, s.index));
        out.retain(|s| {
            let h = if s.running { running[s.index as usize] } else { waiting[s.index as usize] };
            self.mark_shed(h, s.reason)
        });
        out
    }

    /// The waiting requests of `shed` classes this plan leaves waiting that the next plan could
    /// no longer start by their TTFT deadline: shed now, added to `shed`. The judgement before
    /// admission asks whether a request could start if admitted now; one left waiting is next
    /// admitted a step later, and judged only then it would be shed — and its client told —
    /// after its deadline (measured: TTFT notices up to 19 % past a 1 s target on the corpus).
    /// Left waiting are those past `num_admissible` and those vLLM will find no tokens for: of
    /// `tokens_left` ([`Self::tokens_left_for_waiting`]) each waiting request in order takes up
    /// to its prompt.
    pub(super) fn shed_the_unadmitted(
        &mut self,
        now_ms: f64,
        waiting: &[ReqHandle],
        order: &[u32],
        num_admissible: u32,
        mut tokens_left: u64,
        mut shed: Vec<Shed>,
    ) -> Vec<Shed> {
        let num_before = shed.len();
        for (position, &i) in order.iter().enumerate() {
            let h = waiting[i as usize];
            let r = self.hot(h);
            if position < num_admissible as usize && tokens_left > 0 {
                tokens_left = tokens_left.saturating_sub(u64::from(r.num_tokens));
                continue;
            }
            let candidate = !r.shed
                && !r.has_started
                && !r.preempted
                && self.class_triage[r.class.index()] == OnOverload::Shed;
            if !candidate {
                continue;
            }
            let next_start_ms = now_ms + self.longest_step_ms;
            let first_token_ms = next_start_ms + self.prompt_ms(r) + self.queued_lead_ms;
            if first_token_ms > r.arrival_ms + self.targets(r.class).ttft_ms
                && self.mark_shed(h, ShedReason::Ttft)
            {
                shed.push(Shed { running: false, index: i, reason: ShedReason::Ttft });
            }
        }
        if shed.len() > num_before {
            shed.sort_by_key(|s| (!s.running, s.index));
        }
        shed
    }

    /// What vLLM leaves of the step's `token_budget` to waiting requests: it serves the running
    /// ones first, every decode and then the rest of the prompts still prefilling (taken here at
    /// their whole length: the core does not see how far their prefill got).
    pub(super) fn tokens_left_for_waiting(&self, running: &[ReqHandle], token_budget: u32) -> u64 {
        running.iter().fold(u64::from(token_budget), |left, &h| {
            let r = self.hot(h);
            left.saturating_sub(if r.has_started { 1 } else { u64::from(r.num_tokens) })
        })
    }

    /// Marks a request shed for `reason`; false for an internal probe, which is never shed.
    fn mark_shed(&mut self, handle: ReqHandle, reason: ShedReason) -> bool {
        let Some(r) = self.slots[handle.slot()].request.as_mut() else { return false };
        if r.probe {
            return false;
        }
        r.shed = Some(reason);
        self.refresh_hot(handle);
        true
    }

    /// A worker that can end a request's thinking is attached (the logits processor; the replay's
    /// scripted model): from now on plans end the thinking of `degrade` classes' requests in
    /// time. Without one, their late requests queue as under `queue`.
    pub fn set_thinking_worker(&mut self, attached: bool) {
        self.degrades = attached && self.class_triage.contains(&OnOverload::Degrade);
    }

    /// The thinking requests of `degrade` classes whose reasoning must end now for the answer to
    /// start by the TTFAT deadline: the time left is within [`DEGRADE_MARGIN_STEPS`] decode
    /// steps and `overload.degrade_margin_ms`. Indices into `running`, ascending; marks each.
    pub(super) fn degrade(&mut self, now_ms: f64, running: &[ReqHandle], step_ms: f64) -> Vec<u32> {
        if !self.degrades {
            return Vec::new();
        }
        let margin_ms = DEGRADE_MARGIN_STEPS * step_ms + self.config.overload.degrade_margin_ms;
        let mut out = Vec::new();
        for (i, &h) in running.iter().enumerate() {
            let r = self.hot(h);
            let due = r.phase == Phase::Think
                && !r.thinking_ended
                && !r.shed
                && self.class_triage[r.class.index()] == OnOverload::Degrade
                && r.arrival_ms + self.targets(r.class).ttfat_ms - now_ms <= margin_ms;
            if due {
                out.push(i as u32);
            }
        }
        for &i in &out {
            let h = running[i as usize];
            if let Some(r) = self.slots[h.slot()].request.as_mut() {
                r.thinking_ended = true;
                self.num_thinking_ended += 1;
                self.class_counters[r.class.index()].num_degraded += 1;
            }
            self.refresh_hot(h);
        }
        out
    }

    /// Seats and KV blocks the plan's shed running requests give back.
    pub(super) fn freed_by_shed(&self, running: &[ReqHandle], shed: &[Shed]) -> (usize, u32) {
        let block_size = u64::from(self.limits.block_size);
        let mut blocks = 0u64;
        let mut seats = 0usize;
        for s in shed.iter().filter(|s| s.running) {
            seats += 1;
            blocks += u64::from(self.hot(running[s.index as usize]).num_tokens).div_ceil(block_size);
        }
        (seats, blocks.min(u64::from(u32::MAX)) as u32)
    }
}

/// Moves the waiting requests a plan sheds past its admissible ones to the end of the waiting
/// order, keeping the order of the rest: the shim ends them before vLLM schedules, so none may
/// stand before a request that can still be admitted or prefetched (the second shed pass judges
/// requests where the first ordering left them). The admissible prefix is left as it is. `shed`
/// is sorted running first, then by index, as the plan lists it.
pub(super) fn shed_waiting_last(order: &mut [u32], num_admissible: u32, shed: &[Shed]) {
    let waiting_shed = &shed[shed.partition_point(|s| s.running)..];
    if waiting_shed.is_empty() {
        return;
    }
    let is_shed = |i: &u32| waiting_shed.binary_search_by_key(i, |s| s.index).is_ok();
    let start = (num_admissible as usize).min(order.len());
    let tail = &mut order[start..];
    let (mut kept, moved): (Vec<u32>, Vec<u32>) = tail.iter().partition(|i| !is_shed(i));
    kept.extend(moved);
    tail.copy_from_slice(&kept);
}

#[cfg(test)]
mod tests {
    use super::parse_shed_notice;
    use crate::scheduler::tiers::tests::core;
    use crate::{Meridian, NewRequest, OnOverload, ReqHandle, ShedReason, SHED_MARKER};

    const THINK: u32 = 1;
    const END: u32 = 2;
    const WORD: u32 = 100;

    /// Step time: 10 ms a step, 1 ms a prompt token (so a 100-token prompt takes 100 ms).
    const STEPS: &str = r#""step_time": {"base_ms": 10, "per_prefill_token_ms": 1, "per_decode_request_ms": 0,
        "per_context_token_ms": 0, "online_fit": false}"#;

    /// One class `c` with TTFT 1 s and TTFAT 10 s under `mode`; its thinking prior is 200 tokens
    /// (so with the 10 ms step a fresh request needs ~2 s of its 10).
    fn engine(mode: &str) -> Meridian {
        engine_with(mode, 10_000, "{}")
    }

    /// [`engine`] with another TTFAT target and `overload` block.
    fn engine_with(mode: &str, ttfat_ms: u32, overload: &str) -> Meridian {
        core(&format!(
            r#"{{{STEPS}, "classes": {{"c": {{"ttft_ms": 1000, "ttfat_ms": {ttfat_ms}, "answer_tpot_ms": 50,
                "rank": 0, "on_overload": "{mode}"}}}}, "default_class": "c", "overload": {overload},
                "think_tokens_prior": [200], "answer_tokens_prior": [20]}}"#
        ))
    }

    fn add(core: &mut Meridian, req_id: &str, arrival_ms: f64, prompt_len: usize) -> ReqHandle {
        let mut prompt = vec![WORD; prompt_len];
        prompt.push(THINK);
        let new = NewRequest {
            req_id,
            arrival_ms,
            prompt_token_ids: &prompt,
            max_tokens: 4096,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        };
        core.add_request(new).unwrap().0
    }

    #[test]
    fn a_waiting_request_whose_prefill_ends_past_its_ttft_deadline_is_shed_for_ttft() {
        let mut core = engine("shed");
        // 101 prompt tokens: a 111 ms prefill step (10 ms and 1 ms a token), after three 10 ms
        // steps at the least. At 850 ms the first token could come at 991 (in time); at 870 only
        // at 1,011, past the 1 s target.
        let a = add(&mut core, "a", 0.0, 100);
        assert!(core.plan_step(850.0, &[], &[a], 1000).unwrap().shed.is_empty());
        let plan = core.plan_step(870.0, &[], &[a], 1000).unwrap();
        assert_eq!(plan.shed.len(), 1);
        let shed = plan.shed[0];
        assert_eq!((shed.running, shed.index, shed.reason), (false, 0, ShedReason::Ttft));
        assert_eq!(plan.num_admissible, 0, "a shed request is never admitted");
        // Listed once; its finish (vLLM's abort) reports why.
        assert!(core.plan_step(960.0, &[], &[a], 1000).unwrap().shed.is_empty());
        let done = core.finish(970.0, a, "abort", &[]).unwrap();
        assert_eq!(done.shed, Some(ShedReason::Ttft));
        let counters = core.class_counters()[0];
        assert_eq!((counters.num_shed, counters.num_aborted), ([1, 0], 1));
        assert_eq!(core.stats().num_shed, 1);
    }

    #[test]
    fn a_request_left_waiting_is_shed_when_the_next_plan_could_not_start_it_in_time() {
        // Two 101-token prompts (111 ms prefill each; three 10 ms steps of lead) and KV room
        // for one; b arrived at 1 ms (deadline 1,001). At 855 ms a's first token could come at
        // 996 ms, in time. b is next admitted a step later at the earliest (865 ms), its first
        // token at 1,006 ms: late, so it is shed now — at the next plan its client would hear
        // only after its deadline. At 700 ms it would still be in time then.
        let mut core = engine("shed");
        let a = add(&mut core, "a", 0.0, 100);
        let b = add(&mut core, "b", 1.0, 100);
        let plan = core.plan_step(700.0, &[], &[a, b], 7).unwrap();
        assert_eq!((plan.num_admissible, plan.shed.len()), (1, 0), "at 700 ms the next plan is in time");
        let plan = core.plan_step(855.0, &[], &[a, b], 7).unwrap();
        assert_eq!(plan.num_admissible, 1);
        assert_eq!(plan.waiting_order[0], 0, "the older one is admitted");
        let listed: Vec<_> = plan.shed.iter().map(|s| (s.running, s.index, s.reason)).collect();
        assert_eq!(listed, [(false, 1, ShedReason::Ttft)]);
        assert_eq!(core.stats().num_shed, 1);
        // Under `queue` it waits on.
        let mut queued = engine("queue");
        let a = add(&mut queued, "a", 0.0, 100);
        let b = add(&mut queued, "b", 1.0, 100);
        assert!(queued.plan_step(855.0, &[], &[a, b], 7).unwrap().shed.is_empty());
    }

    #[test]
    fn a_request_vllm_finds_no_tokens_for_counts_as_left_waiting() {
        // A running 3,000-token prompt still prefilling takes the whole step budget, so vLLM
        // schedules none of the waiting request's prompt although the KV cache has room. With
        // a request running the lead is 132.5 ms and so is the longest step: admitted now,
        // the 101-token prompt is in time until 756.5 ms; admitted at the next plan, until
        // 644 ms. At 700 ms it is shed; at 600 ms it waits.
        for (now_ms, shed) in [(600.0, false), (700.0, true)] {
            let mut core = engine("shed");
            let prefilling = add(&mut core, "prefilling", 0.0, 3_000);
            let a = add(&mut core, "a", 0.0, 100);
            let plan = core.plan_step(now_ms, &[prefilling], &[a], 1_000).unwrap();
            assert_eq!(plan.num_admissible, 1, "{now_ms}: the KV cache has room");
            let listed: Vec<_> = plan.shed.iter().map(|s| (s.running, s.index, s.reason)).collect();
            let expected: &[_] = if shed { &[(false, 0, ShedReason::Ttft)] } else { &[] };
            assert_eq!(listed, expected, "{now_ms}");
        }
    }

    #[test]
    fn the_step_in_flight_counts_at_the_length_the_budget_allows() {
        // With a request running, the step in flight may carry prompt chunks up to the budget:
        // nobody answers, so it aims at 2.5 × 0.9 × the 50 ms TPOT target = 112.5 ms. The lead is
        // that step and two 10 ms decode steps (132.5 ms), so the 101-token prompt (111 ms) is
        // late from 1000 - 243.5 = 756.5 ms on, where three decode steps alone (30 ms) would
        // have waited until 859 ms and told its client up to a long step past its deadline.
        let mut core = engine("shed");
        let thinker = add(&mut core, "thinker", 0.0, 10);
        core.on_tokens(50.0, thinker, &[WORD; 5]).unwrap();
        let a = add(&mut core, "a", 0.0, 100);
        assert!(core.plan_step(740.0, &[thinker], &[a], 1000).unwrap().shed.is_empty());
        let plan = core.plan_step(780.0, &[thinker], &[a], 1000).unwrap();
        let listed: Vec<_> = plan.shed.iter().map(|s| (s.running, s.index, s.reason)).collect();
        assert_eq!(listed, [(false, 0, ShedReason::Ttft)]);
    }

    #[test]
    fn a_thinker_that_cannot_answer_in_time_is_shed_for_ttfat_but_an_answering_one_never() {
        // Shed until it answers (the default): the thinker turns late long after its TTFT target.
        let mut core = engine("shed");
        let thinker = add(&mut core, "thinker", 0.0, 10);
        let answerer = add(&mut core, "answerer", 0.0, 10);
        core.on_tokens(100.0, thinker, &[WORD; 50]).unwrap();
        core.on_tokens(100.0, answerer, &[WORD, END, WORD]).unwrap();
        // At 5 s the thinker has 5 s left: 500 steps of 10 ms, plenty for the rest of its 200.
        let plan = core.plan_step(5_000.0, &[thinker, answerer], &[], 1000).unwrap();
        assert!(plan.shed.is_empty());
        // At 9.9 s it has 10 steps left and needs more than 100 tokens with any probability —
        // but while the engine has room for everyone waiting, ending it would help no one.
        assert!(core.plan_step(9_900.0, &[thinker, answerer], &[], 1000).unwrap().shed.is_empty());
        let newcomer = add(&mut core, "newcomer", 9_900.0, 10);
        assert!(core.plan_step(9_900.0, &[thinker, answerer], &[newcomer], 1000).unwrap().shed.is_empty());
        // A newcomer the KV cache has no room for: the thinker makes way.
        let plan = core.plan_step(9_900.0, &[thinker, answerer], &[newcomer], 0).unwrap();
        let listed: Vec<_> = plan.shed.iter().map(|s| (s.running, s.index, s.reason)).collect();
        assert_eq!(listed, [(true, 0, ShedReason::Ttfat)]);
        assert_eq!(*plan.running_order.last().unwrap(), 0, "the shed thinker goes last");
    }

    #[test]
    fn under_shed_until_ttft_a_thinker_is_shed_only_while_its_client_would_hear_it_in_time() {
        // TTFAT 1.5 s: with the 10 ms step and a 200-token thinking prior a thinker that has
        // thought 5 tokens needs about 2 s more, so it is late from the start. The KV cache has
        // no room for the newcomer, so late work makes way. The lead to the client is 132.5 ms
        // (the budget-long step in flight and two decode steps): the window closes at 867.5 ms.
        assert_eq!(engine("shed").config().overload.shed_until, crate::ShedUntil::Ttfat, "the default");
        for (shed_until, shed_after_window) in [("ttft", false), ("ttfat", true)] {
            let mut core = engine_with("shed", 1_500, &format!(r#"{{"shed_until": "{shed_until}"}}"#));
            let thinker = add(&mut core, "thinker", 0.0, 10);
            core.on_tokens(100.0, thinker, &[WORD; 5]).unwrap();
            let late_at = |core: &mut Meridian, now_ms: f64| {
                let newcomer = add(core, &format!("newcomer-{now_ms}"), now_ms, 10);
                let plan = core.plan_step(now_ms, &[thinker], &[newcomer], 0).unwrap();
                plan.shed.iter().any(|s| (s.running, s.index, s.reason) == (true, 0, ShedReason::Ttfat))
            };
            assert!(late_at(&mut core.clone(), 865.0), "{shed_until}: within the window");
            assert_eq!(late_at(&mut core, 875.0), shed_after_window, "{shed_until}: past the window");
        }
    }

    #[test]
    fn the_ablations_and_baselines_never_triage() {
        for policy in ["answer_first", "pascal", "uniboost", "scorpio"] {
            let mut core = core(&format!(
                r#"{{{STEPS}, "policy": "{policy}", "classes": {{"c": {{"ttft_ms": 1000, "ttfat_ms": 10000,
                    "answer_tpot_ms": 50, "rank": 0, "on_overload": "shed"}}}}, "default_class": "c"}}"#
            ));
            let a = add(&mut core, "a", 0.0, 100);
            let plan = core.plan_step(5_000.0, &[], &[a], 0).unwrap();
            assert!(plan.shed.is_empty(), "{policy} shed a request");
        }
    }

    #[test]
    fn only_shed_classes_shed_and_shed_running_keeps_started_requests() {
        for mode in ["queue", "degrade"] {
            let mut core = engine(mode);
            let a = add(&mut core, "a", 0.0, 100);
            let plan = core.plan_step(5_000.0, &[], &[a], 1000).unwrap();
            assert!(plan.shed.is_empty(), "{mode}");
            assert_eq!(plan.num_admissible, 1, "{mode}: a late request still waits its turn");
        }
        let mut core = core(&format!(
            r#"{{{STEPS}, "classes": {{"c": {{"ttft_ms": 1000, "ttfat_ms": 10000, "answer_tpot_ms": 50,
                "rank": 0, "on_overload": "shed"}}}}, "default_class": "c", "overload": {{"shed_running": false}}}}"#
        ));
        let running = add(&mut core, "running", 0.0, 10);
        let waiting = add(&mut core, "waiting", 0.0, 10);
        core.on_tokens(100.0, running, &[WORD; 5]).unwrap();
        let plan = core.plan_step(20_000.0, &[running], &[waiting], 1000).unwrap();
        let listed: Vec<_> = plan.shed.iter().map(|s| (s.running, s.index)).collect();
        assert_eq!(listed, [(false, 0)], "only the waiting one");
        assert_eq!(core.config().classes[0].on_overload, OnOverload::Shed);
    }

    #[test]
    fn degrade_ends_the_thinking_when_only_the_margin_is_left_and_only_with_a_worker() {
        // TTFAT 10 s, 10 ms steps: the margin is 4 steps and 500 ms, so the thinking ends at
        // 10,000 - 540 = 9,460 ms.
        for worker in [false, true] {
            let mut core = engine("degrade");
            core.set_thinking_worker(worker);
            let thinker = add(&mut core, "thinker", 0.0, 10);
            let answerer = add(&mut core, "answerer", 0.0, 10);
            core.on_tokens(100.0, thinker, &[WORD; 50]).unwrap();
            core.on_tokens(100.0, answerer, &[WORD, END, WORD]).unwrap();
            let running = [answerer, thinker];
            assert!(core.plan_step(9_400.0, &running, &[], 1000).unwrap().end_thinking.is_empty());
            let plan = core.plan_step(9_470.0, &running, &[], 1000).unwrap();
            let expected: &[u32] = if worker { &[1] } else { &[] };
            assert_eq!(plan.end_thinking, expected, "worker {worker}");
            assert!(plan.shed.is_empty(), "degrade never sheds");
            // Once per request; the worker keeps reading it until the request finishes.
            assert!(core.plan_step(9_480.0, &running, &[], 1000).unwrap().end_thinking.is_empty());
            let endings: &[&str] = if worker { &["thinker"] } else { &[] };
            assert_eq!(core.thinking_endings(), endings);
            assert_eq!(core.class_counters()[0].num_degraded, u64::from(worker));
            assert_eq!(core.stats().num_degraded, u64::from(worker));
            assert!(!core.finish(9_500.0, answerer, "stop", &[]).unwrap().probe);
            assert_eq!(core.thinking_endings(), endings, "another request's finish leaves it");
            core.finish(9_500.0, thinker, "stop", &[]).unwrap();
            assert!(core.thinking_endings().is_empty());
        }
    }

    #[test]
    fn the_notice_names_the_marker_the_reason_the_class_and_the_target() {
        let mut core = engine("shed");
        let a = add(&mut core, "req-7", 0.0, 100);
        let notice = core.shed_notice(a, ShedReason::Ttfat).unwrap();
        assert!(notice.message.starts_with(&format!("{SHED_MARKER}:ttfat:1: ")), "{}", notice.message);
        for part in ["`req-7`", "`c`", "TTFAT", "10000 ms"] {
            assert!(notice.message.contains(part), "{part} in {}", notice.message);
        }
        assert_eq!(notice.retry_after_s, 1, "the class's TTFT target, 1 s");
        assert_eq!(parse_shed_notice(&notice.message), Some((ShedReason::Ttfat, 1)));
        for other in [
            "",
            "meridian:shed",
            "meridian:shed:ttfat:1",
            "meridian:shed:gold:1: x",
            "meridian:shed:ttft:x: y",
            "stop",
            "xmeridian:shed:ttft:1: y",
        ] {
            assert_eq!(parse_shed_notice(other), None, "{other:?}");
        }
    }

    #[test]
    fn light_load_keeps_arrival_order_until_a_request_runs_short_of_slack() {
        let config = format!(
            r#"{{{STEPS}, "classes": {{
                "interactive": {{"ttft_ms": 2000, "ttfat_ms": 60000, "answer_tpot_ms": 50, "rank": 0}},
                "batch": {{"ttft_ms": 60000, "ttfat_ms": 600000, "answer_tpot_ms": 500, "rank": 2}}}},
                "default_class": "batch"}}"#
        );
        let mut engine = core(&config);
        let new = |core: &mut Meridian, id: &str, at: f64, class: &str| {
            let prompt = [WORD, WORD, THINK];
            let req = NewRequest {
                req_id: id,
                arrival_ms: at,
                prompt_token_ids: &prompt,
                max_tokens: 64,
                slo_class: Some(class),
                priority: 0,
                waited_ms: 0.0,
            };
            core.add_request(req).unwrap().0
        };
        let batch = new(&mut engine, "batch", 0.0, "batch");
        let interactive = new(&mut engine, "interactive", 100.0, "interactive");
        // Both safely inside their targets: arrival order, whatever the class.
        assert_eq!(engine.plan_step(200.0, &[], &[interactive, batch], 1000).unwrap().waiting_order, [1, 0]);
        // Past half its 2 s TTFT target the interactive request goes ahead.
        assert_eq!(
            engine.plan_step(1_200.0, &[], &[interactive, batch], 1000).unwrap().waiting_order,
            [0, 1]
        );
        // With the rule off, class rank orders them from the start.
        let mut ranked = core(&config.replacen('{', r#"{"overload": {"fcfs_slack_ttft_factor": 0}, "#, 1));
        let batch = new(&mut ranked, "batch", 0.0, "batch");
        let interactive = new(&mut ranked, "interactive", 100.0, "interactive");
        assert_eq!(ranked.plan_step(200.0, &[], &[batch, interactive], 1000).unwrap().waiting_order, [1, 0]);
    }

    #[test]
    fn the_tpot_guard_stops_admission_where_the_decode_step_would_miss_the_target() {
        // 10 ms a step plus 1 ms per request decoding; the 50 ms target with 0.9 headroom allows
        // 45 ms: 35 requests decoding.
        let config = r#"{"step_time": {"base_ms": 10, "per_prefill_token_ms": 0.001, "per_decode_request_ms": 1,
            "per_context_token_ms": 0, "online_fit": false}, "default_class": "c",
            "overload": {"fcfs_slack_ttft_factor": 0}, "classes": {"c": {"ttft_ms": 100000,
            "ttfat_ms": 1000000, "answer_tpot_ms": 50, "rank": 0}}}"#;
        for (guard, expected) in [(true, 35), (false, 60)] {
            let mut core = core(
                &config.replace("\"overload\": {", &format!("\"overload\": {{\"tpot_guard\": {guard}, ")),
            );
            let waiting: Vec<_> = (0..60).map(|i| add(&mut core, &format!("w{i}"), 0.0, 4)).collect();
            let plan = core.plan_step(1.0, &[], &waiting, 100_000).unwrap();
            assert_eq!(plan.num_admissible, expected, "guard {guard}");
        }
    }
}
