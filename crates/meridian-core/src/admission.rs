//! Admission at arrival: whether a request that reaches the API server can still get its first
//! token within its class's TTFT target behind the work already queued, decided before it joins
//! vLLM's queue. The engine, which knows the queue, publishes an [`ArrivalSnapshot`] (per class
//! the viable waiting requests a new arrival of the class would queue behind, the rate at which
//! requests start, whether a seat is free now); the API server, which sees each request first but
//! not the queue, holds an [`ArrivalGate`] fed with the latest snapshots and asks it for every
//! request. The gate adds what it admitted since a snapshot was taken (the engine has not seen
//! those yet) and drains the queue at the published drain rate for the snapshot's age, so a burst
//! is judged on the queue it builds itself. A request of a `shed` class predicted to wait past its
//! TTFT target times `overload.arrival_wait_ttft_factor` is refused at once with the shed notice
//! (reason `ttft`) and a `Retry-After` of the predicted excess; the engine's triage stays for
//! what changes later (thinking that runs long, a prediction that was wrong). Invariants: the gate
//! only ever refuses requests of `shed` classes, under the `meridian` policy, with a fresh
//! snapshot — without one (never published, older than [`STALE_SNAPSHOT_MS`], or from another
//! format) it admits, so a stalled engine or a lost file never refuses traffic on stale state;
//! every figure it reports is finite.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{shown, Error, Result};
use crate::scheduler::{EngineLoad, ShedNotice, ShedReason, SHED_MARKER};
use crate::slo::{ClassId, OnOverload};

/// The format tag every snapshot carries: a gate reads only snapshots of its own format.
pub const ARRIVAL_SNAPSHOT_FORMAT: &str = "meridian-arrival/1";
/// A snapshot older than this (ms) is not judged on: the engine publishes while it steps, so an
/// older one means it is stalled or gone, and the gate admits (the engine's triage still acts).
pub const STALE_SNAPSHOT_MS: f64 = 2_000.0;
/// Admissions remembered for the queue the engine has not seen yet: enough for any burst that
/// arrives within a snapshot's lifetime.
const MAX_REMEMBERED_ADMISSIONS: usize = 4_096;

/// The engine's queue as a request arriving at the API server would meet it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrivalSnapshot {
    /// [`ARRIVAL_SNAPSHOT_FORMAT`].
    pub format: String,
    /// When the engine took it, wall-clock ms since the Unix epoch (the clock vLLM stamps
    /// arrivals with, shared by the API server and the engine processes).
    pub taken_ms: f64,
    /// Requests per second the engine's queue drains at, engine-wide: the rate requests have
    /// been starting (first token) lately, or the rate a full engine frees seats, whichever is
    /// higher ([`crate::EngineLoad::starts_per_s`]); at least one per
    /// [`crate::scheduler::RATE_TIME_CONSTANT_MS`], so a queue that has not moved yet still drains.
    pub starts_per_s: f64,
    /// Seats a request arriving now could take at the next step (`max_num_seqs` less the running
    /// and the viable waiting requests).
    pub free_seats: u32,
    /// The least time from a request's admission to its first token, ms: the steps between a
    /// plan and a queued request's first token.
    pub first_token_lead_ms: f64,
    /// Per configured class, by name: the viable waiting requests of its rank or better, which a
    /// new request of the class would queue behind.
    pub num_ahead: Vec<(String, u32)>,
    /// Expected remaining output tokens of every request the engine holds (a waiting request's
    /// whole expected output): the work ahead, which the API server reports to a router as the
    /// engine's load (absent from older snapshots: 0).
    #[serde(default)]
    pub expected_output_tokens: f64,
}

impl ArrivalSnapshot {
    /// The snapshot of an engine's load ([`crate::Meridian::engine_load`]) taken at `taken_ms`
    /// (wall clock), for the classes of `config`.
    pub fn of_load(config: &Config, load: &EngineLoad, taken_ms: f64) -> Self {
        Self {
            format: ARRIVAL_SNAPSHOT_FORMAT.to_owned(),
            taken_ms,
            starts_per_s: load.starts_per_s,
            free_seats: load.free_seats,
            first_token_lead_ms: load.first_token_lead_ms,
            num_ahead: config
                .classes
                .iter()
                .zip(&load.classes)
                .map(|(c, l)| (c.name.clone(), l.num_waiting_ahead))
                .collect(),
            expected_output_tokens: load.classes.iter().map(|l| l.expected_output_tokens).sum(),
        }
    }

