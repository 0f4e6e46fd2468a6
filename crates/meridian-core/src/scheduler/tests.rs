use proptest::prelude::*;

use super::*;
use crate::slo::WaitingOrder;
use crate::Medium;
use std::collections::HashSet;

const THINK: u32 = 1;
const END: u32 = 2;
const TOOL: u32 = 3;
const WORD: u32 = 100;

fn limits() -> EngineLimits {
    EngineLimits::new(16, 8192, 256)
}

fn engine_with(config: Config) -> Meridian {
    Meridian::new(config, limits(), ReasoningMarkers::new(vec![THINK], vec![END], vec![vec![TOOL]])).unwrap()
}

fn engine() -> Meridian {
    engine_with(Config::default())
}

fn add(core: &mut Meridian, req_id: &str, arrival_ms: f64, prompt_len: usize) -> ReqHandle {
    add_class(core, req_id, arrival_ms, prompt_len, None)
}

fn add_class(
    core: &mut Meridian,
    req_id: &str,
    arrival_ms: f64,
    prompt_len: usize,
    class: Option<&str>,
) -> ReqHandle {
    let prompt = vec![WORD; prompt_len];
    core.add_request(NewRequest {
        req_id,
        arrival_ms,
        prompt_token_ids: &prompt,
        max_tokens: 4096,
        slo_class: class,
        priority: 0,
        waited_ms: 0.0,
    })
    .unwrap()
    .0
}

fn think(core: &mut Meridian, now_ms: f64, h: ReqHandle, n: usize) {
    core.on_tokens(now_ms, h, &vec![WORD; n]).unwrap();
}

#[test]
fn answering_requests_run_first_and_the_victim_is_thinking() {
    let mut core = engine();
    let a = add(&mut core, "a", 0.0, 32);
    let b = add(&mut core, "b", 0.0, 32);
    let c = add(&mut core, "c", 0.0, 32);
    think(&mut core, 10.0, a, 5);
    think(&mut core, 10.0, b, 5);
    core.on_tokens(10.0, b, &[END, WORD]).unwrap();
    think(&mut core, 10.0, c, 3000);
    let plan = core.plan_step(20.0, &[a, b, c], &[], 1000).unwrap();
    assert_eq!(plan.running_order[0], 1, "the answering request leads");
    assert_eq!(core.phase(b).unwrap(), Phase::Answer);
    // c has thought deep into the heavy tail, so it expects far more thinking and has less
    // slack; a has the most slack and is the victim.
    assert_eq!(plan.running_order, vec![1, 2, 0]);
}

#[test]
fn a_request_computing_again_after_a_preemption_goes_after_the_decodes_of_its_phase() {
    // Two answering and two thinking requests; one of each was preempted and is back in the
    // running list computing its tokens again (no token since). vLLM gives the budget in the
    // running order, each up to what it still has to compute: the recomputes come after the
    // decodes of their phase, so no answer waits a step for its token behind one.
    let mut core = engine();
    let handles: Vec<_> = (0..4).map(|i| add(&mut core, &format!("r{i}"), 0.0, 32)).collect();
    for &h in &handles {
        think(&mut core, 10.0, h, 5);
    }
    for &h in &handles[..2] {
        core.on_tokens(10.0, h, &[END, WORD]).unwrap();
    }
    // r0 (answering) and r2 (thinking) lose their KV and come back.
    for &h in &[handles[0], handles[2]] {
        core.on_preempted(20.0, h).unwrap();
    }
    let running = [handles[0], handles[1], handles[2], handles[3]];
    let plan = core.plan_step(30.0, &running, &[], 1000).unwrap();
    assert_eq!(plan.running_order, vec![1, 0, 3, 2]);
    // Its first token back makes it a decode again.
    core.on_tokens(40.0, handles[2], &[WORD]).unwrap();
    core.on_tokens(40.0, handles[0], &[WORD]).unwrap();
    let plan = core.plan_step(50.0, &running, &[], 1000).unwrap();
    let mut leading = plan.running_order[..2].to_vec();
    leading.sort_unstable();
    assert_eq!(leading, [0, 1], "both answers lead");
}

#[test]
fn requests_past_their_ttfat_deadline_drop_to_best_effort() {
    let mut core = engine();
    let late = add_class(&mut core, "late", 0.0, 16, Some("interactive"));
    let fresh = add_class(&mut core, "fresh", 99_000.0, 16, Some("interactive"));
    think(&mut core, 99_500.0, late, 3);
    think(&mut core, 99_500.0, fresh, 3);
    let plan = core.plan_step(100_000.0, &[late, fresh], &[], 1000).unwrap();
    assert_eq!(plan.running_order, vec![1, 0], "the request that can still make it goes first");
}

#[test]
fn preempted_requests_resume_before_new_ones_and_classes_order_the_rest() {
    // Class order proper: no request is left safely inside its targets by the light-load rule.
    let mut core = engine_with(Config::from_json(r#"{"overload": {"fcfs_slack_ttft_factor": 0}}"#).unwrap());
    let batch = add_class(&mut core, "batch", 0.0, 16, Some("batch"));
    let inter = add_class(&mut core, "inter", 5.0, 16, Some("interactive"));
    let victim = add(&mut core, "victim", 8.0, 16);
    think(&mut core, 9.0, victim, 4);
    core.plan_step(10.0, &[victim], &[batch, inter], 1000).unwrap();
    let p = core.on_preempted(10.0, victim).unwrap();
    assert_eq!(p, Preemption { phase: Phase::Think, alarm: false });
    let plan = core.plan_step(11.0, &[], &[batch, inter, victim], 1000).unwrap();
    assert_eq!(plan.waiting_order, vec![2, 1, 0]);
}

#[test]
fn aging_and_starvation_bound_keep_batch_requests_moving() {
    let config = Config::from_json(
        r#"{"aging_ms": 100, "starvation_ms": 1000, "overload": {"fcfs_slack_ttft_factor": 0}}"#,
    )
    .unwrap();
    let mut core = engine_with(config);
    let batch = add_class(&mut core, "batch", 0.0, 16, Some("batch"));
    let inter = add_class(&mut core, "inter", 150.0, 16, Some("interactive"));
    // At 160 ms, batch has aged one rank (standard) but interactive still outranks it.
    let plan = core.plan_step(160.0, &[], &[batch, inter], 1000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 0]);
    // At 250 ms, batch has aged two ranks: same rank, and its slack is larger, so still second.
    // Past the starvation bound it goes first whatever its class.
    let inter2 = add_class(&mut core, "inter2", 1500.0, 16, Some("interactive"));
    let plan = core.plan_step(1500.0, &[], &[inter2, batch], 1000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 0]);
}

