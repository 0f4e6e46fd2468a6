//! The SLO ledger: per-request timestamps for every metric of docs/request-life.md §4, per-class attainment
//! counters, and [`FinishReason`], the one map from vLLM's finish reasons (as vLLM names them on
//! the wire) to the core's. Timestamps are monotone per request (a token observed earlier than
//! the previous one is clamped to it), so every derived latency is non-negative; counters only
//! grow.

use crate::phase::{Phase, TokenKind};
use crate::slo::SloTargets;

/// Why a request ended, as vLLM reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS or a stop token.
    Stopped,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Aborted by the client or the frontend.
    Aborted,
    /// Failed (bad per-request input, grammar error, KV load failure).
    Error,
}

/// vLLM's `FinishReason.REPETITION` on the wire.
const VLLM_REPETITION: &str = "repetition";

impl FinishReason {
    /// Every reason, in declaration order.
    pub const ALL: [FinishReason; 4] =
        [FinishReason::Stopped, FinishReason::Length, FinishReason::Aborted, FinishReason::Error];

    /// The reason for vLLM's `FinishReason` as vLLM names it on the wire (`str(FinishReason.STOP)
    /// == "stop"`): `stop`, `length`, `abort` and `error`, exactly and lower case, and
    /// `repetition` (vLLM cut a repetitive, hallucinating output short), which is a truncation
    /// like `length`: its output lengths must not teach the predictors. `None` for anything
    /// else (a reason a newer vLLM added, or a caller bug); [`crate::Meridian::finish`] releases
    /// such a request as [`FinishReason::Error`] and reports the string.
    pub fn from_vllm(name: &str) -> Option<FinishReason> {
        match name {
            VLLM_REPETITION => Some(FinishReason::Length),
            _ => FinishReason::ALL.into_iter().find(|r| r.vllm_name() == name),
        }
    }

    /// vLLM's name of this reason (the inverse of [`FinishReason::from_vllm`]).
    pub const fn vllm_name(self) -> &'static str {
        match self {
            FinishReason::Stopped => "stop",
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
            FinishReason::Error => "error",
        }
    }

    /// The core's name of this reason, as reports carry it: `stopped`, `length`, `aborted` or
    /// `error`.
    pub const fn name(self) -> &'static str {
        match self {
            FinishReason::Stopped => "stopped",
            FinishReason::Length => "length",
            FinishReason::Aborted => "aborted",
            FinishReason::Error => "error",
        }
    }

    /// Whether the request ran to a natural end and so counts towards SLO attainment.
    pub fn completed(self) -> bool {
        matches!(self, FinishReason::Stopped | FinishReason::Length)
    }
}

/// Timestamps and counters of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestLedger {
    /// When vLLM received it.
    pub arrival_ms: f64,
    /// First generated token of any phase.
    pub first_token_ms: Option<f64>,
    /// First and last reasoning tokens.
    pub first_think_ms: Option<f64>,
    /// Last reasoning token seen so far.
    pub last_think_ms: Option<f64>,
    /// The token that closed reasoning.
    pub reasoning_end_ms: Option<f64>,
    /// First visible answer token.
    pub first_answer_ms: Option<f64>,
    /// Latest token of any phase.
    pub last_token_ms: Option<f64>,
    /// When the request finished.
    pub finish_ms: Option<f64>,
    /// Reasoning tokens (including the end marker).
    pub num_think_tokens: u32,
    /// Visible answer tokens.
    pub num_answer_tokens: u32,
    /// Largest gap between consecutive answer tokens.
    pub max_answer_gap_ms: f64,
    /// Answer gaps above the stall threshold.
    pub num_stalls: u32,
    /// Preemptions suffered before the first token, while thinking, and while answering.
    pub num_preemptions: PhaseCounts,
}

/// A counter per running phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseCounts {
    /// Before the first generated token.
    pub prefill: u32,
    /// While thinking.
    pub think: u32,
    /// While answering.
    pub answer: u32,
}

