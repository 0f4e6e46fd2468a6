//! [`Meridian`]'s account of the load it holds, for the operator's gauges and for a router: per
//! SLO class how many requests wait, prefill, think and answer, the least slack before a TTFAT
//! or TTFT deadline, the time left to the nearest TTFAT deadline and the saturation (how far a
//! new request would wait before its first token, in units of its TTFT target); and the
//! phase-weighted queue, the engine's expected remaining output in units of a fresh request's
//! (and per class in tokens). Read-only: it changes no state, so publishing it can never change
//! a plan. Invariant: internal EAT probes are never counted, and every figure is finite or absent
//! (`None`), never a sentinel.

use super::{Hot, Meridian, ReqHandle};
use crate::error::Result;
use crate::phase::Phase;
use crate::step_model::StepShape;

/// One SLO class's share of the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassLoad {
    /// Requests in vLLM's waiting queue (new or preempted).
    pub num_waiting: u32,
    /// Running requests that have not produced a token yet.
    pub num_prefilling: u32,
    /// Running requests in their reasoning.
    pub num_thinking: u32,
    /// Running requests producing their answer.
    pub num_answering: u32,
    /// Least slack, in ms, among the class's requests that have not answered yet: time to spare
    /// before the TTFAT deadline after the expected remaining thinking (and before the TTFT
    /// deadline for one without a token); negative when one is expected to miss. `None` when
    /// every request of the class is answering or there is none.
    pub least_slack_ms: Option<f64>,
    /// Time left, in ms, to the nearest TTFAT deadline among the same requests (negative once it
    /// passed), with no work deducted: how close the class is to missing, whatever the model
    /// predicts.
    pub ttfat_headroom_ms: Option<f64>,
    /// Expected remaining output tokens of the class's requests (a waiting request's whole
    /// expected output): the phase-weighted queue in tokens, for routers that read a gauge as
    /// an integer.
    pub expected_output_tokens: f64,
    /// How long a request of the class arriving now would wait for its first token, in units
    /// of the class's TTFT target: the viable waiting requests it would queue behind (those of
    /// its rank or better) over the rate at which requests have been starting. 1 or more: a new
    /// one would miss its TTFT target — a router should send it elsewhere, and under `shed`
    /// Meridian would end it. 0 when nothing waits ahead. At most [`MAX_SATURATION`].
    pub saturation: f64,
    /// The viable waiting requests of the class's rank or better: the queue a request of the
    /// class arriving now joins behind (what [`crate::ArrivalSnapshot`] publishes).
    pub num_waiting_ahead: u32,
}

/// The saturation gauge's ceiling (a queue that does not drain at all).
pub const MAX_SATURATION: f64 = 100.0;

/// Requests per ms of one kind of event, decayed exponentially with a time constant of
/// [`RATE_TIME_CONSTANT_MS`]: each event adds `1/τ`, and the sum decays by `e^(−Δt/τ)`. Read
/// before a time constant has passed since the first event, the sum still holds only what that
/// short a span saw; divided by the share of the span that counts (`1 − e^(−span/τ)`, the bias
/// correction of a moving average started from zero), a fresh server's first starts give its
/// real rate instead of a tenth of it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RateMeter {
    per_ms: f64,
    last_ms: f64,
    first_ms: Option<f64>,
}

/// The rate meter's time constant: long enough to span a few admissions under heavy load,
/// short enough to follow a burst within seconds.
pub const RATE_TIME_CONSTANT_MS: f64 = 10_000.0;
/// The shortest span the meter divides by: a second, so a burst of starts at once reads as that
/// many in a second, not as an unbounded rate.
const MIN_RATE_SPAN_MS: f64 = 1_000.0;

impl RateMeter {
    pub(crate) fn record(&mut self, now_ms: f64) {
        self.per_ms = self.decayed(now_ms) + 1.0 / RATE_TIME_CONSTANT_MS;
        self.last_ms = self.last_ms.max(now_ms);
        self.first_ms.get_or_insert(now_ms);
    }

    fn decayed(&self, now_ms: f64) -> f64 {
        let elapsed_ms = (now_ms - self.last_ms).max(0.0);
        self.per_ms * (-elapsed_ms / RATE_TIME_CONSTANT_MS).exp()
    }

