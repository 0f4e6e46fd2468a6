//! Disaggregated prefill and decode: a request's KV leaving this engine for another (the prefill
//! instance's side of a hand-off, vLLM's `do_remote_decode`) or arriving from one (the decode
//! instance's side, `do_remote_prefill`), and the fitted cost of an arrival. vLLM's KV connector
//! (`NixlConnector`, `MooncakeConnector`) moves the blocks; the core only learns which requests
//! take part and when a transfer started, finished or failed, so that its predictions count the
//! transfer where the prompt is not computed here, and so that a prefill instance judges and
//! learns only what it serves. The arrival cost is fitted like a tier's restore cost: milliseconds
//! per prompt token, exponentially weighted over the transfers seen. Invariant: until the first
//! arrival is measured there is no fit, and a receiving request is predicted as if its prompt were
//! computed here (no decision moves on a guess); the fit stays finite and ≥ 0.

use crate::error::{check_time_ms, Result};
use crate::ledger::{Attainment, RequestMetrics};
use crate::slo::SloTargets;

/// Per-arrival forgetting of the fit: it follows a change of bandwidth within a few dozen
/// transfers.
const ARRIVAL_FORGETTING: f64 = 0.95;

/// A request's part in a prefill/decode hand-off on this engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvHandoff {
    /// Prompt and output both here (no hand-off, or its transfer failed and the prompt is
    /// computed here after all).
    #[default]
    Local,
    /// This engine computes the prompt and another decodes: the request ends after its prompt
    /// (and one token), and its KV leaves. Judged by its TTFT alone; its one token is not a
    /// length the predictors learn from.
    Sends,
    /// Another engine computed the prompt: its KV arrives here, and this engine decodes.
    Receives,
}

impl KvHandoff {
    /// Every part, in declaration order.
    pub const ALL: [KvHandoff; 3] = [KvHandoff::Local, KvHandoff::Sends, KvHandoff::Receives];

    /// Stable snake_case name, for the request log and the binding.
    pub fn name(self) -> &'static str {
        match self {
            KvHandoff::Local => "local",
            KvHandoff::Sends => "sends",
            KvHandoff::Receives => "receives",
        }
    }

    /// The part named `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// The targets a request with this part met on this engine. One that only computes its
    /// prompt here is judged by its TTFT alone — the time its prompt's KV is ready to leave;
    /// its thinking, answer and end are the decode engine's to meet and to judge.
    pub fn judge(self, metrics: &RequestMetrics, targets: &SloTargets) -> Attainment {
        let met = Attainment::judge(metrics, targets);
        match self {
            KvHandoff::Sends => Attainment { ttft: met.ttft, ttfat: true, answer_tpot: true, e2e: true },
            KvHandoff::Local | KvHandoff::Receives => met,
        }
    }
}

/// Engine-wide hand-off counts; monotone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandoffCounters {
    /// Requests that finished here with their KV leaving for another engine.
    pub num_sent: u64,
    /// Requests whose KV arrived from another engine.
    pub num_received: u64,
    /// Prompt tokens of those arrivals.
    pub num_received_tokens: u64,
    /// Arrivals that failed (blocks the connector reported invalid): the prompt is computed here.
    pub num_failed: u64,
}

/// The fitted cost of a KV arrival and the hand-off counts.
#[derive(Debug, Clone, Default)]
pub struct Handoffs {
    /// Exponentially weighted sums of arrival milliseconds and tokens; both 0 before the first.
    sum_ms: f64,
    sum_tokens: f64,
    counters: HandoffCounters,
}

impl Handoffs {
    /// Milliseconds per prompt token an arrival takes, once one was measured.
    pub fn arrival_ms_per_token(&self) -> Option<f64> {
        (self.sum_tokens > 0.0).then(|| self.sum_ms / self.sum_tokens)
    }

    /// Folds one arrival of `num_tokens` that took `duration_ms` (from the blocks' allocation to
    /// the connector's report) into the fit.
    pub fn on_received(&mut self, num_tokens: u32, duration_ms: f64) -> Result<()> {
        let duration_ms = check_time_ms("duration_ms", duration_ms)?;
        self.counters.num_received += 1;
        self.counters.num_received_tokens += u64::from(num_tokens);
        if num_tokens > 0 {
            self.sum_ms = self.sum_ms * ARRIVAL_FORGETTING + duration_ms;
            self.sum_tokens = self.sum_tokens * ARRIVAL_FORGETTING + f64::from(num_tokens);
        }
        Ok(())
    }

    /// Counts a request that finished here with its KV leaving.
    pub fn on_sent(&mut self) {
        self.counters.num_sent += 1;
    }

    /// Counts an arrival that failed.
    pub fn on_failed(&mut self) {
        self.counters.num_failed += 1;
    }

    /// The counts so far.
    pub fn counters(&self) -> HandoffCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_none() {
        for h in KvHandoff::ALL {
            assert_eq!(KvHandoff::from_name(h.name()), Some(h));
        }
        assert_eq!(KvHandoff::from_name("remote"), None);
        assert_eq!(KvHandoff::default(), KvHandoff::Local);
    }

    #[test]
    fn no_fit_before_the_first_arrival_then_the_fit_follows_them() {
        let mut h = Handoffs::default();
        assert_eq!(h.arrival_ms_per_token(), None);
        h.on_received(0, 5.0).unwrap();
        assert_eq!(h.arrival_ms_per_token(), None, "an empty arrival says nothing of the cost");
        h.on_received(100, 50.0).unwrap();
        assert_eq!(h.arrival_ms_per_token(), Some(0.5));
        for _ in 0..200 {
            h.on_received(100, 10.0).unwrap();
        }
        let fitted = h.arrival_ms_per_token().unwrap();
        assert!((fitted - 0.1).abs() < 1e-3, "{fitted}");
        assert_eq!(h.counters().num_received, 202);
        assert_eq!(h.counters().num_received_tokens, 20_100);
        assert!(h.on_received(10, f64::NAN).is_err());
        assert!(h.on_received(10, -1.0).is_err());
        assert_eq!(h.counters().num_received, 202, "a bad duration changes nothing");
    }

    proptest! {
        #[test]
        fn the_fit_stays_within_the_arrivals_seen(
            arrivals in proptest::collection::vec((1u32..100_000, 0.0f64..1e6), 1..50),
        ) {
            let mut h = Handoffs::default();
            for &(tokens, ms) in &arrivals {
                h.on_received(tokens, ms).unwrap();
            }
            let rates: Vec<f64> = arrivals.iter().map(|&(t, ms)| ms / f64::from(t)).collect();
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            let fitted = h.arrival_ms_per_token().unwrap();
            prop_assert!(fitted.is_finite() && fitted >= lo * (1.0 - 1e-9) && fitted <= hi * (1.0 + 1e-9));
        }
    }
}