impl PhaseCounts {
    /// Adds one to the counter of `phase` (`Done` counts nowhere).
    pub fn bump(&mut self, phase: Phase) {
        match phase {
            Phase::Prefill => self.prefill += 1,
            Phase::Think => self.think += 1,
            Phase::Answer => self.answer += 1,
            Phase::Done => {}
        }
    }

    /// Sum over phases.
    pub fn total(&self) -> u32 {
        self.prefill + self.think + self.answer
    }
}

impl RequestLedger {
    /// A ledger for a request that arrived at `arrival_ms`.
    pub fn new(arrival_ms: f64) -> Self {
        Self { arrival_ms, ..Self::default() }
    }

    /// Records one token observed at `now_ms`. `stall_gap_ms` is the answer gap above which a
    /// gap counts as a stall.
    pub fn on_token(&mut self, now_ms: f64, kind: TokenKind, stall_gap_ms: f64) {
        let now_ms = now_ms.max(self.last_token_ms.unwrap_or(self.arrival_ms));
        self.first_token_ms.get_or_insert(now_ms);
        match kind {
            TokenKind::Think | TokenKind::ReasoningEnd => {
                self.first_think_ms.get_or_insert(now_ms);
                self.last_think_ms = Some(now_ms);
                self.num_think_tokens += 1;
                if kind == TokenKind::ReasoningEnd {
                    self.reasoning_end_ms = Some(now_ms);
                }
            }
            TokenKind::Answer => {
                match self.first_answer_ms {
                    None => self.first_answer_ms = Some(now_ms),
                    Some(_) => {
                        let gap_ms = now_ms - self.last_token_ms.unwrap_or(now_ms);
                        self.max_answer_gap_ms = self.max_answer_gap_ms.max(gap_ms);
                        if gap_ms > stall_gap_ms {
                            self.num_stalls += 1;
                        }
                    }
                }
                self.num_answer_tokens += 1;
            }
        }
        self.last_token_ms = Some(now_ms);
    }

    /// The docs/request-life.md §4 latencies of this request, as far as they are known.
    pub fn metrics(&self) -> RequestMetrics {
        let since_arrival = |t: Option<f64>| t.map(|t| t - self.arrival_ms);
        let per_gap = |first: Option<f64>, last: Option<f64>, n: u32| match (first, last) {
            (Some(first), Some(last)) if n >= 2 => Some((last - first) / f64::from(n - 1)),
            _ => None,
        };
        let last_answer_ms = if self.num_answer_tokens > 0 { self.last_token_ms } else { None };
        RequestMetrics {
            ttft_ms: since_arrival(self.first_token_ms),
            ttfat_ms: since_arrival(self.first_answer_ms),
            transition_gap_ms: match (self.reasoning_end_ms, self.first_answer_ms) {
                (Some(end), Some(first)) => Some(first - end),
                _ => None,
            },
            think_tpot_ms: per_gap(self.first_think_ms, self.last_think_ms, self.num_think_tokens),
            answer_tpot_ms: per_gap(self.first_answer_ms, last_answer_ms, self.num_answer_tokens),
            e2e_ms: since_arrival(self.finish_ms),
            max_answer_gap_ms: self.max_answer_gap_ms,
            num_stalls: self.num_stalls,
        }
    }
}

/// Derived latencies of one request (milliseconds; `None` where the event has not happened).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestMetrics {
    /// Arrival → first token.
    pub ttft_ms: Option<f64>,
    /// Arrival → first answer token.
    pub ttfat_ms: Option<f64>,
    /// Reasoning-end token → first answer token.
    pub transition_gap_ms: Option<f64>,
    /// Mean gap between reasoning tokens.
    pub think_tpot_ms: Option<f64>,
    /// Mean gap between answer tokens.
    pub answer_tpot_ms: Option<f64>,
    /// Arrival → finish.
    pub e2e_ms: Option<f64>,
    /// Largest answer gap.
    pub max_answer_gap_ms: f64,
    /// Answer gaps above the stall threshold.
    pub num_stalls: u32,
}

