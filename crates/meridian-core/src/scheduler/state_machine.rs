//! The core as a state machine under random interleavings of everything a shim can call, with
//! random configurations and hostile arguments (`proptest-state-machine`). The reference machine
//! only numbers requests and picks operations; the system under test is the core plus the shim's
//! view of it (vLLM's `running` and `waiting` lists, every handle ever issued, every request
//! ended). Invariants checked after every operation: no panic; a call the core refuses changes
//! nothing it tracks; every request ends exactly once and its handle is never issued again; the
//! core tracks exactly the requests the shim holds; a plan's orders are permutations and every
//! index it returns is in range and listed once; budgets and costs are finite and in bounds.
//!
//! CI runs `PROPTEST_CASES` (default 64) seeded cases; the benchmark run sets it high
//! (`bench/fuzz_core.sh`) and reads the operation count and rate this test prints.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use super::*;
use crate::kv_tier::{TierId, TierSpan};
use crate::prefix_index::Medium;

const THINK: u32 = 1;
const END: u32 = 2;
const TOOL: u32 = 3;
const WORD: u32 = 100;
const CLASSES: [&str; 3] = ["interactive", "standard", "batch"];
const WIRE_REASONS: [&str; 6] = ["stop", "length", "abort", "error", "repetition", "STOP"];

/// Operations applied over every case of the run (for the rate the benchmark reports).
static OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// A configuration the generator draws: valid ones build an engine, the rest must be refused.
fn config_json() -> impl Strategy<Value = String> {
    let policy = prop::sample::select(vec!["meridian", "answer_first", "pascal", "uniboost", "scorpio"]);
    let triage = prop::sample::select(vec!["queue", "shed", "degrade"]);
    let order = prop::sample::select(vec!["slack", "value_density", "value_at_risk"]);
    let until = prop::sample::select(vec!["ttft", "ttfat"]);
    let restore = prop::sample::select(vec!["auto", "always", "never"]);
    // Targets from milliseconds (late within a short case) to the defaults' minutes.
    let scale = prop::sample::select(vec![0.004, 0.05, 1.0, 30.0]);
    (policy, prop::collection::vec(triage, 3), order, until, restore, scale, any::<[bool; 4]>(), 0.0..1.0f64)
        .prop_map(|(policy, triage, order, until, restore, scale, flags, think_reserve)| {
            let classes: Vec<String> = CLASSES
                .iter()
                .zip(&triage)
                .enumerate()
                .map(|(rank, (name, mode))| {
                    let s = scale * (rank + 1) as f64;
                    format!(
                        r#""{name}": {{"ttft_ms": {}, "ttfat_ms": {}, "answer_tpot_ms": {}, "rank": {rank}, "on_overload": "{mode}"}}"#,
                        1000.0 * s,
                        15000.0 * s,
                        50.0 * s.max(0.05)
                    )
                })
                .collect();
            format!(
                r#"{{"policy": "{policy}", "answer_kv_reserve": {}, "think_kv_reserve": {think_reserve},
                    "overload": {{"waiting_order": "{order}", "shed_until": "{until}", "shed_running": {}}},
                    "arrival_preemption": {{"enabled": {}}}, "prefix_affinity": {{"enabled": {}}},
                    "kv_tier": {{"restore": "{restore}"}}, "classes": {{{}}}}}"#,
                flags[0],
                flags[1],
                flags[2],
                flags[3],
                classes.join(", ")
            )
        })
}

/// A class a request names: none, a configured one, or one the configuration lacks.
#[derive(Debug, Clone)]
enum ClassArg {
    Default,
    Configured(usize),
    Unknown(String),
}

/// A time the shim passes: normally the clock, sometimes what a broken caller might pass.
#[derive(Debug, Clone, Copy)]
enum Clock {
    Now,
    Bad(f64),
}