#[test]
fn admission_keeps_a_reserve_for_answering_requests() {
    let mut core = engine();
    let answering = add(&mut core, "ans", 0.0, 16);
    core.on_tokens(1.0, answering, &[END]).unwrap();
    let w1 = add(&mut core, "w1", 2.0, 100); // 7 blocks with the first decode token
    let w2 = add(&mut core, "w2", 3.0, 100);
    let reserve = core.plan_step(4.0, &[answering], &[w1, w2], 1000).unwrap().num_reserved_blocks;
    assert!(reserve > 0);
    let plan = core.plan_step(4.0, &[answering], &[w1, w2], reserve + 10).unwrap();
    assert_eq!(plan.num_admissible, 1, "only one 7-block prompt fits beside the reserve");
    // Without the reserve both fit.
    let mut core = engine_with(Config::from_json(r#"{"answer_kv_reserve": false}"#).unwrap());
    let answering = add(&mut core, "ans", 0.0, 16);
    core.on_tokens(1.0, answering, &[END]).unwrap();
    let w1 = add(&mut core, "w1", 2.0, 100);
    let w2 = add(&mut core, "w2", 3.0, 100);
    let plan = core.plan_step(4.0, &[answering], &[w1, w2], reserve + 10).unwrap();
    assert_eq!((plan.num_reserved_blocks, plan.num_admissible), (0, 2));
}

#[test]
fn think_reserve_holds_back_room_for_thinking_requests() {
    let plan_for = |fraction: f64| {
        let mut core =
            engine_with(Config::from_json(&format!(r#"{{"think_kv_reserve": {fraction}}}"#)).unwrap());
        let thinking = add(&mut core, "t", 0.0, 16);
        think(&mut core, 1.0, thinking, 10);
        let w = add(&mut core, "w", 2.0, 16);
        core.plan_step(3.0, &[thinking], &[w], 10_000).unwrap()
    };
    assert_eq!(plan_for(0.0).num_reserved_blocks, 0);
    let half = plan_for(0.5).num_reserved_blocks;
    let full = plan_for(1.0).num_reserved_blocks;
    assert!(half > 0 && full > half, "{half} {full}");
    assert!(Config::from_json(r#"{"think_kv_reserve": 1.5}"#)
        .unwrap_err()
        .to_string()
        .contains("think_kv_reserve"));
}

#[test]
fn an_idle_engine_always_lets_the_head_try() {
    let mut core = engine();
    let huge = add(&mut core, "huge", 0.0, 10_000);
    let plan = core.plan_step(1.0, &[], &[huge], 3).unwrap();
    assert_eq!(plan.num_admissible, 1);
}

#[test]
fn budget_is_capped_by_answer_tpot_and_relaxed_without_answers() {
    let config = Config::from_json(
        r#"{"step_time": {"base_ms": 10, "per_prefill_token_ms": 0.1, "per_decode_request_ms": 0,
            "per_context_token_ms": 0, "online_fit": false}, "tpot_headroom": 1.0, "min_token_budget": 4}"#,
    )
    .unwrap();
    let mut core = engine_with(config);
    let t = add_class(&mut core, "t", 0.0, 16, Some("interactive"));
    think(&mut core, 1.0, t, 1);
    // Without answers a step may take 2.5 × the interactive 50 ms: one decode plus
    // (125 - 10) / 0.1 = 1,150 prompt tokens.
    let plan = core.plan_step(2.0, &[t], &[], 1000).unwrap();
    assert_eq!(plan.token_budget, 1 + 1150);
    // While one answers, a step may take the time its answer banked below the 50 ms mean: one
    // token 1 ms ago, a 10 ms step in flight, so (1 + 1) × 50 - 1 - 10 = 89 ms: both decodes
    // plus (89 - 10) / 0.1 = 790 prompt tokens.
    let a = add_class(&mut core, "a", 0.0, 16, Some("interactive"));
    core.on_tokens(3.0, a, &[END, WORD]).unwrap();
    let plan = core.plan_step(4.0, &[t, a], &[], 1000).unwrap();
    assert_eq!(plan.token_budget, 2 + 790);
    // An answer that has run at its target banks nothing: the step gets the target itself,
    // 50 ms: (50 - 10) / 0.1 = 400 prompt tokens.
    core.on_tokens(53.0, a, &[WORD]).unwrap();
    let plan = core.plan_step(103.0, &[t, a], &[], 1000).unwrap();
    assert_eq!(plan.token_budget, 2 + 400);
}

#[test]
fn budget_never_exceeds_the_engine_limit_nor_falls_below_the_floor() {
    let config = Config::from_json(
        r#"{"step_time": {"base_ms": 1000, "per_prefill_token_ms": 1, "online_fit": false}, "min_token_budget": 8}"#,
    )
    .unwrap();
    let mut core = engine_with(config);
    let a = add(&mut core, "a", 0.0, 16);
    core.on_tokens(1.0, a, &[END]).unwrap();
    // No room for prompt tokens at all: the decode plus the floor.
    assert_eq!(core.plan_step(2.0, &[a], &[], 10).unwrap().token_budget, 1 + 8);
}

#[test]
fn preempting_an_answer_while_thinking_runs_raises_an_alarm() {
    let mut core = engine();
    let a = add(&mut core, "a", 0.0, 16);
    let t = add(&mut core, "t", 0.0, 16);
    core.on_tokens(1.0, a, &[END]).unwrap();
    think(&mut core, 1.0, t, 1);
    core.plan_step(2.0, &[a, t], &[], 10).unwrap();
    assert!(core.on_preempted(2.0, a).unwrap().alarm);
    core.plan_step(3.0, &[t], &[a], 10).unwrap();
    assert!(!core.on_preempted(3.0, t).unwrap().alarm);
    assert_eq!(core.stats().num_answer_preemption_alarms, 1);
    assert_eq!(core.stats().num_preemptions.answer, 1);
    assert_eq!(core.stats().num_preemptions.think, 1);
}

#[test]
fn finished_reasoning_requests_report_never_reusable_blocks_unless_tool_call() {
    let mut core = engine();
    let open_prompt = [WORD, WORD, THINK, WORD];
    let new = |req_id| NewRequest {
        req_id,
        arrival_ms: 0.0,
        prompt_token_ids: &open_prompt,
        max_tokens: 64,
        slo_class: None,
        priority: 0,
        waited_ms: 0.0,
    };
    let (plain, _) = core.add_request(new("plain")).unwrap();
    let (tool, _) = core.add_request(new("tool")).unwrap();
    core.on_tokens(1.0, plain, &[WORD, END, WORD]).unwrap();
    core.on_tokens(1.0, tool, &[WORD, END, TOOL]).unwrap();
    let done = core.finish(2.0, plain, "stop", &[]).unwrap();
    assert_eq!(done.never_reusable_from_token, Some(2));
    assert_eq!(core.finish(2.0, tool, "stop", &[]).unwrap().never_reusable_from_token, None);

    let mut always = engine_with(Config::from_json(r#"{"evict_reasoning_blocks": "always"}"#).unwrap());
    let (tool, _) = always.add_request(new("tool")).unwrap();
    always.on_tokens(1.0, tool, &[WORD, END, TOOL]).unwrap();
    assert_eq!(always.finish(2.0, tool, "stop", &[]).unwrap().never_reusable_from_token, Some(2));
}

#[test]
fn bad_input_gets_named_errors() {
    let mut core = engine();
    let a = add(&mut core, "a", 0.0, 4);
    let err = core
        .add_request(NewRequest {
            req_id: "a",
            arrival_ms: 0.0,
            prompt_token_ids: &[1],
            max_tokens: 1,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        })
        .unwrap_err();
    assert_eq!(err, Error::DuplicateRequest { req_id: "a".into() });
    let err = core
        .add_request(NewRequest {
            req_id: "b",
            arrival_ms: 0.0,
            prompt_token_ids: &[1],
            max_tokens: 1,
            slo_class: Some("gold"),
            priority: 0,
            waited_ms: 0.0,
        })
        .unwrap_err();
    assert!(err.to_string().contains("gold") && err.to_string().contains("interactive"), "{err}");
    assert!(core.plan_step(f64::NAN, &[a], &[], 1).is_err());
    assert!(core.plan_step(1.0, &[a], &[a], 1).unwrap_err().to_string().contains("twice"));
    core.finish(1.0, a, "abort", &[]).unwrap();
    assert_eq!(core.plan_step(1.0, &[a], &[], 1).unwrap_err(), Error::UnknownRequest { handle: a.0 });
    // The slot is reused, but the stale handle stays invalid.
    let b = add(&mut core, "b", 0.0, 4);
    assert_ne!(a, b);
    assert!(core.phase(a).is_err());
}

#[test]
fn step_outputs_fit_the_step_time_model() {
    let config = Config::from_json(r#"{"step_time": {"base_ms": 100, "per_prefill_token_ms": 1}}"#).unwrap();
    let mut core = engine_with(config);
    let a = add(&mut core, "a", 0.0, 16);
    let mut now = 0.0;
    for i in 0..400u32 {
        let plan = core.plan_step(now, &[a], &[], 100).unwrap();
        let tokens = 1 + (i * 37) % 500;
        let decodes = (i * 11) % 64;
        now += 2.0 + 0.01 * f64::from(tokens) + 0.05 * f64::from(decodes);
        let shape =
            StepShape { num_prefill_tokens: tokens, num_decode_requests: decodes, num_context_tokens: 0 };
        core.on_step_output(now, plan.step_id, shape).unwrap();
    }
    let c = core.step_time_coefficients();
    assert!((c.base_ms - 2.0).abs() < 0.5, "{c:?}");
    assert!((c.per_prefill_token_ms - 0.01).abs() < 2e-3, "{c:?}");
    assert!((c.per_decode_request_ms - 0.05).abs() < 1e-2, "{c:?}");
    assert_eq!(core.stats().num_step_samples, 400);
}

#[test]
fn ledger_and_class_counters_follow_the_request() {
    let mut core = engine();
    let a = add_class(&mut core, "a", 0.0, 8, Some("interactive"));
    core.on_tokens(100.0, a, &[WORD]).unwrap();
    core.on_tokens(110.0, a, &[END]).unwrap();
    core.on_tokens(120.0, a, &[WORD]).unwrap();
    core.on_tokens(130.0, a, &[WORD]).unwrap();
    let done = core.finish(130.0, a, "stop", &[]).unwrap();
    assert_eq!(done.metrics.ttft_ms, Some(100.0));
    assert_eq!(done.metrics.ttfat_ms, Some(120.0));
    assert_eq!(done.metrics.answer_tpot_ms, Some(10.0));
    assert!(done.attainment.all());
    let interactive = core.config().class_by_name("interactive").unwrap();
    assert_eq!(core.class_counters()[interactive.index()].num_met_all, 1);
    assert_eq!(core.num_requests(), 0);
}

#[test]
fn recent_ttfat_attainment_follows_completions_and_ignores_aborts() {
    let mut core = engine();
    let interactive = core.config().class_by_name("interactive").unwrap().index();
    assert_eq!(core.recent_ttfat_attainment()[interactive], None);
    let ttfat_ms = core.config().classes[interactive].targets.ttfat_ms;
    let run = |core: &mut Meridian, id: &str, answer_at_ms: f64, reason: &str| {
        let h = add_class(core, id, 0.0, 8, Some("interactive"));
        core.on_tokens(1.0, h, &[WORD, END]).unwrap();
        core.on_tokens(answer_at_ms, h, &[WORD]).unwrap();
        core.finish(answer_at_ms, h, reason, &[]).unwrap();
    };
    run(&mut core, "met", 1.0, "stop");
    assert_eq!(core.recent_ttfat_attainment()[interactive], Some(1.0), "the first completion starts it");
    run(&mut core, "missed", ttfat_ms * 2.0, "stop");
    let after_miss = core.recent_ttfat_attainment()[interactive].unwrap();
    assert!((after_miss - (1.0 - 1.0 / RECENT_ATTAINMENT_REQUESTS)).abs() < 1e-12, "{after_miss}");
    run(&mut core, "aborted", ttfat_ms * 2.0, "abort");
    assert_eq!(core.recent_ttfat_attainment()[interactive], Some(after_miss), "aborts do not count");
}

#[test]
fn probes_run_in_the_parents_class_and_stay_out_of_the_books() {
    let mut core = engine();
    let parent = add_class(&mut core, "p", 0.0, 8, Some("interactive"));
    core.on_tokens(1.0, parent, &[THINK, WORD, WORD]).unwrap();
    let before = core.stats();
    let probe = core.add_probe("p-probe-1", 2.0, &[5, 6, THINK, WORD, WORD, END], parent).unwrap();
    assert_eq!((core.is_probe(probe).unwrap(), core.is_probe(parent).unwrap()), (true, false));
    assert_eq!(core.num_live_probes(), 1);
    core.on_tokens(3.0, probe, &[WORD]).unwrap();
    assert_eq!(core.phase(probe).unwrap(), Phase::Answer, "the appended marker closed the reasoning");
    let done = core.finish(3.0, probe, "length", &[]).unwrap();
    assert!(done.probe, "the report says its output must not reach a client");
    assert_eq!(core.num_live_probes(), 0);
    assert!(core.is_probe(probe).is_err(), "a finished probe's handle is stale");
    assert_eq!(done.never_reusable_from_token, None, "the parent's reasoning blocks stay cached");
    let interactive = core.config().class_by_name("interactive").unwrap();
    assert_eq!(done.class, interactive);
    assert_eq!(core.class_counters()[interactive.index()], ClassCounters::default());
    assert_eq!(core.recent_ttfat_attainment()[interactive.index()], None);
    let after = core.stats();
    assert_eq!((after.num_added, after.num_finished), (before.num_added, before.num_finished));
    assert_eq!((after.num_probes, after.num_probe_prompt_tokens), (1, 6));
    let err = core.add_probe("q", 4.0, &[1], probe).unwrap_err();
    assert!(matches!(err, Error::UnknownRequest { .. }), "{err}");
}

// ---- property tests -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Add {
        prompt_len: usize,
        class: u8,
        open_think: bool,
    },
    Tokens {
        pick: usize,
        tokens: Vec<u32>,
    },
    Admit {
        pick: usize,
    },
    Plan {
        free_blocks: u32,
    },
    Preempt {
        pick: usize,
    },
    /// `reason` indexes [`WIRE_REASONS`]; the output list passed is the tokens seen so far
    /// (`shorter`: only half of them) plus `unseen`.
    Finish {
        pick: usize,
        reason: u8,
        unseen: Vec<u32>,
        shorter: bool,
    },
    Output {
        tokens: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..300, 0u8..4, any::<bool>()).prop_map(|(prompt_len, class, open_think)| Op::Add {
            prompt_len,
            class,
            open_think
        }),
        (any::<usize>(), prop::collection::vec(prop_oneof![Just(END), Just(TOOL), 4u32..50], 1..6))
            .prop_map(|(pick, tokens)| Op::Tokens { pick, tokens }),
        any::<usize>().prop_map(|pick| Op::Admit { pick }),
        (0u32..500).prop_map(|free_blocks| Op::Plan { free_blocks }),
        any::<usize>().prop_map(|pick| Op::Preempt { pick }),
        (
            any::<usize>(),
            0u8..WIRE_REASONS.len() as u8,
            prop::collection::vec(prop_oneof![Just(END), 4u32..50], 0..4),
            any::<bool>()
        )
            .prop_map(|(pick, reason, unseen, shorter)| Op::Finish { pick, reason, unseen, shorter }),
        (0u32..3000).prop_map(|tokens| Op::Output { tokens }),
    ]
}

/// vLLM's five finish reasons and two it does not have.
const WIRE_REASONS: [&str; 7] = ["stop", "length", "abort", "error", "repetition", "hallucination", "STOP"];

fn is_permutation(order: &[u32], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order.iter().all(|&i| (i as usize) < n && !std::mem::replace(&mut seen[i as usize], true))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_event_streams_keep_every_invariant(ops in prop::collection::vec(op(), 1..120), triage in 0usize..3) {
        // Default targets, or targets tight enough (milliseconds) that requests turn late within
        // the stream, with one class of each triage mode (under the defaults, and under least
        // slack with sheds only while the client would hear them by its TTFT target).
        let mut core = match triage {
            0 => engine(),
            1 => engine_with(Config::from_json(TIGHT_TRIAGE).unwrap()),
            _ => {
                let config = format!(r#"{{"overload": {{"waiting_order": "slack", "shed_until": "ttft"}}, {}"#, &TIGHT_TRIAGE[1..]);
                engine_with(Config::from_json(&config).unwrap())
            }
        };
        core.set_thinking_worker(true);
        let mut ended = HashSet::new();
        let mut running: Vec<ReqHandle> = Vec::new();
        let mut waiting: Vec<ReqHandle> = Vec::new();
        let mut phases: std::collections::HashMap<ReqHandle, Phase> = std::collections::HashMap::new();
        let mut now = 0.0;
        let mut next_id = 0;
        let mut last_step = None;
        for op in ops {
            now += 1.5;
            match op {
                Op::Add { prompt_len, class, open_think } => {
                    let mut prompt = vec![WORD; prompt_len];
                    if open_think { prompt.push(THINK); }
                    let class = ["interactive", "standard", "batch"].get(class as usize).copied();
                    let id = format!("r{next_id}");
                    next_id += 1;
                    let (h, resolved) = core.add_request(NewRequest {
                        req_id: &id, arrival_ms: now, prompt_token_ids: &prompt, max_tokens: 512,
                        slo_class: class, priority: 0, waited_ms: 0.0,
                    }).unwrap();
                    let expected = class.map_or(core.config().class_for_priority(0), |name| {
                        core.config().class_by_name(name).unwrap()
                    });
                    prop_assert_eq!(resolved, expected);
                    waiting.push(h);
                    phases.insert(h, Phase::Prefill);
                }
                Op::Admit { pick } if !waiting.is_empty() => {
                    running.push(waiting.remove(pick % waiting.len()));
                }
                Op::Tokens { pick, tokens } if !running.is_empty() => {
                    let h = running[pick % running.len()];
                    core.on_tokens(now, h, &tokens).unwrap();
                }
                Op::Plan { free_blocks } => {
                    let mut probe = core.clone();
                    let plan = core.plan_step(now, &running, &waiting, free_blocks).unwrap();
                    let again = probe.plan_step(now, &running, &waiting, free_blocks).unwrap();
                    prop_assert_eq!(&plan, &again, "plans are deterministic");
                    prop_assert!(is_permutation(&plan.running_order, running.len()));
                    prop_assert!(is_permutation(&plan.waiting_order, waiting.len()));
                    prop_assert!(plan.token_budget >= 1 && plan.token_budget <= limits().max_num_batched_tokens);
                    prop_assert!(plan.num_admissible as usize <= waiting.len());
                    // Answer-phase requests all precede thinking ones in the running order.
                    let first_non_answer = plan.running_order.iter()
                        .position(|&i| core.phase(running[i as usize]).unwrap() != Phase::Answer)
                        .unwrap_or(running.len());
                    prop_assert!(plan.running_order[first_non_answer..].iter()
                        .all(|&i| core.phase(running[i as usize]).unwrap() != Phase::Answer));
                    // Shed requests: each once, never answering, last in their order, never admitted;
                    // the shim ends each with vLLM's abort, and its report says it was shed.
                    let mut listed = HashSet::new();
                    let admitted: HashSet<u32> =
                        plan.waiting_order.iter().take(plan.num_admissible as usize).copied().collect();
                    let mut shed = Vec::new();
                    for s in &plan.shed {
                        let list = if s.running { &running } else { &waiting };
                        let h = list[s.index as usize];
                        prop_assert!(listed.insert(h), "listed twice");
                        prop_assert!(core.phase(h).unwrap() != Phase::Answer, "an answering request was shed");
                        prop_assert!(s.running || !admitted.contains(&s.index), "a shed request was admitted");
                        let order = if s.running { &plan.running_order } else { &plan.waiting_order };
                        let tail = &order[order.len() - plan.shed.iter().filter(|o| o.running == s.running).count()..];
                        prop_assert!(tail.contains(&s.index), "a shed request is not last in its order");
                        shed.push((h, s.reason));
                    }
                    // Ended thinking: running thinkers of the degrade class, each once.
                    for &i in &plan.end_thinking {
                        let h = running[i as usize];
                        prop_assert_eq!(core.phase(h).unwrap(), Phase::Think);
                        prop_assert!(ended.insert(h), "a thinking ended twice");
                    }
                    running = plan.running_order.iter().map(|&i| running[i as usize]).collect();
                    waiting = plan.waiting_order.iter().map(|&i| waiting[i as usize]).collect();
                    last_step = Some(plan.step_id);
                    for (h, reason) in shed {
                        running.retain(|&r| r != h);
                        waiting.retain(|&r| r != h);
                        let done = core.finish(now, h, "abort", &[]).unwrap();
                        prop_assert_eq!(done.shed, Some(reason));
                        phases.remove(&h);
                    }
                }
                Op::Preempt { pick } if !running.is_empty() => {
                    let h = running.remove(pick % running.len());
                    core.on_preempted(now, h).unwrap();
                    waiting.insert(0, h);
                }
                Op::Finish { pick, reason, unseen, shorter } if !running.is_empty() || !waiting.is_empty() => {
                    let total = running.len() + waiting.len();
                    let i = pick % total;
                    let h = if i < running.len() { running.remove(i) } else { waiting.remove(i - running.len()) };
                    let wire = WIRE_REASONS[reason as usize];
                    let num_seen = core.num_output_tokens(h).unwrap() as usize;
                    let mut output = vec![WORD; num_seen];
                    if shorter { output.truncate(num_seen / 2) } else { output.extend(&unseen) }
                    let before = core.stats();
                    let done = core.finish(now, h, wire, &output).unwrap();
                    let after = core.stats();
                    let expected_total = if shorter { num_seen } else { num_seen + unseen.len() };
                    prop_assert_eq!(
                        (done.ledger.num_think_tokens + done.ledger.num_answer_tokens) as usize,
                        expected_total,
                        "the unseen tail is fed, a shorter list feeds nothing"
                    );
                    prop_assert_eq!(after.num_finished, before.num_finished + 1);
                    match FinishReason::from_vllm(wire) {
                        Some(known) => {
                            prop_assert_eq!(done.reason, known);
                            prop_assert_eq!(done.unknown_finish_reason, None);
                            prop_assert_eq!(after.num_unknown_finish_reasons, before.num_unknown_finish_reasons);
                        }
                        None => {
                            prop_assert_eq!(done.reason, FinishReason::Error);
                            prop_assert_eq!(done.unknown_finish_reason.as_deref(), Some(wire));
                            prop_assert_eq!(after.num_unknown_finish_reasons, before.num_unknown_finish_reasons + 1);
                        }
                    }
                    let m = done.metrics;
                    for v in [m.ttft_ms, m.ttfat_ms, m.answer_tpot_ms, m.think_tpot_ms, m.e2e_ms].into_iter().flatten() {
                        prop_assert!(v.is_finite() && v >= 0.0);
                    }
                    phases.remove(&h);
                    prop_assert!(core.phase(h).is_err());
                }
                Op::Output { tokens } => {
                    if let Some(step) = last_step.take() {
                        let shape = StepShape { num_prefill_tokens: tokens, ..StepShape::default() };
                        core.on_step_output(now, step, shape).unwrap();
                    }
                }
                _ => {}
            }
            // No request lost or duplicated; phases only move forward.
            prop_assert_eq!(core.num_requests(), running.len() + waiting.len());
            for (h, seen) in phases.iter_mut() {
                let phase = core.phase(*h).unwrap();
                prop_assert!(phase >= *seen, "phase went back from {:?} to {:?}", seen, phase);
                *seen = phase;
            }
        }
    }
}

/// The default classes with `on_overload: queue`: late requests wait (the tail rule) instead of
/// being shed.
const QUEUEING_CLASSES: &str = r#"{
    "interactive": {"ttft_ms": 1000, "ttfat_ms": 15000, "answer_tpot_ms": 50, "rank": 0, "on_overload": "queue"},
    "standard": {"ttft_ms": 3000, "ttfat_ms": 60000, "answer_tpot_ms": 100, "rank": 1, "on_overload": "queue"},
    "batch": {"ttft_ms": 60000, "ttfat_ms": 1800000, "answer_tpot_ms": 1000, "rank": 2, "on_overload": "queue"}}"#;

/// Targets in milliseconds (requests turn late within a short event stream), one class per
/// triage mode.
const TIGHT_TRIAGE: &str = r#"{"classes": {
    "interactive": {"ttft_ms": 4, "ttfat_ms": 40, "answer_tpot_ms": 50, "rank": 0, "on_overload": "shed"},
    "standard": {"ttft_ms": 10, "ttfat_ms": 90, "answer_tpot_ms": 100, "rank": 1, "on_overload": "degrade"},
    "batch": {"ttft_ms": 30, "ttfat_ms": 300, "answer_tpot_ms": 1000, "rank": 2, "on_overload": "queue"}}}"#;

#[test]
fn replanning_an_unchanged_state_keeps_the_order() {
    let mut core = engine();
    let mut running = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..300u32 {
        let class = ["interactive", "standard", "batch"][i as usize % 3];
        let h =
            add_class(&mut core, &format!("r{i}"), f64::from(i), 16 + (i as usize * 7) % 200, Some(class));
        if i % 2 == 0 {
            think(&mut core, f64::from(i) + 1.0, h, 1 + (i as usize * 13) % 300);
            if i % 3 == 0 {
                core.on_tokens(f64::from(i) + 2.0, h, &[END, WORD]).unwrap();
            }
            running.push(h);
        } else {
            waiting.push(h);
        }
    }
    let plan = core.plan_step(500.0, &running, &waiting, 10_000).unwrap();
    let running: Vec<_> = plan.running_order.iter().map(|&i| running[i as usize]).collect();
    let waiting: Vec<_> = plan.waiting_order.iter().map(|&i| waiting[i as usize]).collect();
    let again = core.plan_step(500.0, &running, &waiting, 10_000).unwrap();
    assert!(again.running_order.iter().enumerate().all(|(i, &j)| i as u32 == j), "running order flapped");
    assert!(again.waiting_order.iter().enumerate().all(|(i, &j)| i as u32 == j), "waiting order flapped");
}

fn engine_with_policy(policy: &str) -> Meridian {
    engine_with(Config::from_json(&format!(r#"{{"policy": "{policy}"}}"#)).unwrap())
}

#[test]
fn unknown_policy_is_rejected_by_name() {
    let err = Config::from_json(r#"{"policy": "sjf"}"#).unwrap_err().to_string();
    assert!(err.contains("policy") && err.contains("sjf"), "{err}");
}

#[test]
fn answer_first_ablation_orders_by_phase_then_arrival_and_leaves_the_rest_to_vllm() {
    let mut core = engine_with_policy("answer_first");
    let a = add(&mut core, "a", 0.0, 32);
    let b = add(&mut core, "b", 1.0, 32);
    let c = add(&mut core, "c", 2.0, 32);
    let w = add(&mut core, "w", 3.0, 64);
    think(&mut core, 10.0, a, 3000);
    think(&mut core, 10.0, b, 5);
    think(&mut core, 10.0, c, 5);
    core.on_tokens(10.0, c, &[END, WORD]).unwrap();
    let plan = core.plan_step(20.0, &[a, b, c], &[w], 0).unwrap();
    assert_eq!(plan.running_order, vec![2, 0, 1], "answering first, then first come first served");
    assert_eq!(plan.token_budget, limits().max_num_batched_tokens);
    assert_eq!(plan.num_admissible, 1, "no reserve: vLLM's own KV check decides");
    assert!(plan.held.is_empty());
    let done = core.finish(30.0, c, "stop", &[]).unwrap();
    assert_eq!(done.never_reusable_from_token, None, "no eviction tiers in the ablation");
}

#[test]
fn pascal_runs_reasoning_first_and_paces_answers_at_their_tpot_target() {
    let mut core = engine_with_policy("pascal");
    let thinking = add(&mut core, "thinking", 0.0, 32);
    let fresh_answer = add(&mut core, "fresh", 0.0, 32);
    let paced = add(&mut core, "paced", 0.0, 32);
    think(&mut core, 10.0, thinking, 5);
    think(&mut core, 10.0, fresh_answer, 5);
    core.on_tokens(10.0, fresh_answer, &[END]).unwrap();
    think(&mut core, 15.0, paced, 5);
    core.on_tokens(15.0, paced, &[END, WORD]).unwrap();
    // The standard class paces answers at 100 ms × 0.9 headroom: at 20 ms the answer that just
    // emitted a token waits; the one that has not shown its first answer token never does.
    let plan = core.plan_step(20.0, &[paced, fresh_answer, thinking], &[], 1000).unwrap();
    assert_eq!(plan.running_order[0], 2, "reasoning leads");
    assert_eq!(plan.held, vec![0], "only the answer that is ahead of its pace skips the step");
    assert_eq!(*plan.running_order.last().unwrap(), 0, "the answer served most recently is the victim");
    let later = core.plan_step(200.0, &[paced, fresh_answer, thinking], &[], 1000).unwrap();
    assert!(later.held.is_empty(), "once its pace is due it runs");
}

#[test]
fn pascal_preempting_an_answer_is_its_policy_not_an_alarm() {
    let mut core = engine_with_policy("pascal");
    let a = add(&mut core, "a", 0.0, 16);
    let t = add(&mut core, "t", 0.0, 16);
    core.on_tokens(1.0, a, &[END, WORD]).unwrap();
    think(&mut core, 1.0, t, 1);
    core.plan_step(2.0, &[t, a], &[], 10).unwrap();
    let preemption = core.on_preempted(2.0, a).unwrap();
    assert_eq!(preemption.phase, Phase::Answer);
    assert!(!preemption.alarm);
}

// ---- one crossing per event: class, finish reason, unseen tokens, step duration --------------

fn new_request<'a>(req_id: &'a str, slo_class: Option<&'a str>, priority: i64) -> NewRequest<'a> {
    NewRequest {
        req_id,
        arrival_ms: 0.0,
        prompt_token_ids: &[WORD, THINK],
        max_tokens: 64,
        slo_class,
        priority,
        waited_ms: 0.0,
    }
}

#[test]
fn add_request_returns_the_class_it_resolved() {
    let mut core = engine();
    let id = |name| core.config().class_by_name(name).unwrap();
    let (interactive, standard, batch) = (id("interactive"), id("standard"), id("batch"));
    let (_, by_name) = core.add_request(new_request("named", Some("batch"), -5)).unwrap();
    assert_eq!(by_name, batch, "a named class wins over the priority");
    let (_, high) = core.add_request(new_request("high", None, -1)).unwrap();
    assert_eq!(high, interactive);
    let (_, low) = core.add_request(new_request("low", None, 9)).unwrap();
    assert_eq!(low, batch);
    let (h, default) = core.add_request(new_request("default", None, 0)).unwrap();
    assert_eq!(default, standard);
    assert_eq!(core.finish(1.0, h, "stop", &[]).unwrap().class, standard, "the class it keeps");
    // A class that is not configured: nothing is tracked.
    let err = core.add_request(new_request("gold", Some("gold"), 0)).unwrap_err();
    assert!(matches!(&err, Error::UnknownSloClass { name, .. } if name == "gold"), "{err}");
    // A hostile one is shown cut short: the log line it makes stays a line.
    let hostile = "x".repeat(1 << 20);
    let err = core.add_request(new_request("hostile", Some(&hostile), 0)).unwrap_err();
    assert!(err.to_string().len() < 300 && err.to_string().contains("(1048576 bytes)"), "{err}");
    assert_eq!((core.num_requests(), core.stats().num_added), (3, 4));
    assert_eq!(core.handle_of("gold"), None);
}

#[test]
fn an_unknown_finish_reason_releases_the_request_as_an_error_and_learns_nothing() {
    let mut core = engine();
    let (h, class) = core.add_request(new_request("a", None, 0)).unwrap();
    core.on_tokens(1.0, h, &[WORD, WORD, END, WORD, WORD]).unwrap();
    let (think_len, answer_len) =
        (core.lengths[class.index()].think.clone(), core.lengths[class.index()].answer.clone());
    let done = core.finish(2.0, h, "hallucination", &[]).unwrap();
    assert_eq!(done.reason, FinishReason::Error);
    assert_eq!(done.unknown_finish_reason.as_deref(), Some("hallucination"));
    assert_eq!((core.num_requests(), core.handle_of("a")), (0, None), "released");
    assert!(core.phase(h).is_err());
    let stats = core.stats();
    assert_eq!((stats.num_finished, stats.num_unknown_finish_reasons), (1, 1));
    assert_eq!(core.class_counters()[class.index()].num_aborted, 1, "counted as an error");
    assert_eq!(core.lengths[class.index()].think, think_len, "the thinking predictor learnt nothing");
    assert_eq!(core.lengths[class.index()].answer, answer_len, "the answer predictor learnt nothing");
    assert_eq!(done.never_reusable_from_token, Some(1), "its reasoning blocks go as an error's do");

    // The same request finished with vLLM's "error" teaches the thinking predictor (the thinking
    // did end) but not the answer one; "stop" teaches both.
    for (wire, learns_answer) in [("error", false), ("stop", true)] {
        let (h, class) = core.add_request(new_request(wire, None, 0)).unwrap();
        core.on_tokens(1.0, h, &[WORD, WORD, END, WORD, WORD]).unwrap();
        let lengths = &core.lengths[class.index()];
        let (think_len, answer_len) = (lengths.think.clone(), lengths.answer.clone());
        let done = core.finish(2.0, h, wire, &[]).unwrap();
        assert_eq!(done.unknown_finish_reason, None);
        let lengths = &core.lengths[class.index()];
        assert_ne!(lengths.think, think_len, "{wire}");
        assert_eq!(lengths.answer != answer_len, learns_answer, "{wire}");
    }
    assert_eq!(core.stats().num_unknown_finish_reasons, 1);
}

#[test]
fn finish_reasons_are_vllms_names_exactly() {
    let mut core = engine();
    for (wire, reason) in [
        ("stop", FinishReason::Stopped),
        ("length", FinishReason::Length),
        ("abort", FinishReason::Aborted),
        ("error", FinishReason::Error),
    ] {
        let (h, _) = core.add_request(new_request(wire, None, 0)).unwrap();
        let done = core.finish(1.0, h, wire, &[]).unwrap();
        assert_eq!((done.reason, done.unknown_finish_reason), (reason, None), "{wire}");
    }
    for other in ["stopped", "Stop", "FinishReason.STOP", ""] {
        let (h, _) = core.add_request(new_request(other, None, 0)).unwrap();
        let done = core.finish(1.0, h, other, &[]).unwrap();
        assert_eq!(done.reason, FinishReason::Error);
        assert_eq!(done.unknown_finish_reason.as_deref(), Some(other));
    }
    assert_eq!(core.stats().num_unknown_finish_reasons, 4);
}

#[test]
fn finish_feeds_the_output_tokens_the_core_has_not_seen() {
    let mut core = engine();
    let (h, _) = core.add_request(new_request("a", None, 0)).unwrap();
    core.on_tokens(10.0, h, &[WORD, WORD]).unwrap();
    assert_eq!(core.phase(h).unwrap(), Phase::Think);
    // The full list as vLLM holds it: the two seen, then the end marker and an answer token.
    let done = core.finish(20.0, h, "stop", &[WORD, WORD, END, WORD]).unwrap();
    assert_eq!((done.ledger.num_think_tokens, done.ledger.num_answer_tokens), (3, 1));
    assert_eq!(done.ledger.reasoning_end_ms, Some(20.0), "fed at now_ms");
    assert_eq!(done.metrics.ttfat_ms, Some(20.0));

    // A list no longer than what was seen feeds nothing (and is no error).
    for output in [&[][..], &[WORD][..], &[WORD, END][..]] {
        let (h, _) = core.add_request(new_request("b", None, 0)).unwrap();
        core.on_tokens(10.0, h, &[WORD, WORD]).unwrap();
        let done = core.finish(20.0, h, "stop", output).unwrap();
        assert_eq!((done.ledger.num_think_tokens, done.ledger.num_answer_tokens), (2, 0), "{output:?}");
    }

    // Bad input fails before anything changes: the request stays live with what it had.
    let (h, _) = core.add_request(new_request("c", None, 0)).unwrap();
    let err = core.finish(f64::NAN, h, "stop", &[WORD, END]).unwrap_err();
    assert!(err.to_string().contains("now_ms"), "{err}");
    assert_eq!(core.num_output_tokens(h).unwrap(), 0);
    let stale = ReqHandle(h.0 + (1 << 32));
    assert_eq!(
        core.finish(1.0, stale, "stop", &[WORD]).unwrap_err(),
        Error::UnknownRequest { handle: stale.0 }
    );
    assert_eq!(core.handle_of("c"), Some(h));
}

#[test]
fn under_synchronous_scheduling_a_busy_engines_step_runs_from_the_previous_output() {
    let mut core = engine();
    let a = add(&mut core, "a", 0.0, 16);
    let decode = StepShape { num_decode_requests: 1, ..StepShape::default() };
    let p0 = core.plan_step(10.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(20.0, p0.step_id, decode).unwrap(), Some(10.0));
    // Scheduled 4 ms after that output (the engine's own work between steps): 14 ms, not 10.
    let p1 = core.plan_step(24.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(34.0, p1.step_id, decode).unwrap(), Some(14.0));
    // An engine left with no request idles until the next arrives: from the schedule again.
    core.finish(35.0, a, "stop", &[]).unwrap();
    let p2 = core.plan_step(36.0, &[], &[], 100).unwrap();
    assert_eq!(core.on_step_output(37.0, p2.step_id, StepShape::default()).unwrap(), None);
    let b = add(&mut core, "b", 500.0, 16);
    let p3 = core.plan_step(500.0, &[b], &[], 100).unwrap();
    assert_eq!(core.on_step_output(510.0, p3.step_id, decode).unwrap(), Some(10.0), "not from 37");
}

#[test]
fn on_step_output_returns_the_duration_it_measured() {
    let mut core = engine();
    let a = add(&mut core, "a", 0.0, 16);
    let decode = StepShape { num_decode_requests: 1, ..StepShape::default() };
    // First step: started when it was scheduled.
    let p0 = core.plan_step(10.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(25.0, p0.step_id, decode).unwrap(), Some(15.0));
    // Scheduled before the previous output arrived (async scheduling): started at that output.
    let p1 = core.plan_step(20.0, &[a], &[], 100).unwrap();
    let p2 = core.plan_step(30.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(32.0, p1.step_id, decode).unwrap(), Some(7.0), "from the output at 25");
    assert_eq!(core.on_step_output(40.0, p2.step_id, decode).unwrap(), Some(8.0), "from the output at 32");
    assert_eq!(core.stats().num_step_samples, 3);
    // A step that executed nothing, an unknown step, a step already met and a negative duration
    // are not measured.
    let p3 = core.plan_step(50.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(60.0, p3.step_id, StepShape::default()).unwrap(), None);
    assert_eq!(core.on_step_output(61.0, 999, decode).unwrap(), None);
    assert_eq!(core.on_step_output(62.0, p2.step_id, decode).unwrap(), None);
    let p4 = core.plan_step(70.0, &[a], &[], 100).unwrap();
    assert_eq!(core.on_step_output(65.0, p4.step_id, decode).unwrap(), None, "output before its start");
    assert_eq!(core.stats().num_step_samples, 3);
    assert!(core.on_step_output(f64::INFINITY, p4.step_id, decode).is_err());
}

proptest! {
    #[test]
    fn on_step_output_returns_some_exactly_when_it_samples(
        steps in prop::collection::vec((0.0f64..20.0, -5.0f64..20.0, any::<bool>(), 0u64..3), 1..40),
    ) {
        let mut core = engine();
        let a = add(&mut core, "a", 0.0, 16);
        let mut now = 0.0f64;
        let mut last_out: Option<f64> = None;
        for (gap, run, executed, skew) in steps {
            now += gap;
            let plan = core.plan_step(now, &[a], &[], 100).unwrap();
            let shape = StepShape { num_decode_requests: u32::from(executed), ..StepShape::default() };
            let out_ms = (now + run).max(0.0);
            let before = core.stats().num_step_samples;
            let measured = core.on_step_output(out_ms, plan.step_id + skew, shape).unwrap();
            let sampled = core.stats().num_step_samples - before;
            prop_assert_eq!(sampled, u64::from(measured.is_some()));
            if let Some(ms) = measured {
                // A step starts at the previous output (the engine holds a request throughout),
                // or at its schedule for the first: never earlier.
                let start = last_out.unwrap_or(now);
                prop_assert!(ms.is_finite() && ms >= 0.0 && ms <= out_ms - start.min(now) + 1e-9, "{}", ms);
                prop_assert!(out_ms >= now, "no step ends before it was scheduled");
            }
            last_out = Some(out_ms);
        }
    }
}

#[test]
fn each_class_learns_its_own_lengths_and_the_answer_reserve_follows() {
    // A server whose interactive answers are ~20 tokens (the prior's median is ~200): after 200
    // completions the class's reserve for a fresh answer is a block or two, not the prior's
    // ten; the standard class, which saw nothing, keeps the prior.
    let mut core = engine();
    let interactive = core.config().class_by_name("interactive").unwrap();
    let standard = core.config().class_by_name("standard").unwrap();
    let reserve_for = |core: &mut Meridian, class: &str| {
        let (h, _) = core.add_request(new_request("probe-reserve", Some(class), 0)).unwrap();
        core.on_tokens(1.0, h, &[END, WORD]).unwrap();
        let plan = core.plan_step(2.0, &[h], &[], 1000).unwrap();
        core.finish(3.0, h, "abort", &[]).unwrap();
        plan.num_reserved_blocks
    };
    let before = reserve_for(&mut core, "interactive");
    for i in 0..200 {
        let (h, _) = core.add_request(new_request(&format!("r{i}"), Some("interactive"), 0)).unwrap();
        let mut tokens = vec![WORD; 30];
        tokens.push(END);
        tokens.extend(std::iter::repeat_n(WORD, 18 + i % 5));
        core.on_tokens(1.0, h, &tokens).unwrap();
        core.finish(2.0, h, "stop", &[]).unwrap();
    }
    core.plan_step(3.0, &[], &[], 1000).unwrap();
    let answer = &core.lengths[interactive.index()].answer;
    let median = answer.remaining_quantile(0, Quantile::P50) + 1.0;
    assert!((15.0..30.0).contains(&median), "interactive answer median {median}");
    let after = reserve_for(&mut core, "interactive");
    assert!(after < before, "the reserve follows the learnt answers: {before} -> {after} blocks");
    assert_eq!(
        core.lengths[standard.index()].answer.total_weight(),
        ResidualLength::new(&[1]).total_weight()
    );
    assert_eq!(reserve_for(&mut core, "standard"), before, "the other class kept the prior");
}

#[test]
fn a_late_waiting_request_yields_to_on_time_ones_only_up_to_its_class_bound() {
    // Default classes: interactive TTFT 1 s; factor 3 → a late interactive request waits behind
    // on-time requests of every class for at most 3 s, then goes ahead of every new one.
    let config = format!(r#"{{"late_wait_ttft_factor": 3, "aging_ms": 1e9, "classes": {QUEUEING_CLASSES}}}"#);
    let mut core = engine_with_seats(&config, 256);
    let late = add_class(&mut core, "late", 0.0, 16, Some("interactive"));
    // At 1.5 s `late` can no longer make its 1 s TTFT; a fresh batch request still can.
    let on_time = add_class(&mut core, "on-time", 1_400.0, 16, Some("batch"));
    let plan = core.plan_step(1_500.0, &[], &[late, on_time], 1000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 0], "late, so behind a lower class that can still make it");
    // Two late requests: the one nearer its bound first.
    let later = add_class(&mut core, "later", 1_000.0, 16, Some("interactive"));
    let plan = core.plan_step(2_500.0, &[], &[later, on_time, late], 1000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 2, 0]);
    // Past 3 s of waiting it is ahead of every new request, whatever its class.
    let fresh = add_class(&mut core, "fresh", 3_100.0, 16, Some("interactive"));
    let plan = core.plan_step(3_100.0, &[], &[fresh, on_time, late], 1000).unwrap();
    assert_eq!(plan.waiting_order[0], 2, "the bound lifts it");
}

#[test]
fn the_tail_and_predictor_keys_are_validated() {
    for (json, key) in [
        (r#"{"late_wait_ttft_factor": 0}"#, "late_wait_ttft_factor"),
        (r#"{"predictor": {"prior_weight": -1}}"#, "predictor.prior_weight"),
        (r#"{"predictor": {"memory_requests": 0.5}}"#, "predictor.memory_requests"),
        (r#"{"predictor": {"prior_memory_requests": 0}}"#, "predictor.prior_memory_requests"),
    ] {
        let err = Config::from_json(json).unwrap_err().to_string();
        assert!(err.contains(&format!("`{key}`")), "{json}: {err}");
    }
    assert!(Config::from_json(r#"{"predictor": {"prior_weigth": 3}}"#).is_err(), "unknown keys are refused");
    let c = Config::from_json(
        r#"{"predictor": {"prior_weight": 3, "memory_requests": 500, "prior_memory_requests": 20}}"#,
    )
    .unwrap();
    assert_eq!(
        (c.predictor.prior_weight, c.predictor.memory_requests, c.predictor.prior_memory_requests),
        (3.0, 500.0, Some(20.0))
    );
    assert_eq!(Config::from_json("{}").unwrap().predictor.prior_memory_requests, None, "off by default");
}

fn engine_with_seats(config: &str, max_num_seqs: u32) -> Meridian {
    let limits = EngineLimits::new(16, 8192, max_num_seqs);
    let markers = ReasoningMarkers::new(vec![THINK], vec![END], vec![vec![TOOL]]);
    Meridian::new(Config::from_json(config).unwrap(), limits, markers).unwrap()
}

#[test]
fn a_waiting_request_of_a_higher_class_preempts_lower_class_thinking_on_arrival() {
    // Two seats, both held by thinking batch requests; an interactive request (TTFT 1 s) waits.
    let mut core = engine_with_seats("{}", 2);
    // Same thinking so far, so the same slack; `long` would cost a 3,000-token recompute.
    let old = add_class(&mut core, "long", 0.0, 3000, Some("batch"));
    let young = add_class(&mut core, "short", 0.0, 16, Some("batch"));
    think(&mut core, 10.0, old, 10);
    think(&mut core, 10.0, young, 10);
    let urgent = add_class(&mut core, "urgent", 100.0, 16, Some("interactive"));
    let plan = core.plan_step(400.0, &[old, young], &[urgent], 1000).unwrap();
    assert!(plan.preempt.is_empty(), "within half its TTFT target it waits for a seat");
    assert_eq!(plan.num_admissible, 0);
    let plan = core.plan_step(700.0, &[old, young], &[urgent], 1000).unwrap();
    // `short` has the most slack net of recompute.
    assert_eq!(plan.preempt, vec![1], "one victim frees the seat");
    assert_eq!(plan.num_admissible, 1, "the seat it frees admits the waiting request");
    assert_eq!(core.stats().num_arrival_preemptions, 1);
    let by_class: Vec<u64> = core.class_counters().iter().map(|c| c.num_arrival_preemptions).collect();
    assert_eq!(by_class, vec![0, 0, 1], "counted against the victim's class (batch)");
    // The shim preempts it; vLLM reports it; it is not preempted on arrival again within 10 s.
    core.on_preempted(700.0, young).unwrap();
    // Readmitted beside the interactive request, it is spared while it rests, and `long` yields.
    think(&mut core, 800.0, young, 1);
    let urgent2 = add_class(&mut core, "urgent2", 700.0, 16, Some("interactive"));
    let plan = core.plan_step(1_300.0, &[urgent, young], &[urgent2], 1000).unwrap();
    assert!(plan.preempt.is_empty(), "the only lower-class request was preempted on arrival 0.6 s ago");
    let plan = core.plan_step(1_300.0, &[old, young], &[urgent2], 1000).unwrap();
    assert_eq!(plan.preempt, vec![0], "`long` yields; the rested `short` does not");
}

#[test]
fn an_arrival_victim_whose_kv_a_tier_holds_costs_only_its_load() {
    // As above, but `long`'s 3,000 tokens are in a host tier that loads them at 0.0001 ms a
    // token (a 0.3 ms load against a 84 ms recompute): preempting it now costs less than
    // preempting `short`, whose 16 tokens no tier holds.
    let mut core = engine_with_seats(r#"{"kv_tier": {"load_ms_per_token": 0.0001, "online_fit": false}}"#, 2);
    let host = core.add_kv_tier("host", false).unwrap();
    let old = add_class(&mut core, "long", 0.0, 3000, Some("batch"));
    let young = add_class(&mut core, "short", 0.0, 16, Some("batch"));
    think(&mut core, 10.0, old, 10);
    think(&mut core, 10.0, young, 10);
    core.on_kv_stored(old, host, 3000).unwrap();
    let urgent = add_class(&mut core, "urgent", 100.0, 16, Some("interactive"));
    let plan = core.plan_step(700.0, &[old, young], &[urgent], 1000).unwrap();
    assert_eq!(plan.preempt, vec![0], "the stored one yields");
}

#[test]
fn arrival_preemption_spares_answers_equals_and_the_disabled() {
    // Answering lower-class requests are never preempted on arrival.
    let mut core = engine_with_seats("{}", 1);
    let answering = add_class(&mut core, "answering", 0.0, 16, Some("batch"));
    core.on_tokens(5.0, answering, &[WORD, END, WORD]).unwrap();
    let urgent = add_class(&mut core, "urgent", 0.0, 16, Some("interactive"));
    assert!(core.plan_step(900.0, &[answering], &[urgent], 1000).unwrap().preempt.is_empty());
    // Same class: no preemption.
    let mut core = engine_with_seats("{}", 1);
    let peer = add_class(&mut core, "peer", 0.0, 16, Some("interactive"));
    think(&mut core, 5.0, peer, 3);
    let urgent = add_class(&mut core, "urgent", 0.0, 16, Some("interactive"));
    assert!(core.plan_step(900.0, &[peer], &[urgent], 1000).unwrap().preempt.is_empty());
    // Disabled.
    let mut core = engine_with_seats(r#"{"arrival_preemption": {"enabled": false}}"#, 1);
    let low = add_class(&mut core, "low", 0.0, 16, Some("batch"));
    think(&mut core, 5.0, low, 3);
    let urgent = add_class(&mut core, "urgent", 0.0, 16, Some("interactive"));
    assert!(core.plan_step(900.0, &[low], &[urgent], 1000).unwrap().preempt.is_empty());
    // Not enough room even with every allowed victim: nothing is wasted.
    let mut core = engine_with_seats(r#"{"arrival_preemption": {"max_per_step": 1}}"#, 8);
    let low = add_class(&mut core, "low", 0.0, 16, Some("batch"));
    think(&mut core, 5.0, low, 3);
    let big = add_class(&mut core, "big", 0.0, 4000, Some("interactive"));
    assert!(core.plan_step(900.0, &[low], &[big], 10).unwrap().preempt.is_empty());
}

// ---- the running side's tail rule and the published baselines --------------------------------

#[test]
fn a_late_thinker_yields_to_prompt_chunks_until_its_class_bound_then_decodes_ahead_of_them() {
    let mut core = engine_with(Config::from_json(r#"{"late_think_ttfat_factor": 1}"#).unwrap());
    // Interactive: TTFAT target 15 s, so the bound is (1 + 1) × 15 s = 30 s after arrival.
    let late = add_class(&mut core, "late", 0.0, 16, Some("interactive"));
    think(&mut core, 1_000.0, late, 3);
    let prompt_at = |core: &mut Meridian, id: &str, now_ms: f64| add(core, id, now_ms - 1.0, 512);
    let fresh = prompt_at(&mut core, "fresh", 20_000.0);
    let plan = core.plan_step(20_000.0, &[late, fresh], &[], 1000).unwrap();
    assert_eq!(plan.running_order, vec![1, 0], "20 s in: late, so the prompt chunk goes first");
    let fresher = prompt_at(&mut core, "fresher", 31_000.0);
    let plan = core.plan_step(31_000.0, &[late, fresher], &[], 1000).unwrap();
    assert_eq!(plan.running_order, vec![0, 1], "31 s in: past its bound, its decode leads the chunk");
    // The default, factor 0: a late decode never yields.
    let mut core = engine();
    let late = add_class(&mut core, "late", 0.0, 16, Some("interactive"));
    think(&mut core, 1_000.0, late, 3);
    let fresh = prompt_at(&mut core, "fresh", 20_000.0);
    let plan = core.plan_step(20_000.0, &[late, fresh], &[], 1000).unwrap();
    assert_eq!(plan.running_order, vec![0, 1], "factor 0: a late decode never yields");
}

#[test]
fn uniboost_pushes_arrival_back_by_known_work_at_gamma() {
    // γ = 1,000 tokens/s (the default): one token of prompt or output = 1 ms of arrival.
    let mut core = engine_with_policy("uniboost");
    let big = add(&mut core, "big", 0.0, 5_000); // key 0 + 5000 = 5000 ms
    let small = add(&mut core, "small", 1_000.0, 100); // key 1000 + 100 = 1100 ms
    let tiny = add(&mut core, "tiny", 2_000.0, 16); // key 2000 + 16 = 2016 ms
    let plan = core.plan_step(2_500.0, &[], &[big, small, tiny], 10_000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 2, 0]);
    assert_eq!(plan.num_admissible, 3, "vLLM's own admission");
    assert_eq!(plan.token_budget, limits().max_num_batched_tokens, "vLLM's own budget");
    // Running: the request that has produced 3,000 tokens (key 16 + 3000 = 3016 ms) goes behind
    // the later one with 5 (500 + 21 = 521 ms) and is the preemption victim, the most blocks freed.
    let long = add(&mut core, "long", 0.0, 16);
    let short = add(&mut core, "short", 500.0, 16);
    think(&mut core, 2_600.0, long, 3_000);
    think(&mut core, 2_600.0, short, 5);
    let plan = core.plan_step(2_700.0, &[long, short], &[], 10_000).unwrap();
    assert_eq!(plan.running_order, vec![1, 0]);
    // γ → ∞ is first come first served.
    let config = Config::from_json(r#"{"policy": "uniboost", "uniboost_gamma_tokens_per_s": 1e12}"#).unwrap();
    let mut fcfs = engine_with(config);
    let handles = [add(&mut fcfs, "big", 0.0, 5_000), add(&mut fcfs, "small", 1_000.0, 100)];
    assert_eq!(fcfs.plan_step(2_500.0, &[], &handles, 10_000).unwrap().waiting_order, vec![0, 1]);
    let err = Config::from_json(r#"{"uniboost_gamma_tokens_per_s": 0}"#).unwrap_err().to_string();
    assert!(err.contains("uniboost_gamma_tokens_per_s") && err.contains('0'), "{err}");
}

#[test]
fn scorpio_orders_by_ttft_deadline_and_queues_the_unattainable_last() {
    let mut core = engine_with_policy("scorpio");
    // TTFT targets: interactive 1 s, standard 3 s. Prefill of 16 tokens ≈ 5.5 + 0.45 ms.
    let standard = add(&mut core, "standard", 0.0, 16); // deadline 3,000 ms
    let inter = add_class(&mut core, "inter", 500.0, 16, Some("interactive")); // deadline 1,500
    let lost = add_class(&mut core, "lost", 0.0, 16, Some("interactive")); // deadline 1,000 < now
    let plan = core.plan_step(1_200.0, &[], &[standard, inter, lost], 10_000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 0, 2]);
    // A preempted request resumes first, as in vLLM; running requests are first come first served.
    let victim = add(&mut core, "victim", 100.0, 16);
    let first = add(&mut core, "first", 50.0, 16);
    think(&mut core, 1_100.0, victim, 2);
    think(&mut core, 1_100.0, first, 2);
    let plan = core.plan_step(1_200.0, &[victim, first], &[], 10_000).unwrap();
    assert_eq!(plan.running_order, vec![1, 0]);
    core.on_preempted(1_200.0, victim).unwrap();
    let plan = core.plan_step(1_300.0, &[first], &[standard, inter, victim], 10_000).unwrap();
    assert_eq!(plan.waiting_order[0], 2);
}

#[test]
fn scorpio_admits_up_to_the_virtual_batch_size_the_tightest_tpot_allows() {
    let mut core = engine_with_policy("scorpio");
    // Seed step model: 5.5 ms + 0.005 ms per decoding request + 3.8e-5 ms per context token.
    // Interactive TPOT target 50 ms × 0.9 headroom = 45 ms. Each 200,000-token prompt adds
    // 7.6 ms of context: five make 5.5 + 0.025 + 38.0 = 43.5 ms (fits), six 51.1 ms (does not).
    let waiting: Vec<_> = (0..7)
        .map(|i| add_class(&mut core, &format!("r{i}"), f64::from(i), 200_000, Some("interactive")))
        .collect();
    let plan = core.plan_step(10.0, &[], &waiting, 1_000_000).unwrap();
    assert_eq!(plan.num_admissible, 5);
    assert_eq!(plan.token_budget, limits().max_num_batched_tokens);
    // Standard's 100 ms × 0.9 = 90 ms would allow eleven (5.5 + 0.055 + 83.6 = 89.2 ms).
    let mut core = engine_with_policy("scorpio");
    let waiting: Vec<_> = (0..12).map(|i| add(&mut core, &format!("s{i}"), f64::from(i), 200_000)).collect();
    assert_eq!(core.plan_step(20.0, &[], &waiting, 1_000_000).unwrap().num_admissible, 11);
}

proptest! {
    #[test]
    fn ceil_tokens_is_ceil_for_token_estimates(x in 0.0f64..1e12) {
        prop_assert_eq!(ceil_tokens(x), x.ceil() as u64);
    }
}

/// The waiting order of one plan at `now_ms` over fresh requests `(req_id, arrival_ms,
/// prompt_len)`, in one class whose late requests `on_overload`: its TTFT target does not bind
/// here and its TTFAT target leaves 120 s; no light-load band, no aging and no starvation bound,
/// so only the waiting order decides.
fn waiting_order_of(
    waiting_order: &str,
    on_overload: &str,
    requests: &[(&str, f64, usize)],
    now_ms: f64,
) -> Vec<u32> {
    let mut core = ordering_engine(waiting_order, on_overload);
    let waiting: Vec<_> =
        requests.iter().map(|&(id, arrival_ms, len)| add(&mut core, id, arrival_ms, len)).collect();
    core.plan_step(now_ms, &[], &waiting, 1000).unwrap().waiting_order
}

fn ordering_engine(waiting_order: &str, on_overload: &str) -> Meridian {
    let config = format!(
        r#"{{"aging_ms": 1e9, "starvation_ms": 1e9, "overload": {{"fcfs_slack_ttft_factor": 0, "waiting_order": "{waiting_order}",
            "min_success_probability": 0.001}},
            "classes": {{"c": {{"ttft_ms": 115000, "ttfat_ms": 120000, "answer_tpot_ms": 1000, "rank": 0,
            "on_overload": "{on_overload}"}}}}, "default_class": "c"}}"#
    );
    engine_with(Config::from_json(&config).unwrap())
}

/// Same arrival, same class: the 2,000-token prompt has the less slack (its prefill).
const SHORT_AND_LONG: [(&str, f64, usize); 2] = [("short", 0.0, 16), ("long", 0.0, 2000)];

#[test]
fn value_density_puts_the_cheaper_of_two_equally_likely_requests_first() {
    // The slack order runs the long prompt first; per ms of engine time the short one is worth more.
    assert_eq!(waiting_order_of("slack", "shed", &SHORT_AND_LONG, 0.0), vec![1, 0]);
    assert_eq!(waiting_order_of("value_density", "shed", &SHORT_AND_LONG, 0.0), vec![0, 1]);
}

#[test]
fn value_density_puts_the_likelier_of_two_equally_costly_requests_first() {
    // Same prompt: at 100 s the older request has 20 s left for its thinking, the younger 80 s.
    // The slack order runs the older first; its chance of thinking within 20 s is the smaller.
    let requests = [("older", 0.0, 16), ("younger", 60_000.0, 16)];
    assert_eq!(waiting_order_of("slack", "shed", &requests, 100_000.0), vec![0, 1]);
    assert_eq!(waiting_order_of("value_density", "shed", &requests, 100_000.0), vec![1, 0]);
    // The probabilities behind it, from the class's thinking distribution (the prior's).
    let mut core = ordering_engine("value_density", "shed");
    let h = add(&mut core, "probe", 0.0, 16);
    core.plan_step(0.0, &[], &[h], 1000).unwrap();
    let step_ms = core.last_decode_step_ms;
    let think = &core.lengths[0].think;
    assert!(think.prob_within(0, 20_000.0 / step_ms) < think.prob_within(0, 80_000.0 / step_ms));
}

#[test]
fn value_density_is_the_default_and_leaves_queueing_classes_in_slack_order() {
    assert_eq!(Config::default().overload.waiting_order, WaitingOrder::ValueDensity);
    // The cheaper-first case above, in a class whose late requests queue: slack order.
    assert_eq!(waiting_order_of("value_density", "queue", &SHORT_AND_LONG, 0.0), vec![1, 0]);
}

/// A class with a binding TTFT target (30 s) beside its TTFAT target (60 s), in which value
/// density runs fresh requests ahead of ones about to miss their TTFT target.
fn tight_ttft_engine(waiting_order: &str) -> Meridian {
    let config = format!(
        r#"{{"aging_ms": 1e9, "starvation_ms": 1e9, "overload": {{"fcfs_slack_ttft_factor": 0,
            "waiting_order": "{waiting_order}", "min_success_probability": 0.001}},
            "classes": {{"c": {{"ttft_ms": 30000, "ttfat_ms": 60000, "answer_tpot_ms": 1000, "rank": 0,
            "on_overload": "shed"}}}}, "default_class": "c"}}"#
    );
    engine_with(Config::from_json(&config).unwrap())
}

/// At 25 s the older request (arrived at 0) has 5 s left to its first token and 35 s to its
/// first answer token, the younger (at 20 s) 25 s and 55 s.
fn older_and_younger(core: &mut Meridian) -> [ReqHandle; 2] {
    [add(core, "older", 0.0, 16), add(core, "younger", 20_000.0, 16)]
}

#[test]
fn value_at_risk_runs_the_request_about_to_miss_its_ttft_target_before_a_fresh_one() {
    let mut core = tight_ttft_engine("value_at_risk");
    let [older, younger] = older_and_younger(&mut core);
    core.plan_step(25_000.0, &[], &[older, younger], 1000).unwrap();
    let step_ms = core.last_decode_step_ms;
    let targets = core.targets(core.hot(older).class);
    let (o, y) = (core.hot(older), core.hot(younger));
    // Value density: the younger has more time left for its thinking, so it goes first.
    assert!(
        core.value_density(25_000.0, y, &targets, step_ms)
            > core.value_density(25_000.0, o, &targets, step_ms)
    );
    // Waiting 10 s costs the older all of its chance (its TTFT target passes) and the younger
    // only what 10 s less for its thinking takes.
    let (risk_older, risk_younger) = (
        core.value_at_risk(25_000.0, o, &targets, step_ms, 10_000.0),
        core.value_at_risk(25_000.0, y, &targets, step_ms, 10_000.0),
    );
    assert!(risk_older > risk_younger && risk_younger > 0.0, "{risk_older} vs {risk_younger}");
    assert_eq!(risk_older, core.value_density(25_000.0, o, &targets, step_ms));
    // A request whose first token cannot come in time even now has nothing left to lose.
    assert_eq!(core.value_at_risk(31_000.0, o, &targets, step_ms, 1_000.0), 0.0);
}

#[test]
fn value_at_risk_prices_the_wait_for_the_next_start() {
    // No start seen yet: the wait is the start rate's floor, 10 s, past the older request's TTFT
    // deadline and not the younger's, so the older goes first (value density: the younger).
    let mut core = tight_ttft_engine("value_at_risk");
    let [older, younger] = older_and_younger(&mut core);
    assert_eq!(core.plan_step(25_000.0, &[], &[older, younger], 1000).unwrap().waiting_order, vec![0, 1]);
    assert_eq!(core.next_start_wait_ms, 10_000.0);
    let mut density = tight_ttft_engine("value_density");
    let handles = older_and_younger(&mut density);
    assert_eq!(density.plan_step(25_000.0, &[], &handles, 1000).unwrap().waiting_order, vec![1, 0]);
    // Requests starting every 25 ms: the wait is about that (never under a decode step).
    for k in 0..200 {
        core.start_rate.record(20_000.0 + 25.0 * f64::from(k));
    }
    core.plan_step(25_000.0, &[], &[older, younger], 1000).unwrap();
    assert!(core.next_start_wait_ms < 100.0 && core.next_start_wait_ms >= core.last_decode_step_ms);
}

#[test]
fn the_waiting_order_key_is_validated_by_name() {
    let err = Config::from_json(r#"{"overload": {"waiting_order": "fastest"}}"#).unwrap_err().to_string();
    assert!(err.contains("fastest") && err.contains("value_density"), "{err}");
}

/// One wave of a long-running engine: `n` requests arrive, run a few steps through thinking into
/// their answers with their prompt blocks cached, and finish; the cache then drops their blocks.
fn run_wave(core: &mut Meridian, wave: u64, n: u64) {
    let t0 = wave as f64 * 1_000.0;
    let handles: Vec<_> = (0..n).map(|i| add(core, &format!("w{wave}-r{i}"), t0, 40)).collect();
    let hashes: Vec<u64> = (0..n * 2).map(|i| (wave << 32) | i).collect();
    for (i, &h) in handles.iter().enumerate() {
        core.set_block_hashes(h, hashes[i * 2..i * 2 + 2].to_vec()).unwrap();
    }
    core.on_blocks_stored(Medium::Device, &hashes).unwrap();
    for step in 0..4u32 {
        let now_ms = t0 + f64::from(step) * 10.0;
        let plan = core.plan_step(now_ms, &handles, &[], 1_000).unwrap();
        let shape = StepShape { num_prefill_tokens: 0, num_decode_requests: n as u32, num_context_tokens: 0 };
        core.on_step_output(now_ms + 5.0, plan.step_id, shape).unwrap();
        let tokens: &[u32] = if step == 2 { &[END, WORD] } else { &[WORD] };
        for &h in &handles {
            core.on_tokens(now_ms + 5.0, h, tokens).unwrap();
        }
    }
    for &h in &handles {
        core.finish(t0 + 50.0, h, "stop", &[]).unwrap();
    }
    core.on_blocks_removed(Medium::Device, &hashes).unwrap();
}

#[test]
fn the_footprint_is_flat_over_waves_of_finished_requests() {
    // The core of a server that runs for weeks: what it holds must not grow with the requests it
    // has seen, only with those live now.
    let mut core = engine();
    run_wave(&mut core, 0, 64);
    let settled = core.footprint();
    assert_eq!(settled.num_live_requests, 0);
    assert_eq!(settled.num_indexed_blocks, 0);
    assert_eq!(settled.num_slots, 64, "a slot per request that was live at once");
    for wave in 1..200 {
        run_wave(&mut core, wave, 64);
        let now = core.footprint();
        // The id map may double once: with its peak live and the tombstones finished requests
        // left, the map grows instead of rehashing in place, and then never again.
        assert!(now.heap_bytes <= 2 * settled.heap_bytes, "wave {wave}: {now:?} against {settled:?}");
        assert_eq!(Footprint { heap_bytes: 0, ..now }, Footprint { heap_bytes: 0, ..settled }, "wave {wave}");
    }
    assert_eq!(core.stats().num_finished, 200 * 64);

    let h = add(&mut core, "live", 300_000.0, 40);
    core.set_block_hashes(h, vec![1, 2]).unwrap();
    let live = core.footprint();
    assert_eq!(live.num_live_requests, 1);
    assert!(live.heap_bytes > settled.heap_bytes, "a live request's id and hashes count");
}

#[test]
fn an_earlier_runs_request_log_teaches_the_predictors_what_its_own_requests_would() {
    // A server whose requests think 20 tokens and answer 5: the production priors expect far more.
    let expected = |core: &mut Meridian| {
        let h = add(core, "fresh", 0.0, 8);
        core.plan_step(0.0, &[], &[h], 1_000).unwrap(); // a plan refreshes the predictors
        let tokens = core.engine_load(0.0, &[], &[h]).unwrap().classes[1].expected_output_tokens;
        core.finish(0.0, h, "abort", &[]).unwrap();
        tokens
    };
    let mut cold = engine();
    let mut warm = engine();
    let mut served = engine();
    for i in 0..300 {
        assert!(warm.learn_from_history("standard", "stopped", true, 20, 5, KvHandoff::Local).unwrap());
        let h = add(&mut served, &format!("r{i}"), 0.0, 8);
        served.on_tokens(1.0, h, &[THINK]).unwrap();
        think(&mut served, 1.0, h, 19);
        served.on_tokens(2.0, h, &[END, WORD, WORD, WORD, WORD]).unwrap();
        served.finish(3.0, h, "stop", &[]).unwrap();
    }
    let (cold, warm, served) = (expected(&mut cold), expected(&mut warm), expected(&mut served));
    assert!(cold > 10.0 * warm, "cold {cold} vs warm {warm}");
    assert!((warm - served).abs() < 0.05 * served, "the log teaches what serving does: {warm} vs {served}");
}

#[test]
fn history_of_another_configuration_or_a_truncated_request_teaches_nothing() {
    let mut core = engine();
    assert!(
        !core.learn_from_history("gold", "stopped", true, 20, 5, KvHandoff::Local).unwrap(),
        "a class this server lacks"
    );
    assert!(
        !core.learn_from_history("standard", "length", false, 0, 5, KvHandoff::Local).unwrap(),
        "cut short before answering"
    );
    assert!(
        core.learn_from_history("standard", "length", true, 30, 5, KvHandoff::Local).unwrap(),
        "its thinking ended"
    );
    assert!(
        !core.learn_from_history("standard", "length", true, 30, 5, KvHandoff::Sends).unwrap(),
        "a prefill instance's line teaches nothing"
    );
    let e = core
        .learn_from_history("standard", "finished", true, 1, 1, KvHandoff::Local)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`reason`") && e.contains("finished"), "{e}");
}

#[test]
fn a_request_whose_kv_does_not_fit_holds_up_none_behind_it_until_it_starves() {
    // Late requests queue rather than being shed: the test is about admission alone.
    let mut core = engine_with(Config::from_json(r#"{"overload": {"on_overload": "queue"}}"#).unwrap());
    // A preempted long request (it resumes before new ones) needs 64 blocks of 16; 20 are free.
    let big = add_class(&mut core, "big", 0.0, 1_000, Some("batch"));
    core.on_preempted(5.0, big).unwrap();
    let small: Vec<_> =
        (0..2).map(|i| add_class(&mut core, &format!("s{i}"), 10.0, 8, Some("batch"))).collect();
    let waiting = [big, small[0], small[1]];
    let plan = core.plan_step(100.0, &[], &waiting, 20).unwrap();
    assert_eq!(plan.num_admissible, 2, "the two that fit");
    assert_eq!(&plan.waiting_order[..2], &[1, 2], "admitted first, the big one right behind");
    assert_eq!(plan.waiting_order[2], 0);
    // Past the starvation bound it blocks again: nothing passes it any more.
    let later = core.config().starvation_ms + 10.0;
    let plan = core.plan_step(later, &[], &waiting, 20).unwrap();
    assert_eq!(plan.waiting_order[0], 0);
    assert_eq!(plan.num_admissible, 1, "an idle engine lets the head try, as vLLM would");
}

#[test]
fn a_retry_keeps_the_deadlines_its_client_started_elsewhere() {
    let mut core = engine_with_policy("scorpio");
    let prompt = vec![WORD; 16];
    let new = |req_id, waited_ms| NewRequest {
        req_id,
        arrival_ms: 1_000.0,
        prompt_token_ids: &prompt,
        max_tokens: 64,
        slo_class: Some("standard"),
        priority: 0,
        waited_ms,
    };
    let fresh = core.add_request(new("fresh", 0.0)).unwrap().0;
    // Sent 2.5 s earlier and shed elsewhere: its TTFT deadline is 1.5 s, the fresh one's 4 s.
    let retried = core.add_request(new("retried", 2_500.0)).unwrap().0;
    let plan = core.plan_step(1_000.0, &[], &[fresh, retried], 10_000).unwrap();
    assert_eq!(plan.waiting_order, vec![1, 0], "the earlier deadline first");
    let done = core.finish(1_100.0, retried, "stop", &[WORD]).unwrap();
    assert_eq!(done.ledger.arrival_ms, 0.0, "waited longer than the clock: counted from 0");
    let err = core.add_request(new("bad", -5.0)).unwrap_err();
    assert!(err.to_string().contains(crate::WAITED_ARG), "{err}");
}

#[test]
fn the_thinking_stop_reaches_the_finish_reported_or_inferred_from_vllms_budget() {
    let mut core = engine();
    let finish = |core: &mut Meridian, h: ReqHandle| {
        core.on_tokens(20.0, h, &[END, WORD, WORD]).unwrap();
        core.finish(30.0, h, "stop", &[]).unwrap().thinking_stop
    };
    // vLLM ended the thinking at the hard budget it was given: reported as the budget's stop.
    let control = ThinkingControl { budget_tokens: Some(5), ..ThinkingControl::default() };
    let a = add(&mut core, "a", 0.0, 8);
    assert_eq!(core.vllm_thinking_budget(a, &control, None).unwrap(), Some(5));
    think(&mut core, 10.0, a, 5);
    assert_eq!(finish(&mut core, a), Some(FiredAt { reason: StopReason::Budget, num_think_tokens: 5 }));
    // It ended on its own before the budget: no stop.
    let b = add(&mut core, "b", 0.0, 8);
    core.vllm_thinking_budget(b, &control, None).unwrap();
    think(&mut core, 10.0, b, 3);
    assert_eq!(finish(&mut core, b), None);
    // The processor's report stands, first one wins, whatever the budget.
    let c = add(&mut core, "c", 0.0, 8);
    core.vllm_thinking_budget(c, &control, None).unwrap();
    think(&mut core, 10.0, c, 5);
    core.on_thinking_stopped(c, StopReason::Eat, 4).unwrap();
    core.on_thinking_stopped(c, StopReason::Rpdi, 5).unwrap();
    assert_eq!(finish(&mut core, c), Some(FiredAt { reason: StopReason::Eat, num_think_tokens: 4 }));
    // No budget at all: none set for vLLM, and nothing inferred.
    let d = add(&mut core, "d", 0.0, 8);
    assert_eq!(core.vllm_thinking_budget(d, &ThinkingControl::default(), None).unwrap(), None);
    let counts = core.stats().num_thinking_stops;
    assert_eq!((counts[StopReason::Budget as usize], counts[StopReason::Eat as usize]), (1, 1));
    assert_eq!(counts.iter().sum::<u64>(), 2);
}

#[test]
fn the_load_aware_budget_given_to_vllm_is_reported_as_its_own_rule() {
    let mut core = engine();
    let rule =
        crate::thinking::LoadAwareBudget { budget_tokens: 6, min_budget_tokens: 2, attainment_floor: 0.5 };
    let control =
        ThinkingControl { load_aware: Some(rule), budget_tokens: Some(100), ..ThinkingControl::default() };
    let a = add(&mut core, "a", 0.0, 8);
    assert_eq!(core.vllm_thinking_budget(a, &control, Some(50)).unwrap(), Some(6));
    think(&mut core, 10.0, a, 6);
    core.on_tokens(20.0, a, &[END, WORD]).unwrap();
    let stop = core.finish(30.0, a, "stop", &[]).unwrap().thinking_stop;
    assert_eq!(stop, Some(FiredAt { reason: StopReason::LoadAwareBudget, num_think_tokens: 6 }));
}