/// Which targets a completed request met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attainment {
    /// TTFT within target.
    pub ttft: bool,
    /// TTFAT within target (a request with no answer token misses it).
    pub ttfat: bool,
    /// Answer TPOT within target (vacuously true with fewer than two answer tokens).
    pub answer_tpot: bool,
    /// End-to-end within target (true when the class has none).
    pub e2e: bool,
}

impl Attainment {
    /// Judges `m` against `targets`.
    pub fn judge(m: &RequestMetrics, targets: &SloTargets) -> Self {
        let within = |v: Option<f64>, target: f64| v.is_some_and(|v| v <= target);
        Self {
            ttft: within(m.ttft_ms, targets.ttft_ms),
            ttfat: within(m.ttfat_ms, targets.ttfat_ms),
            answer_tpot: m.answer_tpot_ms.is_none_or(|v| v <= targets.answer_tpot_ms),
            e2e: targets.e2e_ms.is_none_or(|t| within(m.e2e_ms, t)),
        }
    }

    /// Met every target: counts towards goodput.
    pub fn all(&self) -> bool {
        self.ttft && self.ttfat && self.answer_tpot && self.e2e
    }
}

/// Per-class counters; monotone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Requests that ran to a natural end.
    pub num_completed: u64,
    /// Requests aborted or failed.
    pub num_aborted: u64,
    /// Completed requests that met each target.
    pub num_met_ttft: u64,
    /// Completed requests within the TTFAT target.
    pub num_met_ttfat: u64,
    /// Completed requests within the answer TPOT target.
    pub num_met_answer_tpot: u64,
    /// Completed requests within the end-to-end target.
    pub num_met_e2e: u64,
    /// Completed requests that met every target.
    pub num_met_all: u64,
    /// Answer stalls over all finished requests.
    pub num_stalls: u64,
    /// Preemptions by phase over all finished requests.
    pub num_preemptions: PhaseCountsU64,
    /// This class's running requests the plan preempted on arrival of a more important one
    /// (counted when the plan decides, live requests included).
    pub num_arrival_preemptions: u64,
    /// Requests ended early because they could no longer meet their targets (also counted in
    /// `num_aborted`), by the target they could not meet: TTFT, then TTFAT.
    pub num_shed: [u64; 2],
    /// Thinking requests whose reasoning a plan ended to answer by the TTFAT deadline (counted
    /// when the plan decides).
    pub num_degraded: u64,
}

/// [`PhaseCounts`] widened for aggregates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseCountsU64 {
    /// Before the first generated token.
    pub prefill: u64,
    /// While thinking.
    pub think: u64,
    /// While answering.
    pub answer: u64,
}

impl ClassCounters {
    /// Folds one finished request in.
    pub fn record(&mut self, ledger: &RequestLedger, reason: FinishReason, targets: &SloTargets) {
        self.record_judged(ledger, reason, Attainment::judge(&ledger.metrics(), targets));
    }