#[derive(Debug, Clone)]
enum Op {
    Add { prompt_len: usize, class: ClassArg, priority: i64, max_tokens: u32, open_think: bool, clock: Clock },
    AddDuplicate { pick: usize },
    Admit { pick: usize },
    Tokens { pick: usize, tokens: Vec<u32> },
    Plan { free_blocks: u32, clock: Clock },
    Output { prefill: u32, decode: u32, context: u64, stale: bool },
    Preempt { pick: usize },
    Finish { pick: usize, reason: usize, unseen: Vec<u32> },
    FinishAgain { pick: usize },
    Probe { pick: usize },
    Load,
    KvStored { pick: usize, num_tokens: u32 },
    KvLoad { num_tokens: u64, duration_ms: f64 },
    KvLoadFailure { pick: usize, num_blocks: u64 },
    Restore { pick: usize, num_tokens: u32, allocate: u32 },
    BlockHashes { pick: usize, hashes: Vec<u64> },
    BlocksStored { tier: bool, hashes: Vec<u64> },
    BlocksRemoved { tier: bool, hashes: Vec<u64> },
    BlocksCleared { tier: bool },
    ThinkingWorker(bool),
    Advance { ms: f64 },
}

fn clock() -> impl Strategy<Value = Clock> {
    prop_oneof![
        20 => Just(Clock::Now),
        1 => prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0]).prop_map(Clock::Bad),
    ]
}

fn class_arg() -> impl Strategy<Value = ClassArg> {
    prop_oneof![
        4 => Just(ClassArg::Default),
        8 => (0..CLASSES.len()).prop_map(ClassArg::Configured),
        1 => "[a-z]{1,6}|.{200,300}".prop_map(ClassArg::Unknown),
    ]
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop::sample::select(vec![WORD, WORD, WORD, THINK, END, TOOL, 7]), 0..12)
}