    /// Events per ms at `now_ms` (0 before the first).
    pub(crate) fn at(&self, now_ms: f64) -> f64 {
        let Some(first_ms) = self.first_ms else { return 0.0 };
        let span_ms = (now_ms - first_ms).max(MIN_RATE_SPAN_MS);
        self.decayed(now_ms) / (1.0 - (-span_ms / RATE_TIME_CONSTANT_MS).exp())
    }
}

/// The seat a finished request held, lately: decayed means of its prompt and of the tokens it
/// generated, over about [`SEAT_MEMORY_REQUESTS`] requests (a plain mean before that many).
/// Every request that generated a token counts, however it ended: a shed or aborted one held its
/// seat too. The means are of lengths, not times, so a light load's fast steps do not pass for
/// a full engine's.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SeatMeter {
    num: f64,
    prompt_tokens: f64,
    output_tokens: f64,
}

/// The seat meter's memory, in finished requests: a few seats' turnovers, so a shift in the mix
/// shows within seconds under load.
pub const SEAT_MEMORY_REQUESTS: f64 = 100.0;

impl SeatMeter {
    pub(crate) fn record(&mut self, num_prompt_tokens: u32, num_output_tokens: u32) {
        self.num = (self.num + 1.0).min(SEAT_MEMORY_REQUESTS);
        let weight = 1.0 / self.num;
        self.prompt_tokens += weight * (f64::from(num_prompt_tokens) - self.prompt_tokens);
        self.output_tokens += weight * (f64::from(num_output_tokens) - self.output_tokens);
    }

    /// The mean prompt and output tokens, once a request has finished.
    pub(crate) fn means(&self) -> Option<(f64, f64)> {
        (self.num > 0.0).then_some((self.prompt_tokens, self.output_tokens))
    }
}

/// The engine's load as one plan sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLoad {
    /// Indexed by [`crate::ClassId`].
    pub classes: Vec<ClassLoad>,
    /// Expected remaining output tokens of every request the engine holds (waiting requests
    /// whole), each divided by the expected output of a fresh request of its class: a queue
    /// length in which a request about to finish its answer weighs little and a fresh long
    /// thinker weighs one or more. Count-based balancers weigh both alike.
    pub phase_weighted_queue: f64,
    /// Requests per second the queue drains at: the rate requests have been starting (first
    /// token) lately, or the rate a full engine frees seats, whichever is higher (see
    /// `drain_starts_per_ms`); at least one per [`RATE_TIME_CONSTANT_MS`].
    pub starts_per_s: f64,
    /// Seats a request arriving now could take at the next step: `max_num_seqs` less the running
    /// requests and the viable waiting ones.
    pub free_seats: u32,
    /// The least time from a queued request's admission to its first token, ms: the step in
    /// flight and the decode steps until its output reaches the client.
    pub first_token_lead_ms: f64,
}

impl Meridian {
    /// The load of the requests in `running` and `waiting` (vLLM's lists) at `now_ms`.
    pub fn engine_load(
        &mut self,
        now_ms: f64,
        running: &[ReqHandle],
        waiting: &[ReqHandle],
    ) -> Result<EngineLoad> {
        let now_ms = crate::error::check_time_ms("now_ms", now_ms)?;
        self.check_distinct(running, waiting)?;
        let step_ms = self.step_model.predict_ms(self.running_load(now_ms, running).decodes());
        let mut load = EngineLoad {
            classes: vec![ClassLoad::default(); self.class_table.len()],
            phase_weighted_queue: 0.0,
            starts_per_s: 0.0,
            free_seats: 0,
            first_token_lead_ms: self.queued_lead_ms.max(super::overload::QUEUED_LEAD_STEPS * step_ms),
        };
        let mut num_running = 0usize;
        // Viable waiting requests by rank: who a new request of each class would queue behind.
        let mut waiting_by_rank = [0u32; 256];
        for (&h, is_waiting) in running.iter().map(|h| (h, false)).chain(waiting.iter().map(|h| (h, true))) {
            if self.is_probe(h).unwrap_or(false) {
                continue;
            }
            num_running += usize::from(!is_waiting);
            let r = *self.hot(h);
            let class = &mut load.classes[r.class.index()];
            self.count_request(class, &r, is_waiting, now_ms, step_ms);
            let (remaining_tokens, fresh_tokens) = self.expected_output(&r);
            class.expected_output_tokens += remaining_tokens;
            load.phase_weighted_queue += remaining_tokens / fresh_tokens.max(1.0);
            let targets = self.targets(r.class);
            if is_waiting && !r.shed && self.lateness(now_ms, &r, &targets, step_ms, true).is_none() {
                waiting_by_rank[usize::from(self.class_table[r.class.index()].1)] += 1;
            }
        }
        let starts_per_ms = self.drain_starts_per_ms(now_ms);
        for (class, &(targets, rank)) in load.classes.iter_mut().zip(&self.class_table) {
            let ahead: u32 = waiting_by_rank[..=usize::from(rank)].iter().sum();
            let wait_ms = f64::from(ahead) / starts_per_ms;
            class.saturation = (wait_ms / targets.ttft_ms).min(MAX_SATURATION);
            class.num_waiting_ahead = ahead;
        }
        load.starts_per_s = starts_per_ms * 1_000.0;
        let num_viable_waiting: usize = waiting_by_rank.iter().map(|&n| n as usize).sum();
        load.free_seats = (self.limits.max_num_seqs as usize)
            .saturating_sub(num_running + num_viable_waiting)
            .min(u32::MAX as usize) as u32;
        Ok(load)
    }