    /// The snapshot as the JSON text the engine publishes.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A published snapshot; an error naming what is wrong for text that is not one.
    pub fn from_json(text: &str) -> Result<Self> {
        let snapshot: Self = serde_json::from_str(text)
            .map_err(|e| Error::argument("arrival_snapshot", shown(text), parse_problem(&e)))?;
        if snapshot.format != ARRIVAL_SNAPSHOT_FORMAT {
            return Err(Error::argument(
                "arrival_snapshot.format",
                shown(&snapshot.format),
                "unknown format",
            ));
        }
        let finite = snapshot.taken_ms.is_finite()
            && snapshot.starts_per_s.is_finite()
            && snapshot.starts_per_s > 0.0
            && snapshot.first_token_lead_ms.is_finite()
            && snapshot.first_token_lead_ms >= 0.0
            && snapshot.expected_output_tokens.is_finite()
            && snapshot.expected_output_tokens >= 0.0;
        if !finite {
            return Err(Error::argument(
                "arrival_snapshot",
                shown(text),
                "taken_ms, starts_per_s (> 0), first_token_lead_ms and expected_output_tokens (>= 0) must be finite",
            ));
        }
        Ok(snapshot)
    }
}

/// What is wrong with a text that did not parse as a snapshot (the error variant takes a static reason).
fn parse_problem(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON",
        _ => "not an arrival snapshot (fields or types differ)",
    }
}

/// What the gate decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalDecision {
    /// The class the request gets (the one it names, else its priority's).
    pub class: ClassId,
    /// The wait before its first token the gate predicts, ms (`None` without a fresh snapshot).
    pub predicted_wait_ms: Option<f64>,
    /// `Some` when the request is refused: what its client is told.
    pub refusal: Option<ShedNotice>,
}

/// One class as the gate judges it.
#[derive(Debug, Clone)]
struct GateClass {
    name: String,
    rank: u8,
    ttft_ms: f64,
    /// Whether its requests may be refused: `shed` triage under the `meridian` policy.
    refusable: bool,
}

/// The API server's side of admission at arrival (see the module docs).
#[derive(Debug, Clone)]
pub struct ArrivalGate {
    config: Config,
    classes: Vec<GateClass>,
    /// The latest snapshot of each engine behind this API server.
    snapshots: Vec<ArrivalSnapshot>,
    /// Per snapshot, the queue ahead of each class (indexed like `classes`).
    ahead: Vec<Vec<f64>>,
    /// Admissions (wall-clock ms, class rank), oldest first: those after a snapshot's time are
    /// queued in no snapshot yet.
    admitted: VecDeque<(f64, u8)>,
    num_refused: u64,
}

impl ArrivalGate {
    /// A gate for the server's configuration, with no snapshot yet (it admits everything).
    pub fn new(config: Config) -> Self {
        let classes = config
            .classes
            .iter()
            .map(|c| GateClass {
                name: c.name.clone(),
                rank: c.rank,
                ttft_ms: c.targets.ttft_ms,
                refusable: config.admits_at_arrival() && c.on_overload == OnOverload::Shed,
            })
            .collect();
        Self {
            config,
            classes,
            snapshots: Vec::new(),
            ahead: Vec::new(),
            admitted: VecDeque::new(),
            num_refused: 0,
        }
    }

    /// Replaces the snapshots (one per engine behind this server; none: admit everything).
    pub fn set_snapshots(&mut self, snapshots: Vec<ArrivalSnapshot>) {
        self.ahead = snapshots
            .iter()
            .map(|s| {
                self.classes
                    .iter()
                    .map(|c| {
                        s.num_ahead
                            .iter()
                            .find(|(name, _)| *name == c.name)
                            .map_or(0.0, |(_, n)| f64::from(*n))
                    })
                    .collect()
            })
            .collect();
        self.snapshots = snapshots;
        let oldest_ms = self.snapshots.iter().map(|s| s.taken_ms).fold(f64::INFINITY, f64::min);
        while self.admitted.front().is_some_and(|&(t, _)| t < oldest_ms) {
            self.admitted.pop_front();
        }
    }