fn hashes() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..64, 0..8)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..300, class_arg(), -3i64..4, 0u32..600, any::<bool>(), clock()).prop_map(
            |(prompt_len, class, priority, max_tokens, open_think, clock)| Op::Add {
                prompt_len, class, priority, max_tokens, open_think, clock
            }
        ),
        1 => any::<usize>().prop_map(|pick| Op::AddDuplicate { pick }),
        5 => any::<usize>().prop_map(|pick| Op::Admit { pick }),
        8 => (any::<usize>(), tokens()).prop_map(|(pick, tokens)| Op::Tokens { pick, tokens }),
        6 => (0u32..120, clock()).prop_map(|(free_blocks, clock)| Op::Plan { free_blocks, clock }),
        4 => (0u32..2048, 0u32..64, 0u64..100_000, any::<bool>())
            .prop_map(|(prefill, decode, context, stale)| Op::Output { prefill, decode, context, stale }),
        2 => any::<usize>().prop_map(|pick| Op::Preempt { pick }),
        3 => (any::<usize>(), 0..WIRE_REASONS.len() + 1, tokens())
            .prop_map(|(pick, reason, unseen)| Op::Finish { pick, reason, unseen }),
        1 => any::<usize>().prop_map(|pick| Op::FinishAgain { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Probe { pick }),
        1 => Just(Op::Load),
        2 => (any::<usize>(), 0u32..400).prop_map(|(pick, num_tokens)| Op::KvStored { pick, num_tokens }),
        1 => (0u64..4096, prop_oneof![4 => 0.0..50.0f64, 1 => Just(f64::NAN), 1 => Just(-3.0)])
            .prop_map(|(num_tokens, duration_ms)| Op::KvLoad { num_tokens, duration_ms }),
        1 => (any::<usize>(), 0u64..20).prop_map(|(pick, num_blocks)| Op::KvLoadFailure { pick, num_blocks }),
        2 => (any::<usize>(), 0u32..400, 0u32..400)
            .prop_map(|(pick, num_tokens, allocate)| Op::Restore { pick, num_tokens, allocate }),
        1 => (any::<usize>(), hashes()).prop_map(|(pick, hashes)| Op::BlockHashes { pick, hashes }),
        1 => (any::<bool>(), hashes()).prop_map(|(tier, hashes)| Op::BlocksStored { tier, hashes }),
        1 => (any::<bool>(), hashes()).prop_map(|(tier, hashes)| Op::BlocksRemoved { tier, hashes }),
        1 => any::<bool>().prop_map(|tier| Op::BlocksCleared { tier }),
        1 => any::<bool>().prop_map(Op::ThinkingWorker),
        4 => prop_oneof![0.0..20.0f64, 100.0..5000.0f64].prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The reference machine: the configuration of the case, and nothing the core decides.
struct Reference;

impl ReferenceStateMachine for Reference {
    type State = String;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<String> {
        config_json().boxed()
    }

    fn transitions(_: &String) -> BoxedStrategy<Op> {
        op().boxed()
    }

    fn apply(state: String, _: &Op) -> String {
        state
    }
}

/// The core and the shim's view of it.
struct Sut {
    core: Meridian,
    tier: TierId,
    running: Vec<ReqHandle>,
    waiting: Vec<ReqHandle>,
    live: HashMap<ReqHandle, String>,
    issued: HashSet<ReqHandle>,
    ended: Vec<ReqHandle>,
    /// EAT probes: tracked like requests, kept out of the books (`num_finished`).
    probes: HashSet<ReqHandle>,
    now_ms: f64,
    next_id: u64,
    last_step: Option<u64>,
}

impl Sut {
    fn time(&self, clock: Clock) -> f64 {
        match clock {
            Clock::Now => self.now_ms,
            Clock::Bad(t) => t,
        }
    }

    /// A request the shim holds, by `pick` over running then waiting.
    fn held(&self, pick: usize) -> Option<ReqHandle> {
        let all: Vec<ReqHandle> = self.running.iter().chain(&self.waiting).copied().collect();
        (!all.is_empty()).then(|| all[pick % all.len()])
    }

    fn running_pick(&self, pick: usize) -> Option<ReqHandle> {
        (!self.running.is_empty()).then(|| self.running[pick % self.running.len()])
    }

    fn forget(&mut self, h: ReqHandle) {
        self.running.retain(|&r| r != h);
        self.waiting.retain(|&r| r != h);
        self.live.remove(&h);
        self.ended.push(h);
    }

    fn track(&mut self, h: ReqHandle, req_id: String) {
        assert!(self.issued.insert(h), "handle {h:?} issued twice");
        self.live.insert(h, req_id);
        self.waiting.push(h);
    }

    /// `call` refused: nothing the core tracks changed.
    fn refused<T: std::fmt::Debug>(&self, before: (usize, u64), result: Result<T>, what: &str) {
        let err = result.expect_err(what);
        assert!(!err.to_string().is_empty());
        assert_eq!((self.core.num_requests(), self.core.stats().num_finished), before, "{what}: {err}");
    }

    fn counts(&self) -> (usize, u64) {
        (self.core.num_requests(), self.core.stats().num_finished)
    }

    fn add(
        &mut self,
        prompt_len: usize,
        class: &ClassArg,
        priority: i64,
        max_tokens: u32,
        open_think: bool,
        clock: Clock,
    ) {
        let mut prompt = vec![WORD; prompt_len];
        if open_think {
            prompt.push(THINK);
        }
        let req_id = format!("r{}", self.next_id);
        self.next_id += 1;
        let name = match class {
            ClassArg::Default => None,
            ClassArg::Configured(i) => Some(CLASSES[*i]),
            ClassArg::Unknown(name) => Some(name.as_str()),
        };
        let arrival_ms = self.time(clock);
        let before = self.counts();
        let result = self.core.add_request(NewRequest {
            req_id: &req_id,
            arrival_ms,
            prompt_token_ids: &prompt,
            max_tokens,
            slo_class: name,
            priority,
            waited_ms: 0.0,
        });
        let valid = matches!(clock, Clock::Now) && !matches!(class, ClassArg::Unknown(_));
        if valid {
            let (h, _) = result.expect("a valid request is tracked");
            self.track(h, req_id);
        } else {
            self.refused(before, result, "an unknown class or a bad time is refused");
            assert_eq!(self.core.handle_of(&req_id), None);
        }
    }

    /// The plan: every index in range and once; orders permutations; bounds; then applied as
    /// the shim applies it.
    fn plan(&mut self, free_blocks: u32, clock: Clock) {
        let now_ms = self.time(clock);
        if matches!(clock, Clock::Bad(_)) {
            let before = self.counts();
            let result = self.core.plan_step(now_ms, &self.running, &self.waiting, free_blocks);
            self.refused(before, result, "a bad time is refused");
            return;
        }
        let mut again = self.core.clone();
        let plan = self.core.plan_step(now_ms, &self.running, &self.waiting, free_blocks).expect("plan");
        let replay = again.plan_step(now_ms, &self.running, &self.waiting, free_blocks).expect("plan");
        assert_eq!(plan, replay, "plans are deterministic: the order keys are total");
        let (r, w) = (self.running.len(), self.waiting.len());
        assert!(is_permutation(&plan.running_order, r) && is_permutation(&plan.waiting_order, w));
        assert!(plan.num_admissible as usize <= w);
        assert!(plan.token_budget >= 1);
        for indices in [&plan.held, &plan.preempt, &plan.end_thinking] {
            assert!(distinct_below(indices, r), "{indices:?} of {r} running");
        }
        assert!(distinct_below(&plan.prefetch, w), "prefetch {:?} of {w} waiting", plan.prefetch);
        let shed: Vec<(bool, u32)> = plan.shed.iter().map(|s| (s.running, s.index)).collect();
        assert_eq!(shed.iter().collect::<HashSet<_>>().len(), shed.len(), "a request shed twice");
        assert!(shed.iter().all(|&(running, i)| (i as usize) < if running { r } else { w }));
        // Applied as the shim applies it: ends first (vLLM's abort), then the preemptions, then
        // the new orders.
        let shed_handles: Vec<(ReqHandle, ShedReason)> = plan
            .shed
            .iter()
            .map(|s| {
                (
                    if s.running { self.running[s.index as usize] } else { self.waiting[s.index as usize] },
                    s.reason,
                )
            })
            .collect();
        let preempted: Vec<ReqHandle> = plan.preempt.iter().map(|&i| self.running[i as usize]).collect();
        self.running = plan.running_order.iter().map(|&i| self.running[i as usize]).collect();
        self.waiting = plan.waiting_order.iter().map(|&i| self.waiting[i as usize]).collect();
        self.last_step = Some(plan.step_id);
        for (h, reason) in shed_handles {
            let done = self.core.finish(now_ms, h, "abort", &[]).expect("a shed request ends");
            assert_eq!(done.shed, Some(reason));
            self.forget(h);
        }
        for h in preempted.into_iter().filter(|h| self.live.contains_key(h)) {
            self.core.on_preempted(now_ms, h).expect("a planned preemption");
            self.running.retain(|&x| x != h);
            self.waiting.insert(0, h);
        }
    }

    fn finish(&mut self, pick: usize, reason: usize, unseen: &[u32]) {
        let Some(h) = self.held(pick) else { return };
        let wire = WIRE_REASONS.get(reason).copied().unwrap_or("something-new");
        let mut output = vec![WORD; self.core.num_output_tokens(h).expect("live") as usize];
        output.extend_from_slice(unseen);
        let finished_before = self.core.stats().num_finished;
        let done = self.core.finish(self.now_ms, h, wire, &output).expect("a live request finishes");
        assert_eq!(done.req_id, self.live[&h]);
        let counted = u64::from(!self.probes.contains(&h));
        assert_eq!(
            self.core.stats().num_finished,
            finished_before + counted,
            "a request is counted once, a probe never"
        );
        let m = done.metrics;
        for v in [m.ttft_ms, m.ttfat_ms, m.answer_tpot_ms, m.think_tpot_ms, m.e2e_ms].into_iter().flatten() {
            assert!(v.is_finite() && v >= 0.0, "{m:?}");
        }
        self.forget(h);
    }

    fn apply(&mut self, op: &Op) {
        OPERATIONS.fetch_add(1, Ordering::Relaxed);
        self.now_ms += 0.5;
        let now = self.now_ms;
        match op {
            Op::Add { prompt_len, class, priority, max_tokens, open_think, clock } => {
                self.add(*prompt_len, class, *priority, *max_tokens, *open_think, *clock);
            }
            Op::AddDuplicate { pick } => {
                if let Some(h) = self.held(*pick) {
                    let req_id = self.live[&h].clone();
                    let before = self.counts();
                    let result = self.core.add_request(NewRequest {
                        req_id: &req_id,
                        arrival_ms: now,
                        prompt_token_ids: &[WORD],
                        max_tokens: 4,
                        slo_class: None,
                        priority: 0,
                        waited_ms: 0.0,
                    });
                    self.refused(before, result, "a live req_id is refused");
                    assert_eq!(self.core.handle_of(&req_id), Some(h));
                }
            }
            Op::Admit { pick } => {
                if !self.waiting.is_empty() {
                    let h = self.waiting.remove(pick % self.waiting.len());
                    self.running.push(h);
                }
            }
            Op::Tokens { pick, tokens } => {
                if let Some(h) = self.running_pick(*pick) {
                    self.core.on_tokens(now, h, tokens).expect("tokens of a running request");
                }
            }
            Op::Plan { free_blocks, clock } => self.plan(*free_blocks, *clock),
            Op::Output { prefill, decode, context, stale } => {
                let shape = StepShape {
                    num_prefill_tokens: *prefill,
                    num_decode_requests: *decode,
                    num_context_tokens: *context,
                };
                match (self.last_step.take(), stale) {
                    (Some(step), false) => {
                        let predicted =
                            self.core.on_step_output(now, step, shape).expect("the planned step's output");
                        assert!(predicted.is_none_or(|ms| ms.is_finite() && ms >= 0.0));
                    }
                    // A step never planned (or reported twice): whatever the core answers, no panic
                    // and nothing tracked changes.
                    (step, _) => {
                        let before = self.counts();
                        let _ = self.core.on_step_output(now, step.map_or(u64::MAX, |s| s + 1_000), shape);
                        assert_eq!(self.counts(), before);
                    }
                }
            }
            Op::Preempt { pick } => {
                if let Some(h) = self.running_pick(*pick) {
                    self.core.on_preempted(now, h).expect("a running request is preempted");
                    self.running.retain(|&x| x != h);
                    self.waiting.insert(0, h);
                }
            }
            Op::Finish { pick, reason, unseen } => self.finish(*pick, *reason, unseen),
            Op::FinishAgain { pick } => {
                if !self.ended.is_empty() {
                    let h = self.ended[pick % self.ended.len()];
                    let before = self.counts();
                    let result = self.core.finish(now, h, "stop", &[]);
                    self.refused(before, result, "a request ends once");
                    assert!(self.core.phase(h).is_err());
                }
            }
            Op::Probe { pick } => {
                if let Some(parent) = self.held(*pick) {
                    let req_id = format!("p{}", self.next_id);
                    self.next_id += 1;
                    let h = self
                        .core
                        .add_probe(&req_id, now, &[WORD, THINK], parent)
                        .expect("a probe of a live parent");
                    self.track(h, req_id);
                    self.probes.insert(h);
                }
            }
            Op::Load => {
                self.core.engine_load(now, &self.running, &self.waiting).expect("engine load");
            }
            Op::KvStored { pick, num_tokens } => {
                if let Some(h) = self.held(*pick) {
                    self.core.on_kv_stored(h, self.tier, *num_tokens).expect("stored");
                    assert!(self.core.num_stored_tokens(h).expect("live") <= *num_tokens);
                }
            }
            Op::KvLoad { num_tokens, duration_ms } => {
                let result = self.core.on_kv_load(self.tier, *num_tokens, *duration_ms);
                if duration_ms.is_finite() && *duration_ms >= 0.0 {
                    result.expect("a timed load");
                    let per_token = self.core.kv_load_ms_per_token(self.tier).expect("the tier");
                    assert!(per_token.is_finite() && per_token >= 0.0);
                } else {
                    assert!(result.is_err(), "a bad duration is refused");
                }
            }
            Op::KvLoadFailure { pick, num_blocks } => {
                if let Some(h) = self.held(*pick) {
                    self.core.on_kv_load_failure(h, *num_blocks).expect("load failure");
                    assert_eq!(
                        self.core.num_stored_tokens(h).expect("live"),
                        0,
                        "a failed load is never offered again"
                    );
                }
            }
            Op::Restore { pick, num_tokens, allocate } => {
                if let Some(h) = self.held(*pick) {
                    let spans = [TierSpan { tier: self.tier, num_tokens: *num_tokens }];
                    let plan = self.core.plan_restore(h, &spans).expect("restore plan");
                    assert!(plan.num_restore_tokens <= plan.num_offered_tokens.max(*num_tokens));
                    assert!(plan.cost_ms.is_finite() && plan.cost_ms >= 0.0, "{plan:?}");
                    assert!(plan.recompute_ms.is_finite() && plan.recompute_ms >= 0.0, "{plan:?}");
                    self.core
                        .on_kv_allocated(h, (*allocate).min(plan.num_restore_tokens))
                        .expect("allocated");
                }
            }
            Op::BlockHashes { pick, hashes } => {
                if let Some(h) = self.held(*pick) {
                    self.core.set_block_hashes(h, hashes.clone()).expect("hashes");
                    let _ = self.core.cached_prefix(h).expect("cached prefix of a live request");
                }
            }
            Op::BlocksStored { tier, hashes } => {
                let _ = self.core.on_blocks_stored(self.medium(*tier), hashes);
            }
            Op::BlocksRemoved { tier, hashes } => {
                let _ = self.core.on_blocks_removed(self.medium(*tier), hashes);
            }
            Op::BlocksCleared { tier } => {
                let _ = self.core.on_blocks_cleared(self.medium(*tier));
            }
            Op::ThinkingWorker(attached) => self.core.set_thinking_worker(*attached),
            Op::Advance { ms } => self.now_ms += ms,
        }
    }

    fn medium(&self, tier: bool) -> Medium {
        if tier {
            Medium::Tier(self.tier)
        } else {
            Medium::Device
        }
    }
}

fn is_permutation(order: &[u32], n: usize) -> bool {
    order.len() == n && distinct_below(order, n)
}

fn distinct_below(indices: &[u32], n: usize) -> bool {
    let mut seen = vec![false; n];
    indices.iter().all(|&i| (i as usize) < n && !std::mem::replace(&mut seen[i as usize], true))
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Option<Sut>;
    type Reference = Reference;

    fn init_test(config: &String) -> Option<Sut> {
        // A configuration the core refuses is a named error, never a panic.
        let config = match Config::from_json(config) {
            Ok(config) => config,
            Err(err) => {
                assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
                return None;
            }
        };
        let limits = EngineLimits::new(16, 2048, 64);
        let markers = ReasoningMarkers::new(vec![THINK], vec![END], vec![vec![TOOL]]);
        let mut core = Meridian::new(config, limits, markers).expect("a valid configuration builds");
        let tier = core.add_kv_tier("host", true).expect("a tier");
        Some(Sut {
            core,
            tier,
            running: Vec::new(),
            waiting: Vec::new(),
            live: HashMap::new(),
            issued: HashSet::new(),
            ended: Vec::new(),
            probes: HashSet::new(),
            now_ms: 0.0,
            next_id: 0,
            last_step: None,
        })
    }

    fn apply(mut sut: Option<Sut>, _: &String, op: Op) -> Option<Sut> {
        if let Some(sut) = sut.as_mut() {
            sut.apply(&op);
        }
        sut
    }

    fn check_invariants(sut: &Option<Sut>, _: &String) {
        let Some(sut) = sut else { return };
        assert_eq!(
            sut.core.num_requests(),
            sut.running.len() + sut.waiting.len(),
            "a request lost or duplicated"
        );
        assert_eq!(sut.live.len(), sut.core.num_requests());
        let footprint = sut.core.footprint();
        assert_eq!(footprint.num_live_requests, sut.live.len(), "the footprint counts the live requests");
        assert!(footprint.num_slots >= footprint.num_live_requests);
        for (h, req_id) in &sut.live {
            assert_ne!(sut.core.phase(*h).expect("a live request has a phase"), Phase::Done);
            assert_eq!(sut.core.handle_of(req_id), Some(*h));
        }
        let stats = sut.core.stats();
        let ended_requests = sut.ended.iter().filter(|h| !sut.probes.contains(h)).count();
        assert_eq!(stats.num_finished, ended_requests as u64, "every end counted once");
        assert!(sut.ended.iter().all(|h| sut.core.phase(*h).is_err()));
    }
}

/// Cases from `PROPTEST_CASES` (default 64), seeded by `MERIDIAN_FUZZ_SEED` (default 0: CI's
/// short run is the same every time); prints the operations run and their rate (what the
/// benchmark run records).
#[test]
fn random_interleavings_keep_every_invariant() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("PROPTEST_CASES").unwrap_or(64) as u32;
    let seed = env("MERIDIAN_FUZZ_SEED").unwrap_or(0);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config.clone());
    let started = Instant::now();
    let ops_before = OPERATIONS.load(Ordering::Relaxed);
    let result = runner.run(&Reference::sequential_strategy(1..400), |(initial, transitions, seen)| {
        Sut::test_sequential(config.clone(), initial, transitions, seen);
        Ok(())
    });
    let ops = OPERATIONS.load(Ordering::Relaxed) - ops_before;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "core state machine: seed {seed}, {cases} cases, {ops} operations in {secs:.1} s ({:.0} operations/s)",
        ops as f64 / secs
    );
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