    /// Requests per ms the engine can start while a queue waits: the rate starts have been
    /// measured at, or the rate its seats would free at when all are busy
    /// ([`Self::full_seats_starts_per_ms`]), whichever is higher. The measured rate alone follows
    /// demand: an engine that served a trickle reads a trickle, and a burst that then arrives is
    /// judged to drain at it (measured live, unpinned: a load generator's stall released 85
    /// requests at once on an engine that had been starting 6 a second; the queue then drained at
    /// 20-27 a second, and the gate had refused 56 requests that queued would have met their
    /// targets). At least one start per time constant: a queue that has not moved yet still
    /// drains.
    pub(super) fn drain_starts_per_ms(&self, now_ms: f64) -> f64 {
        let measured = self.start_rate.at(now_ms);
        measured.max(self.full_seats_starts_per_ms()).max(1.0 / RATE_TIME_CONSTANT_MS)
    }

    /// The rate seats free at with every seat busy, by Little's law: `max_num_seqs` over the
    /// time a request holds its seat — the prefill of the mean prompt and the mean output of the
    /// requests that finished lately ([`SeatMeter`]), at the decode step of a full engine. 0
    /// before a request has finished: then only the measured rate speaks.
    fn full_seats_starts_per_ms(&self) -> f64 {
        let Some((prompt_tokens, output_tokens)) = self.seat_meter.means() else { return 0.0 };
        let seats = self.limits.max_num_seqs.max(1);
        let full = StepShape {
            num_prefill_tokens: 0,
            num_decode_requests: seats,
            num_context_tokens: (f64::from(seats) * (prompt_tokens + output_tokens / 2.0)).round() as u64,
        };
        let prefill = StepShape { num_prefill_tokens: prompt_tokens.round() as u32, ..StepShape::default() };
        let seat_ms = self.step_model.predict_ms(prefill) + output_tokens * self.step_model.predict_ms(full);
        if seat_ms.is_finite() && seat_ms > 0.0 {
            f64::from(seats) / seat_ms
        } else {
            0.0
        }
    }

    fn count_request(&self, class: &mut ClassLoad, r: &Hot, is_waiting: bool, now_ms: f64, step_ms: f64) {
        match (is_waiting, r.has_started, r.phase) {
            (true, _, _) => class.num_waiting += 1,
            (false, false, _) => class.num_prefilling += 1,
            (false, true, Phase::Answer) => class.num_answering += 1,
            (false, true, _) => class.num_thinking += 1,
        }
        if r.has_answered {
            return;
        }
        let targets = self.targets(r.class);
        let slack_ms = self.think_slack_ms(now_ms, r, &targets, step_ms);
        let headroom_ms = r.arrival_ms + targets.ttfat_ms - now_ms;
        class.least_slack_ms = Some(class.least_slack_ms.map_or(slack_ms, |s| s.min(slack_ms)));
        class.ttfat_headroom_ms = Some(class.ttfat_headroom_ms.map_or(headroom_ms, |s| s.min(headroom_ms)));
    }