    /// The name of a configured class.
    pub fn class_name(&self, class: ClassId) -> &str {
        &self.classes[class.index()].name
    }

    /// Requests refused so far.
    pub fn num_refused(&self) -> u64 {
        self.num_refused
    }

    /// Decides one request arriving at `now_ms` (wall clock): the class it names, or its vLLM
    /// priority's; `waited_ms` is how long its client has already waited for it elsewhere (a
    /// retry after a shed, [`crate::WAITED_ARG`]), which its TTFT target has to cover too. An
    /// admitted request is counted into the queue the next requests meet.
    pub fn decide(
        &mut self,
        now_ms: f64,
        slo_class: Option<&str>,
        priority: i64,
        waited_ms: f64,
    ) -> Result<ArrivalDecision> {
        let now_ms = crate::error::check_time_ms("now_ms", now_ms)?;
        let waited_ms = crate::request_args::check_waited_ms(waited_ms)?;
        let class = match slo_class {
            Some(name) => self.config.class_by_name(name).ok_or_else(|| Error::UnknownSloClass {
                req_id: "(arriving)".to_owned(),
                name: shown(name),
                known: self.config.class_names(),
            })?,
            None => self.config.class_for_priority(priority),
        };
        let predicted_wait_ms = self.predicted_wait_ms(now_ms, class);
        let gate = &self.classes[class.index()];
        let limit_ms = gate.ttft_ms * self.config.overload.arrival_wait_ttft_factor - waited_ms;
        let refusal = match predicted_wait_ms {
            Some(wait_ms) if gate.refusable && wait_ms > limit_ms => {
                Some(self.notice(class, wait_ms, waited_ms))
            }
            _ => None,
        };
        if refusal.is_some() {
            self.num_refused += 1;
        } else if !self.snapshots.is_empty() {
            if self.admitted.len() == MAX_REMEMBERED_ADMISSIONS {
                self.admitted.pop_front();
            }
            self.admitted.push_back((now_ms, gate.rank));
        }
        Ok(ArrivalDecision { class, predicted_wait_ms, refusal })
    }

    /// The work ahead on the engines behind this server, in expected output tokens: what it
    /// reports to a router as its load (vllm-router's `power_of_two` reads an integer). Read from
    /// the latest snapshots whatever their age: an idle engine publishes once and then stays
    /// quiet, and its last word (nothing queued) is still true; no snapshot yet reads 0.
    pub fn load_tokens(&self) -> u64 {
        let total: f64 = self.snapshots.iter().map(|s| s.expected_output_tokens).sum();
        // Finite and >= 0 by `ArrivalSnapshot::from_json`; `as` saturates past u64::MAX.
        total.round() as u64
    }

    /// The least predicted wait for a first token over the engines with a fresh snapshot.
    fn predicted_wait_ms(&self, now_ms: f64, class: ClassId) -> Option<f64> {
        let rank = self.classes[class.index()].rank;
        let share = 1.0 / self.snapshots.len().max(1) as f64;
        self.snapshots
            .iter()
            .zip(&self.ahead)
            .filter(|(s, _)| now_ms - s.taken_ms <= STALE_SNAPSHOT_MS)
            .map(|(s, ahead)| {
                // The engine's balancer spreads what this server admitted over its engines.
                let unseen = self.admitted.iter().filter(|&&(t, r)| t >= s.taken_ms && r <= rank).count();
                let starts_per_ms = s.starts_per_s / 1_000.0;
                let drained = starts_per_ms * (now_ms - s.taken_ms).max(0.0);
                // Its place in the line, counting itself; the free seats take the first ones now,
                // the rest start as running requests finish.
                let place = ahead[class.index()] + unseen as f64 * share + 1.0;
                let behind_seats = (place - f64::from(s.free_seats)).max(0.0);
                s.first_token_lead_ms + (behind_seats - drained).max(0.0) / starts_per_ms
            })
            .reduce(f64::min)
    }