    /// [`Self::record`] with the targets already judged (`met`: a request whose decode ran on
    /// another engine is judged on the targets this one serves).
    pub fn record_judged(&mut self, ledger: &RequestLedger, reason: FinishReason, met: Attainment) {
        let preemptions = ledger.num_preemptions;
        self.num_preemptions.prefill += u64::from(preemptions.prefill);
        self.num_preemptions.think += u64::from(preemptions.think);
        self.num_preemptions.answer += u64::from(preemptions.answer);
        self.num_stalls += u64::from(ledger.num_stalls);
        if !reason.completed() {
            self.num_aborted += 1;
            return;
        }
        self.num_completed += 1;
        self.num_met_ttft += u64::from(met.ttft);
        self.num_met_ttfat += u64::from(met.ttfat);
        self.num_met_answer_tpot += u64::from(met.answer_tpot);
        self.num_met_e2e += u64::from(met.e2e);
        self.num_met_all += u64::from(met.all());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn vllm_finish_reasons_map_onto_the_core_reasons() {
        assert_eq!(FinishReason::from_vllm("stop"), Some(FinishReason::Stopped));
        assert_eq!(FinishReason::from_vllm("length"), Some(FinishReason::Length));
        assert_eq!(FinishReason::from_vllm("abort"), Some(FinishReason::Aborted));
        assert_eq!(FinishReason::from_vllm("error"), Some(FinishReason::Error));
        // Exactly vLLM's spelling: not the core's names, not another case, no padding.
        assert_eq!(FinishReason::from_vllm("repetition"), Some(FinishReason::Length));
        for other in ["stopped", "aborted", "STOP", "Stop", " stop", "stop\n", "", "hallucination"] {
            assert_eq!(FinishReason::from_vllm(other), None, "{other:?}");
        }
        let names: Vec<_> = FinishReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["stopped", "length", "aborted", "error"]);
    }

    proptest! {
        #[test]
        fn from_vllm_accepts_exactly_vllms_wire_names(
            name in prop_oneof![
                prop::sample::select(vec!["stop", "length", "abort", "error"]).prop_map(str::to_owned),
                "[a-zA-Z_ ]{0,8}",
            ]
        ) {
            let known = ["stop", "length", "abort", "error"].contains(&name.as_str());
            let parsed = FinishReason::from_vllm(&name);
            prop_assert_eq!(parsed.is_some(), known || name == "repetition");
            if let (Some(reason), true) = (parsed, known) {
                prop_assert_eq!(reason.vllm_name(), name.as_str());
            }
        }
    }

    #[test]
    fn metrics_follow_the_design_definitions() {
        let mut l = RequestLedger::new(100.0);
        l.on_token(150.0, TokenKind::Think, 50.0);
        l.on_token(160.0, TokenKind::Think, 50.0);
        l.on_token(170.0, TokenKind::ReasoningEnd, 50.0);
        l.on_token(200.0, TokenKind::Answer, 50.0);
        l.on_token(210.0, TokenKind::Answer, 50.0);
        l.on_token(300.0, TokenKind::Answer, 50.0);
        l.finish_ms = Some(300.0);
        let m = l.metrics();
        assert_eq!(m.ttft_ms, Some(50.0));
        assert_eq!(m.ttfat_ms, Some(100.0));
        assert_eq!(m.transition_gap_ms, Some(30.0));
        assert_eq!(m.think_tpot_ms, Some(10.0));
        assert_eq!(m.answer_tpot_ms, Some(50.0));
        assert_eq!(m.e2e_ms, Some(200.0));
        assert_eq!(m.max_answer_gap_ms, 90.0);
        assert_eq!(m.num_stalls, 1);
    }

    #[test]
    fn out_of_order_timestamps_are_clamped() {
        let mut l = RequestLedger::new(100.0);
        l.on_token(90.0, TokenKind::Answer, 5.0);
        assert_eq!(l.metrics().ttft_ms, Some(0.0));
    }

    #[test]
    fn attainment_and_counters() {
        let targets = SloTargets { ttft_ms: 60.0, ttfat_ms: 90.0, answer_tpot_ms: 100.0, e2e_ms: None };
        let mut l = RequestLedger::new(0.0);
        l.on_token(50.0, TokenKind::Answer, 500.0);
        l.on_token(100.0, TokenKind::Answer, 500.0);
        let met = Attainment::judge(&l.metrics(), &targets);
        assert!(met.all());
        let mut c = ClassCounters::default();
        c.record(&l, FinishReason::Stopped, &targets);
        c.record(&l, FinishReason::Aborted, &targets);
        assert_eq!((c.num_completed, c.num_aborted, c.num_met_all), (1, 1, 1));
    }
}