    /// The request's expected remaining output in tokens (capped by what `max_tokens` still
    /// allows), and a fresh request's of its class.
    fn expected_output(&self, r: &Hot) -> (f64, f64) {
        let lengths = &self.lengths[r.class.index()];
        let fresh = if r.is_reasoning { lengths.think.mean() } else { 0.0 } + lengths.answer.mean();
        let remaining = match r.phase {
            Phase::Answer => lengths.answer.expected_remaining(r.num_answer_tokens),
            _ if r.is_reasoning => {
                lengths.think.expected_remaining(r.num_think_tokens) + lengths.answer.mean()
            }
            _ => lengths.answer.mean(),
        };
        let left_by_limit = f64::from(r.max_tokens.saturating_sub(r.num_output_tokens));
        (remaining.min(left_by_limit), fresh)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::ClassLoad;
    use crate::scheduler::tiers::tests::core;
    use crate::step_model::StepShape;
    use crate::{Meridian, NewRequest, ReqHandle};

    const THINK: u32 = 1;
    const END: u32 = 2;
    const WORD: u32 = 100;
    /// The default class `standard`: TTFAT target 60 s.
    const STANDARD: usize = 1;

    /// A reasoning request (its prompt opens the reasoning) of the default class.
    fn add(core: &mut Meridian, req_id: &str, arrival_ms: f64) -> ReqHandle {
        let prompt = [WORD, WORD, THINK];
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
    fn requests_are_counted_by_state_and_probes_not_at_all() {
        let mut core = core("{}");
        let waiting = add(&mut core, "waiting", 0.0);
        let prefilling = add(&mut core, "prefilling", 0.0);
        let thinking = add(&mut core, "thinking", 0.0);
        let answering = add(&mut core, "answering", 0.0);
        core.on_tokens(100.0, thinking, &[WORD; 5]).unwrap();
        core.on_tokens(100.0, answering, &[WORD, WORD, END, WORD]).unwrap();
        let probe = core.add_probe("probe", 100.0, &[WORD, THINK], thinking).unwrap();
        let load = core.engine_load(200.0, &[prefilling, thinking, answering, probe], &[waiting]).unwrap();
        let class = load.classes[STANDARD];
        assert_eq!(
            (class.num_waiting, class.num_prefilling, class.num_thinking, class.num_answering),
            (1, 1, 1, 1)
        );
        let others_empty = load.classes.iter().enumerate().all(|(i, c)| {
            i == STANDARD || ClassLoad { saturation: 0.0, num_waiting_ahead: 0, ..*c } == ClassLoad::default()
        });
        assert!(others_empty, "{:?}", load.classes);
    }

    #[test]
    fn saturation_is_the_wait_behind_viable_requests_of_equal_or_better_rank_in_ttft_targets() {
        // Default classes: interactive (rank 0, TTFT 1 s), standard (1, 3 s), batch (2, 60 s).
        let mut core = core("{}");
        assert!(core.engine_load(0.0, &[], &[]).unwrap().classes.iter().all(|c| c.saturation == 0.0));
        // Ten requests started at once, read over the meter's shortest span (a second, bias
        // corrected): ~10.5 starts a second.
        for i in 0..10 {
            let h = add(&mut core, &format!("s{i}"), 0.0);
            core.on_tokens(1_000.0, h, &[WORD]).unwrap();
        }
        let waiting: Vec<_> = (0..6).map(|i| add(&mut core, &format!("w{i}"), 1_000.0)).collect();
        let load = core.engine_load(1_000.0, &[], &waiting).unwrap();
        let [interactive, standard, batch] = [0, 1, 2].map(|i| load.classes[i].saturation);
        assert_eq!(interactive, 0.0, "nothing of its rank or better waits");
        // Six standard requests ahead at ~10.5 starts a second: ~0.57 s of the 3 s target.
        assert!((standard - 0.19).abs() < 0.01, "{standard}");
        assert!((batch - 0.0095).abs() < 0.001, "the same 0.57 s in batch's 60 s target: {batch}");
        // A queue that does not move saturates toward the ceiling, never past it.
        let later = core.engine_load(1_000_000.0, &[], &waiting).unwrap();
        assert!(later.classes.iter().all(|c| c.saturation <= super::MAX_SATURATION));
    }

    #[test]
    fn the_start_rate_is_right_from_the_first_starts_and_decays_without_them() {
        let mut meter = super::RateMeter::default();
        assert_eq!(meter.at(0.0), 0.0);
        // Twenty starts a second for two seconds: the corrected meter reads ~20, not ~4.
        for k in 0..40 {
            meter.record(f64::from(k) * 50.0);
        }
        let per_s = meter.at(2_000.0) * 1_000.0;
        assert!((18.0..22.0).contains(&per_s), "{per_s}");
        let later = meter.at(2_000.0 + super::RATE_TIME_CONSTANT_MS) * 1_000.0;
        assert!(later < 0.5 * per_s, "no start for a time constant: {later}");
    }

    #[test]
    fn a_burst_after_a_trickle_drains_at_the_rate_a_full_engine_frees_seats() {
        // One request every two seconds, each thinking 8 tokens and answering 8: the measured
        // start rate reads a trickle (~0.5 a second).
        let mut core = core("{}");
        for i in 0..5 {
            let t = 2_000.0 * f64::from(i);
            let h = add(&mut core, &format!("t{i}"), t);
            let mut output = vec![WORD; 8];
            output.push(END);
            output.extend([WORD; 7]);
            core.on_tokens(t + 10.0, h, &output).unwrap();
            core.finish(t + 100.0, h, "stop", &output).unwrap();
        }
        let trickle_per_s = core.start_rate.at(10_000.0) * 1_000.0;
        assert!(trickle_per_s < 1.0, "{trickle_per_s}");
        // Then a burst: its queue drains at max_num_seqs over a 16-token seat at a full
        // engine's decode step (Little's law), not at the trickle.
        let waiting: Vec<_> = (0..100).map(|i| add(&mut core, &format!("w{i}"), 10_000.0)).collect();
        let load = core.engine_load(10_000.0, &[], &waiting).unwrap();
        let seats = core.limits.max_num_seqs;
        let full = StepShape {
            num_prefill_tokens: 0,
            num_decode_requests: seats,
            num_context_tokens: u64::from(seats) * 11,
        };
        let prefill = StepShape { num_prefill_tokens: 3, ..StepShape::default() };
        let seat_ms = core.predict_step_ms(prefill) + 16.0 * core.predict_step_ms(full);
        let expected_per_s = f64::from(seats) / seat_ms * 1_000.0;
        assert!(
            (load.starts_per_s - expected_per_s).abs() < 1e-6 * expected_per_s,
            "{} vs {expected_per_s}",
            load.starts_per_s
        );
        assert!(load.starts_per_s > 10.0 * trickle_per_s);
    }

    #[test]
    fn without_a_finished_request_only_the_measured_rate_speaks() {
        let mut core = core("{}");
        let h = add(&mut core, "r", 0.0);
        core.on_tokens(1_000.0, h, &[WORD]).unwrap();
        let load = core.engine_load(1_000.0, &[h], &[]).unwrap();
        let measured_per_s = core.start_rate.at(1_000.0).max(1.0 / super::RATE_TIME_CONSTANT_MS) * 1_000.0;
        assert_eq!(load.starts_per_s, measured_per_s);
    }

    #[test]
    fn the_queue_ahead_of_each_class_and_the_free_seats_are_what_an_arrival_meets() {
        let mut core = core("{}");
        let idle = core.engine_load(0.0, &[], &[]).unwrap();
        assert!(idle.free_seats > 0 && idle.starts_per_s > 0.0 && idle.first_token_lead_ms >= 0.0);
        let running: Vec<_> = (0..3).map(|i| add(&mut core, &format!("r{i}"), 0.0)).collect();
        let waiting: Vec<_> = (0..4).map(|i| add(&mut core, &format!("w{i}"), 0.0)).collect();
        let load = core.engine_load(100.0, &running, &waiting).unwrap();
        // Four standard requests wait: none is ahead of an interactive one, all of a batch one.
        let ahead: Vec<u32> = load.classes.iter().map(|c| c.num_waiting_ahead).collect();
        assert_eq!(ahead, vec![0, 4, 4]);
        assert_eq!(load.free_seats, core.limits.max_num_seqs - 7, "three run, four wait");
        let snapshot = crate::ArrivalSnapshot::of_load(core.config(), &load, 100.0);
        assert_eq!(snapshot.num_ahead[1], ("standard".to_owned(), 4));
        assert_eq!(crate::ArrivalSnapshot::from_json(&snapshot.to_json()).unwrap(), snapshot);
    }

    #[test]
    fn headroom_is_the_time_to_the_nearest_ttfat_deadline_and_slack_deducts_the_work() {
        let mut core = core("{}");
        let early = add(&mut core, "early", 0.0);
        let later = add(&mut core, "later", 5_000.0);
        core.on_tokens(6_000.0, early, &[WORD; 3]).unwrap();
        let load = core.engine_load(10_000.0, &[early], &[later]).unwrap();
        let class = load.classes[STANDARD];
        assert_eq!(class.ttfat_headroom_ms, Some(50_000.0), "60 s target, arrived 10 s ago");
        let slack_ms = class.least_slack_ms.unwrap();
        assert!(slack_ms < 50_000.0, "the expected thinking is deducted: {slack_ms}");
    }

    #[test]
    fn answering_requests_have_no_deadline_left_to_report() {
        let mut core = core("{}");
        let answering = add(&mut core, "answering", 0.0);
        core.on_tokens(100.0, answering, &[WORD, END, WORD]).unwrap();
        let class = core.engine_load(200.0, &[answering], &[]).unwrap().classes[STANDARD];
        assert_eq!((class.least_slack_ms, class.ttfat_headroom_ms), (None, None));
    }

    #[test]
    fn a_request_past_its_thinking_weighs_less_in_the_queue_than_a_fresh_one() {
        let mut core = core("{}");
        let fresh = add(&mut core, "fresh", 0.0);
        let finishing = add(&mut core, "finishing", 0.0);
        core.on_tokens(100.0, finishing, &[WORD; 500]).unwrap();
        core.on_tokens(100.0, finishing, &[END, WORD]).unwrap();
        let fresh_weight = core.engine_load(200.0, &[], &[fresh]).unwrap().phase_weighted_queue;
        let finishing_weight = core.engine_load(200.0, &[finishing], &[]).unwrap().phase_weighted_queue;
        assert!((fresh_weight - 1.0).abs() < 1e-9, "a fresh request is one unit: {fresh_weight}");
        let fresh_tokens =
            core.engine_load(200.0, &[], &[fresh]).unwrap().classes[STANDARD].expected_output_tokens;
        let finishing_tokens =
            core.engine_load(200.0, &[finishing], &[]).unwrap().classes[STANDARD].expected_output_tokens;
        assert!(
            finishing_tokens < 0.5 * fresh_tokens && fresh_tokens > 1.0,
            "{finishing_tokens} vs {fresh_tokens}"
        );
        assert!(finishing_weight < 0.5 * fresh_weight, "{finishing_weight} vs {fresh_weight}");
        assert_eq!(core.engine_load(200.0, &[], &[]).unwrap().phase_weighted_queue, 0.0);
    }

    #[test]
    fn an_unknown_or_repeated_handle_is_an_error() {
        let mut core = core("{}");
        let a = add(&mut core, "a", 0.0);
        assert!(core.engine_load(1.0, &[a], &[a]).is_err());
        assert!(core.engine_load(1.0, &[ReqHandle(999)], &[]).is_err());
        assert!(core.engine_load(f64::NAN, &[a], &[]).is_err());
    }

    proptest! {
        #[test]
        fn every_request_is_counted_once_and_every_figure_is_finite(
            tokens in proptest::collection::vec((0usize..400, any::<bool>(), any::<bool>()), 1..24),
            now_ms in 0.0f64..1e7,
        ) {
            let mut core = core("{}");
            let (mut running, mut waiting) = (Vec::new(), Vec::new());
            for (i, &(n, answers, runs)) in tokens.iter().enumerate() {
                let h = add(&mut core, &format!("r{i}"), 0.0);
                if n > 0 {
                    core.on_tokens(0.0, h, &vec![WORD; n]).unwrap();
                }
                if answers {
                    core.on_tokens(0.0, h, &[END, WORD]).unwrap();
                }
                if runs { running.push(h) } else { waiting.push(h) }
            }
            let load = core.engine_load(now_ms, &running, &waiting).unwrap();
            let counted: u32 = load.classes.iter()
                .map(|c| c.num_waiting + c.num_prefilling + c.num_thinking + c.num_answering).sum();
            prop_assert_eq!(counted as usize, tokens.len());
            prop_assert!(load.phase_weighted_queue.is_finite() && load.phase_weighted_queue >= 0.0);
            for c in &load.classes {
                prop_assert!(c.least_slack_ms.is_none_or(f64::is_finite));
                prop_assert!(c.ttfat_headroom_ms.is_none_or(f64::is_finite));
                prop_assert!(c.expected_output_tokens.is_finite() && c.expected_output_tokens >= 0.0);
            }
        }
    }
}