    fn notice(&self, class: ClassId, wait_ms: f64, waited_ms: f64) -> ShedNotice {
        let c = &self.classes[class.index()];
        // Come back when the queue has drained the excess: at least a second.
        let excess_ms = wait_ms + waited_ms - c.ttft_ms;
        let retry_after_s = (excess_ms / 1_000.0).ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
        ShedNotice {
            message: format!(
                "{SHED_MARKER}:{}:{retry_after_s}: a request of class `{}` arriving now would wait about {} ms for its \
                 first token{}, past its TTFT target of {} ms; retry in {retry_after_s} s or on another instance",
                ShedReason::Ttft.name(),
                c.name,
                wait_ms.round(),
                waited_note(waited_ms),
                c.ttft_ms
            ),
            retry_after_s,
        }
    }
}

/// The part of a refusal's message about the time already waited elsewhere (none when none was).
fn waited_note(waited_ms: f64) -> String {
    if waited_ms > 0.0 {
        format!(" after {} ms already waited", waited_ms.round())
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::parse_shed_notice;

    /// Default classes: interactive (rank 0, TTFT 1 s), standard (1, 3 s), batch (2, 60 s).
    fn gate(json: &str) -> ArrivalGate {
        ArrivalGate::new(Config::from_json(json).unwrap())
    }

    fn snapshot(taken_ms: f64, starts_per_s: f64, free_seats: u32, ahead: [u32; 3]) -> ArrivalSnapshot {
        ArrivalSnapshot {
            format: ARRIVAL_SNAPSHOT_FORMAT.to_owned(),
            taken_ms,
            starts_per_s,
            free_seats,
            first_token_lead_ms: 30.0,
            expected_output_tokens: 0.0,
            num_ahead: ["interactive", "standard", "batch"]
                .iter()
                .map(|n| n.to_string())
                .zip(ahead)
                .collect(),
        }
    }

    #[test]
    fn without_a_fresh_snapshot_every_request_is_admitted() {
        let mut g = gate("{}");
        let d = g.decide(1_000.0, Some("interactive"), 0, 0.0).unwrap();
        assert_eq!((d.predicted_wait_ms, d.refusal), (None, None));
        g.set_snapshots(vec![snapshot(0.0, 1.0, 0, [100, 100, 100])]);
        assert!(g.decide(100.0, Some("interactive"), 0, 0.0).unwrap().refusal.is_some());
        let stale = g.decide(STALE_SNAPSHOT_MS + 1.0, Some("interactive"), 0, 0.0).unwrap();
        assert_eq!(
            (stale.predicted_wait_ms, stale.refusal),
            (None, None),
            "a stalled engine refuses nothing"
        );
    }

    #[test]
    fn a_class_is_refused_once_its_queue_would_outlast_its_ttft_target() {
        let mut g = gate("{}");
        // 10 starts a second; 5 interactive ahead: ~0.6 s, inside 1 s; 20 standard ahead: ~2.1 s, inside 3 s.
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [5, 20, 40])]);
        let d = g.decide(0.0, Some("interactive"), 0, 0.0).unwrap();
        assert!(d.refusal.is_none() && (d.predicted_wait_ms.unwrap() - 630.0).abs() < 1.0, "{d:?}");
        assert!(g.decide(0.0, Some("standard"), 0, 0.0).unwrap().refusal.is_none());
        // 40 ahead of batch: ~4 s, inside its 60 s target.
        assert!(g.decide(0.0, Some("batch"), 0, 0.0).unwrap().refusal.is_none());
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [12, 20, 40])]);
        let late = g.decide(0.0, Some("interactive"), 0, 0.0).unwrap();
        let notice = late.refusal.expect("13 requests at 10 a second: 1.3 s past a 1 s target");
        assert_eq!(parse_shed_notice(&notice.message), Some((ShedReason::Ttft, 1)));
        assert_eq!(g.num_refused(), 1);
    }

    #[test]
    fn what_the_gate_admits_counts_until_a_snapshot_has_seen_it_and_the_queue_drains_with_time() {
        let mut g = gate("{}");
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [0, 0, 0])]);
        let decisions: Vec<_> =
            (0..12).map(|_| g.decide(0.0, Some("interactive"), 0, 0.0).unwrap()).collect();
        let waits: Vec<f64> = decisions.iter().map(|d| d.predicted_wait_ms.unwrap()).collect();
        // No free seat: 30 ms of lead, then 100 ms for each place in the line, its own included.
        assert_eq!(&waits[..3], &[130.0, 230.0, 330.0], "a burst builds its own queue");
        let refused: Vec<bool> = decisions.iter().map(|d| d.refusal.is_some()).collect();
        assert_eq!(refused, [[false; 9].as_slice(), &[true; 3]].concat(), "{waits:?}");
        assert_eq!(waits[9], waits[11], "a refused request does not queue");
        // A second later ten have started: the queue is shorter.
        let later = g.decide(1_000.0, Some("interactive"), 0, 0.0).unwrap().predicted_wait_ms.unwrap();
        assert!(later < *waits.last().unwrap(), "{later} vs {waits:?}");
        // A snapshot taken after those admissions has them in its own count.
        g.set_snapshots(vec![snapshot(1_001.0, 10.0, 4, [0, 0, 0])]);
        let fresh = g.decide(1_001.0, Some("interactive"), 0, 0.0).unwrap().predicted_wait_ms.unwrap();
        assert_eq!(fresh, 30.0, "a free seat and nothing ahead: the lead alone");
    }

    #[test]
    fn a_retry_counts_the_time_its_client_already_waited() {
        let mut g = gate("{}");
        // 5 interactive ahead at 10 a second: ~630 ms, inside 1 s for a first try.
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [5, 20, 40])]);
        assert!(g.decide(0.0, Some("interactive"), 0, 0.0).unwrap().refusal.is_none());
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [5, 20, 40])]);
        let retry = g.decide(0.0, Some("interactive"), 0, 600.0).unwrap();
        let notice = retry.refusal.expect("630 ms more after 600 ms waited: past 1 s");
        assert!(notice.message.contains("after 600 ms already waited"), "{}", notice.message);
        assert_eq!(parse_shed_notice(&notice.message), Some((ShedReason::Ttft, 1)));
        for bad in [-1.0, f64::NAN, crate::MAX_WAITED_MS * 2.0] {
            let e = g.decide(0.0, Some("interactive"), 0, bad).unwrap_err().to_string();
            assert!(e.contains(crate::WAITED_ARG), "{e}");
        }
    }

    #[test]
    fn the_load_is_the_expected_output_on_every_engine_whatever_its_age() {
        let mut g = gate("{}");
        assert_eq!(g.load_tokens(), 0, "no snapshot yet: nothing known ahead");
        let with_tokens = |taken_ms, tokens| ArrivalSnapshot {
            expected_output_tokens: tokens,
            ..snapshot(taken_ms, 10.0, 0, [0, 0, 0])
        };
        g.set_snapshots(vec![with_tokens(0.0, 1_200.4), with_tokens(0.0, 300.0)]);
        assert_eq!(g.load_tokens(), 1_500);
        // An idle engine's last snapshot stays true: its load does not vanish with age.
        let _ = g.decide(10.0 * STALE_SNAPSHOT_MS, None, 0, 0.0).unwrap();
        assert_eq!(g.load_tokens(), 1_500);
        let old = r#"{"format": "meridian-arrival/1", "taken_ms": 0, "starts_per_s": 1, "free_seats": 0,
                      "first_token_lead_ms": 0, "num_ahead": []}"#;
        assert_eq!(ArrivalSnapshot::from_json(old).unwrap().expected_output_tokens, 0.0);
        let negative = ArrivalSnapshot { expected_output_tokens: -1.0, ..snapshot(0.0, 1.0, 0, [0, 0, 0]) };
        assert!(ArrivalSnapshot::from_json(&negative.to_json()).is_err());
    }

    #[test]
    fn lower_ranks_do_not_queue_ahead_of_higher_ones() {
        let mut g = gate("{}");
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [0, 0, 0])]);
        for _ in 0..30 {
            g.decide(0.0, Some("batch"), 0, 0.0).unwrap();
        }
        let d = g.decide(0.0, Some("interactive"), 0, 0.0).unwrap();
        assert!(d.refusal.is_none() && d.predicted_wait_ms.unwrap() < 200.0, "{d:?}");
    }

    #[test]
    fn only_shed_classes_under_the_meridian_policy_are_refused() {
        let full = || vec![snapshot(0.0, 1.0, 0, [100, 100, 100])];
        for json in [
            r#"{"overload": {"on_overload": "queue"}}"#,
            r#"{"policy": "scorpio"}"#,
            r#"{"overload": {"admit_at_arrival": false}}"#,
        ] {
            let mut g = gate(json);
            g.set_snapshots(full());
            assert!(g.decide(0.0, Some("interactive"), 0, 0.0).unwrap().refusal.is_none(), "{json}");
        }
        let classes = r#"{"classes": {
            "chat": {"ttft_ms": 1000, "ttfat_ms": 10000, "answer_tpot_ms": 50, "rank": 0, "on_overload": "queue"},
            "api": {"ttft_ms": 1000, "ttfat_ms": 10000, "answer_tpot_ms": 50, "rank": 1}},
            "default_class": "api"}"#;
        let mut g = gate(classes);
        g.set_snapshots(vec![ArrivalSnapshot {
            num_ahead: vec![("chat".to_owned(), 100), ("api".to_owned(), 100)],
            ..snapshot(0.0, 1.0, 0, [0, 0, 0])
        }]);
        assert!(g.decide(0.0, Some("chat"), 0, 0.0).unwrap().refusal.is_none(), "a queue class waits");
        assert!(g.decide(0.0, Some("api"), 0, 0.0).unwrap().refusal.is_some());
    }

    #[test]
    fn several_engines_the_least_loaded_decides() {
        let mut g = gate("{}");
        g.set_snapshots(vec![snapshot(0.0, 10.0, 0, [100, 100, 100]), snapshot(0.0, 10.0, 4, [0, 0, 0])]);
        assert!(g.decide(0.0, Some("interactive"), 0, 0.0).unwrap().refusal.is_none());
    }

    #[test]
    fn bad_input_is_an_error_that_names_it() {
        let mut g = gate("{}");
        let e = g.decide(0.0, Some("gold"), 0, 0.0).unwrap_err().to_string();
        assert!(e.contains("`gold`") && e.contains("interactive"), "{e}");
        assert!(g.decide(f64::NAN, None, 0, 0.0).is_err());
        for text in ["", "{}", r#"{"format": "other/1"}"#] {
            assert!(ArrivalSnapshot::from_json(text).is_err(), "{text}");
        }
        let mut s = snapshot(0.0, 10.0, 0, [1, 2, 3]);
        assert_eq!(ArrivalSnapshot::from_json(&s.to_json()).unwrap(), s);
        s.starts_per_s = 0.0;
        let e = ArrivalSnapshot::from_json(&s.to_json()).unwrap_err().to_string();
        assert!(e.contains("starts_per_s"), "{e}");
    }

    proptest! {
        #[test]
        fn every_prediction_is_finite_and_grows_with_the_queue(
            ahead in proptest::array::uniform3(0u32..10_000),
            starts_per_s in 0.01f64..1e4,
            age_ms in 0.0f64..STALE_SNAPSHOT_MS,
            free_seats in 0u32..8,
        ) {
            let mut g = gate("{}");
            g.set_snapshots(vec![snapshot(0.0, starts_per_s, free_seats, ahead)]);
            let d = g.decide(age_ms, Some("standard"), 0, 0.0).unwrap();
            let wait_ms = d.predicted_wait_ms.unwrap();
            prop_assert!(wait_ms.is_finite() && wait_ms >= 30.0);
            prop_assert_eq!(d.refusal.is_some(), wait_ms > 3_000.0);
            if let Some(notice) = d.refusal {
                prop_assert!(notice.retry_after_s >= 1);
            }
            let more = [ahead[0], ahead[1].saturating_add(10), ahead[2]];
            let mut h = gate("{}");
            h.set_snapshots(vec![snapshot(0.0, starts_per_s, free_seats, more)]);
            let longer = h.decide(age_ms, Some("standard"), 0, 0.0).unwrap().predicted_wait_ms.unwrap();
            prop_assert!(longer >= wait_ms);
        }
    }
}
