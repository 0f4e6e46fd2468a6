//! The thinking rules end to end: configuration, validation, the decision state and its invariants.

use proptest::prelude::*;

use super::*;
use crate::reasoning_effort::EffortBudgets;

fn only(f: impl FnOnce(&mut ThinkingControl)) -> ThinkingControl {
    let mut control = ThinkingControl::default();
    f(&mut control);
    control.validate("thinking_control").unwrap();
    control
}

/// Feeds `n` plain thinking tokens (no signals, no boundary); returns the 1-based index of
/// the token that fired, if any.
fn plain_tokens(state: &mut ThinkingState, control: &ThinkingControl, n: u32) -> Option<(u32, StopReason)> {
    (1..=n).find_map(|i| state.on_think_token(control, None, None, None, Boundary::None).map(|r| (i, r)))
}

/// Feeds EAT probes; returns the 1-based index of the probe that fired, if any.
fn probes(state: &mut ThinkingState, control: &ThinkingControl, xs: &[f32]) -> Option<usize> {
    xs.iter().position(|&x| state.on_eat_probe(control, x).is_some()).map(|i| i + 1)
}

#[test]
fn default_control_is_off_and_never_fires() {
    let control = ThinkingControl::default();
    assert!(!control.is_enabled());
    let mut state = ThinkingState::new();
    for i in 0..10_000 {
        let boundary = if i % 7 == 0 { Boundary::Line } else { Boundary::Sentence };
        assert_eq!(state.on_think_token(&control, Some(5.0), Some(1.0), Some(0), boundary), None);
        assert_eq!(state.on_eat_probe(&control, 0.0), None);
    }
    assert_eq!(state.fired(), None);
    assert_eq!(state.eat().count, 0, "EAT off: probes are not even recorded");
}

#[test]
fn eat_update_matches_hand_computed_values() {
    // α = 0.5 and dyadic inputs keep every f32 operation exact.
    let mut s = EatSignal::default();
    eat_update(&mut s, 2.0, 0.5);
    assert_eq!(s, EatSignal { mean: 2.0, var: 0.0, count: 1 });
    eat_update(&mut s, 4.0, 0.5); // d = 2, mean = 3, var = 0.5·(0 + 0.5·4) = 1
    assert_eq!(s, EatSignal { mean: 3.0, var: 1.0, count: 2 });
    eat_update(&mut s, 3.0, 0.5); // d = 0, var halves
    assert_eq!(s, EatSignal { mean: 3.0, var: 0.5, count: 3 });
    eat_update(&mut s, 1.0, 0.5); // d = −2, mean = 2, var = 0.5·(0.5 + 0.5·4) = 1.25
    assert_eq!(s, EatSignal { mean: 2.0, var: 1.25, count: 4 });
}

#[test]
fn rpdi_update_matches_hand_computed_values() {
    let mut s = RpdiSignal::default();
    rpdi_update(&mut s, 0.1, 2.0, 0.5); // low: local = 0
    assert_eq!(s, RpdiSignal { num_tokens: 1, num_high: 0, local_rate: 0.0 });
    rpdi_update(&mut s, 3.0, 2.0, 0.5); // high: local = 0.5
    assert_eq!(s, RpdiSignal { num_tokens: 2, num_high: 1, local_rate: 0.5 });
    rpdi_update(&mut s, 2.0, 2.0, 0.5); // not strictly above: local = 0.25
    assert_eq!(s, RpdiSignal { num_tokens: 3, num_high: 1, local_rate: 0.25 });
    rpdi_update(&mut s, 9.0, 2.0, 0.5); // local = 0.25 + 0.5·0.75 = 0.625
    assert_eq!(s, RpdiSignal { num_tokens: 4, num_high: 2, local_rate: 0.625 });
}

#[test]
fn signal_updates_match_float32_golden_bits() {
    // Golden bits computed with float32 NumPy in the same operation order (no fused
    // multiply-add), one value per call, with eat_alpha = 0.2, high_entropy_nats = 2.5,
    // rpdi_alpha = 0.05.
    let eat_in = [2.5f32, 1.75, 1.9, 0.6, 0.61, 0.59, 0.6];
    let eat_golden: [(u32, u32); 7] = [
        (0x4020_0000, 0x0000_0000),
        (0x4016_6666, 0x3db8_51ec),
        (0x4010_a3d7, 0x3dd5_cfaa),
        (0x3ff6_c8b4, 0x3f06_4020),
        (0x3fd5_0b0f, 0x3f32_8d90),
        (0x3fb9_89df, 0x3f3e_1fbb),
        (0x3fa3_ca75, 0x3f35_a8cb),
    ];
    let mut eat = EatSignal::default();
    for (i, (&x, &(mean, var))) in eat_in.iter().zip(&eat_golden).enumerate() {
        eat_update(&mut eat, x, 0.2);
        assert_eq!((eat.mean.to_bits(), eat.var.to_bits()), (mean, var), "probe {i}");
        assert_eq!(eat.count, i as u32 + 1);
    }
    let rpdi_in = [0.1f32, 3.0, 2.5, 2.6, 0.0, 5.0];
    let rpdi_golden: [(u32, u32); 6] =
        [(0, 0x0), (1, 0x3d4c_cccd), (1, 0x3d42_8f5c), (2, 0x3dc2_d0e6), (2, 0x3db9_1341), (3, 0x3e0b_1c58)];
    let mut rpdi = RpdiSignal::default();
    for (i, (&x, &(high, local))) in rpdi_in.iter().zip(&rpdi_golden).enumerate() {
        rpdi_update(&mut rpdi, x, 2.5, 0.05);
        assert_eq!((rpdi.num_high, rpdi.local_rate.to_bits()), (high, local), "token {i}");
        assert_eq!(rpdi.num_tokens, i as u32 + 1);
    }
}

#[test]
fn west_variance_is_the_paper_codes_over_one_minus_alpha() {
    // xidulu/EAT `exponential_moving_variance`: mean_t = α·x + (1−α)·mean; var_t = α·(x −
    // mean_t)² + (1−α)·var, var_0 = 0. Ours (the West form) is that divided by (1 − α).
    let xs = [2.5f64, 1.75, 1.9, 0.6, 0.61, 0.59, 0.6, 0.4, 0.45, 0.44];
    let alpha = 0.2f64;
    let (mut mean, mut var) = (xs[0], 0.0f64);
    let mut ours = EatSignal::default();
    eat_update(&mut ours, xs[0] as f32, alpha as f32);
    for &x in &xs[1..] {
        mean = alpha * x + (1.0 - alpha) * mean;
        var = alpha * (x - mean).powi(2) + (1.0 - alpha) * var;
        eat_update(&mut ours, x as f32, alpha as f32);
        let expected = var / (1.0 - alpha);
        assert!(
            (f64::from(ours.var) - expected).abs() <= 1e-5 * expected.max(1e-3),
            "{ours:?} vs {expected}"
        );
    }
}

#[test]
fn eat_fires_at_the_first_probe_below_delta_once_min_lines_are_in() {
    // α = 0.5: var runs 0, 1, 0.5, 0.25, 0.125, 0.0625 on 2, 4, 3, 3, 3, 3 (exact in f32).
    let series = [2.0f32, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0];
    let control =
        |min_lines| only(|c| c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines }));
    // The first probe has var = 0 < δ: with min_lines = 1 it fires at once.
    assert_eq!(probes(&mut ThinkingState::new(), &control(1), &series), Some(1));
    // From min_lines = 2 on, the first var below 0.1 is the 6th probe (0.0625).
    assert_eq!(probes(&mut ThinkingState::new(), &control(2), &series), Some(6));
    assert_eq!(probes(&mut ThinkingState::new(), &control(6), &series), Some(6));
    // min_lines holds it back even though var is already below δ.
    assert_eq!(probes(&mut ThinkingState::new(), &control(8), &series), Some(8));
    assert_eq!(probes(&mut ThinkingState::new(), &control(9), &series), None);
    // Strictly below: a threshold equal to the variance does not fire (0.125 at probe 5).
    let exact = only(|c| c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.125, min_lines: 2 }));
    assert_eq!(probes(&mut ThinkingState::new(), &exact, &series), Some(6));
}

#[test]
fn eat_fires_with_the_default_rule_on_a_stable_series() {
    let control = only(|c| c.eat = Some(EatRule::default()));
    // Two thinking tokens per line, a probe at each line end; returns the line that fired.
    let run = |series: &dyn Fn(u32) -> f32| {
        let mut state = ThinkingState::new();
        for line in 1..=200u32 {
            state.on_think_token(&control, None, None, None, Boundary::None);
            state.on_think_token(&control, None, None, None, Boundary::Line);
            if let Some(reason) = state.on_eat_probe(&control, series(line)) {
                assert_eq!(reason, StopReason::Eat);
                assert_eq!(state.fired().unwrap().num_think_tokens, 2 * line);
                assert_eq!(state.num_lines(), line);
                return Some(line);
            }
        }
        None
    };
    // A flat series has var = 0 from the first probe: it fires exactly at min_lines = 25.
    assert_eq!(run(&|_| 0.5), Some(25));
    // Falling 2.5 → 0.5 nats over five lines, then flat: var decays by ≈ (1 − α) per line
    // and first drops below 1.25e-4 at line 49 (1.109e-4; line 48: 1.386e-4), as computed
    // with float32 NumPy in `eat_update`'s operation order.
    assert_eq!(run(&|line| if line <= 5 { 3.0 - 0.5 * line as f32 } else { 0.5 }), Some(49));
}

#[test]
fn eat_never_fires_on_a_series_that_keeps_oscillating() {
    // 1, 3, 1, 3, …: the mean settles into a 2-cycle (1.89, 2.11) with |d| ≈ 1.11 ≥ 1, so
    // var ≥ (1 − α)·α·1 = 0.16 > δ forever. (min_lines = 2 skips the first probe's var = 0.)
    let control = only(|c| c.eat = Some(EatRule { alpha: 0.2, variance_threshold: 0.01, min_lines: 2 }));
    let series: Vec<f32> = (0..2_000).map(|i| if i % 2 == 0 { 1.0 } else { 3.0 }).collect();
    let mut state = ThinkingState::new();
    assert_eq!(probes(&mut state, &control, &series), None);
    assert_eq!(state.eat().count, 2_000);
    assert!(state.eat().var > 0.16, "{:?}", state.eat());
}

#[test]
fn budget_fires_at_exactly_budget_tokens() {
    let control = only(|c| c.budget_tokens = Some(5));
    let mut state = ThinkingState::new();
    assert_eq!(plain_tokens(&mut state, &control, 100), Some((5, StopReason::Budget)));
    assert_eq!(state.fired(), Some(FiredAt { reason: StopReason::Budget, num_think_tokens: 5 }));
    let one = only(|c| c.budget_tokens = Some(1));
    assert_eq!(plain_tokens(&mut ThinkingState::new(), &one, 3), Some((1, StopReason::Budget)));
}

#[test]
fn firing_is_once_and_freezes_the_state() {
    let control = only(|c| {
        c.budget_tokens = Some(3);
        c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines: 1 });
    });
    let mut state = ThinkingState::new();
    assert_eq!(plain_tokens(&mut state, &control, 3), Some((3, StopReason::Budget)));
    let frozen = state.clone();
    assert_eq!(plain_tokens(&mut state, &control, 50), None);
    assert_eq!(state.on_eat_probe(&control, 1.0), None, "EAT would fire, but the budget already did");
    assert_eq!(state, frozen);
}

#[test]
fn load_aware_tightens_only_below_the_floor() {
    let rule = LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 };
    assert_eq!(rule.effective_budget(None), 100);
    assert_eq!(rule.effective_budget(Some(0.5)), 100, "at the floor: no tightening");
    assert_eq!(rule.effective_budget(Some(0.9)), 100);
    assert_eq!(rule.effective_budget(Some(0.25)), 60, "20 + ⌊80 · 0.5⌋");
    assert_eq!(rule.effective_budget(Some(0.0)), 20);
    let control = only(|c| c.load_aware = Some(rule));
    let run = |attainment: Option<f64>| {
        let mut state = ThinkingState::new();
        if let Some(a) = attainment {
            state.set_ttfat_attainment(a);
        }
        plain_tokens(&mut state, &control, 1_000)
    };
    assert_eq!(run(Some(0.25)), Some((60, StopReason::LoadAwareBudget)));
    assert_eq!(run(Some(0.0)), Some((20, StopReason::LoadAwareBudget)));
    assert_eq!(run(Some(0.75)), Some((100, StopReason::LoadAwareBudget)));
    assert_eq!(run(None), Some((100, StopReason::LoadAwareBudget)));
    assert_eq!(run(Some(f64::NAN)), Some((100, StopReason::LoadAwareBudget)), "NaN: unknown");
    assert_eq!(run(Some(-3.0)), Some((20, StopReason::LoadAwareBudget)), "clamped to 0");
}

#[test]
fn load_aware_fires_on_the_next_token_when_the_budget_tightens_below_the_count() {
    let rule = LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 };
    let control = only(|c| c.load_aware = Some(rule));
    let mut state = ThinkingState::new();
    assert_eq!(plain_tokens(&mut state, &control, 70), None);
    state.set_ttfat_attainment(0.25); // budget 60 < 70 tokens
    assert_eq!(plain_tokens(&mut state, &control, 5), Some((1, StopReason::LoadAwareBudget)));
    assert_eq!(state.fired().unwrap().num_think_tokens, 71);
}

#[test]
fn hard_budget_wins_a_tie_with_the_load_aware_budget() {
    let control = only(|c| {
        c.budget_tokens = Some(20);
        c.load_aware =
            Some(LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 });
    });
    let mut state = ThinkingState::new();
    state.set_ttfat_attainment(0.0);
    assert_eq!(plain_tokens(&mut state, &control, 50), Some((20, StopReason::Budget)));
}

#[test]
fn proxy_fires_at_the_first_qualifying_token_from_min_tokens_on() {
    let control = only(|c| {
        c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.3), max_end_rank: Some(1), min_tokens: 4 })
    });
    // (prob, rank) per token; tokens 1–3 qualify but come before min_tokens.
    let tokens = [
        (Some(0.9), Some(0)),
        (Some(0.5), None),
        (None, Some(1)),
        (Some(0.29), Some(2)), // 4: neither
        (None, None),          // 5: nothing measured
        (Some(0.1), Some(1)),  // 6: rank 1 ≤ 1
    ];
    let mut state = ThinkingState::new();
    let fired = tokens
        .iter()
        .position(|&(p, r)| state.on_think_token(&control, None, p, r, Boundary::None).is_some());
    assert_eq!(fired, Some(5), "the 6th token");
    assert_eq!(state.fired(), Some(FiredAt { reason: StopReason::Proxy, num_think_tokens: 6 }));

    let by_prob = only(|c| {
        c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.3), max_end_rank: None, min_tokens: 4 })
    });
    let mut state = ThinkingState::new();
    let ps = [0.0f32, 0.0, 0.0, 0.2, 0.3];
    let fired = ps
        .iter()
        .position(|&p| state.on_think_token(&by_prob, None, Some(p), Some(0), Boundary::None).is_some());
    assert_eq!(fired, Some(4), "rank 0 is ignored with max_end_rank null; p = 0.3 ≥ 0.3 fires");
}

#[test]
fn rpdi_fires_only_at_sentence_boundaries() {
    // α = 0.5, threshold 1 nat, ratio 1.5, min 4 tokens. Entropies: low, low, low, high, high.
    // After token 5: 5 tokens, 2 high, local = 0.75 → ratio 0.75 / 0.4 = 1.875 ≥ 1.5.
    let control = only(|c| {
        c.rpdi = Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 4 })
    });
    let entropies = [0.0f32, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0];
    let run = |boundaries: &[Boundary]| {
        let mut state = ThinkingState::new();
        let fired = entropies
            .iter()
            .zip(boundaries)
            .position(|(&x, &b)| state.on_think_token(&control, Some(x), None, None, b).is_some());
        (fired.map(|i| i + 1), state)
    };
    let none = [Boundary::None; 7];
    let (fired, state) = run(&none);
    assert_eq!(fired, None, "the ratio qualifies at token 5 but no token ends a sentence");
    assert_eq!(*state.rpdi(), RpdiSignal { num_tokens: 7, num_high: 2, local_rate: 0.1875 });
    let mut at5 = none;
    at5[4] = Boundary::Sentence;
    assert_eq!(run(&at5).0, Some(5));
    let mut line_at5 = none;
    line_at5[4] = Boundary::Line;
    assert_eq!(run(&line_at5).0, Some(5), "a line end is a sentence end");
    // At token 6 the local rate has decayed to 0.375: 0.375 / (2/6) = 1.125 < 1.5.
    let mut at6 = none;
    at6[5] = Boundary::Sentence;
    assert_eq!(run(&at6).0, None);
    // Token 4 (the first transition) already qualifies: 0.5 / (1/4) = 2 ≥ 1.5, and 4 tokens
    // meet min_tokens = 4, so a sentence end there fires.
    let mut at4 = none;
    at4[3] = Boundary::Sentence;
    assert_eq!(run(&at4).0, Some(4));
}

#[test]
fn rpdi_respects_min_tokens_and_an_empty_global_rate() {
    let control = only(|c| {
        c.rpdi = Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 5 })
    });
    let mut state = ThinkingState::new();
    for x in [0.0f32, 0.0, 0.0, 2.0] {
        assert_eq!(state.on_think_token(&control, Some(x), None, None, Boundary::Sentence), None);
    }
    // No transitions at all: the ratio is undefined and never fires.
    let mut calm = ThinkingState::new();
    for _ in 0..100 {
        assert_eq!(calm.on_think_token(&control, Some(0.1), None, None, Boundary::Line), None);
    }
}

#[test]
fn unusable_inputs_are_counted_and_never_enter_an_ema() {
    let control = only(|c| {
        c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines: 2 });
        c.rpdi = Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 100 });
        c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.5), max_end_rank: None, min_tokens: 0 });
    });
    let mut state = ThinkingState::new();
    for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -33.0] {
        assert_eq!(state.on_think_token(&control, Some(x), None, None, Boundary::Sentence), None);
        assert_eq!(state.on_eat_probe(&control, x), None);
    }
    for p in [f32::NAN, 1.5, -0.1, f32::INFINITY] {
        assert_eq!(state.on_think_token(&control, None, Some(p), None, Boundary::None), None);
    }
    assert_eq!(state.ignored(), IgnoredInputs { entropies: 5, eat_probes: 5, end_probs: 4 });
    assert_eq!(*state.eat(), EatSignal::default());
    assert_eq!(*state.rpdi(), RpdiSignal::default());
    assert_eq!(state.num_think_tokens(), 9, "the tokens themselves still count");
    // The EAT series goes on as if the bad probes never came (2, 4, 3, 3, 3, 3 → fires at 6).
    let fired = probes(&mut state, &control, &[2.0, 4.0, f32::NAN, 3.0, 3.0, 3.0, 3.0]);
    assert_eq!(fired, Some(7), "the 7th call, the 6th usable probe");
    assert_eq!(state.ignored().eat_probes, 6);
}

#[test]
fn validation_names_the_dotted_key_and_the_value() {
    let bad = |f: fn(&mut ThinkingControl)| {
        let mut control = ThinkingControl::default();
        f(&mut control);
        control.validate("thinking_control").unwrap_err().to_string()
    };
    let msg = bad(|c| c.eat = Some(EatRule { alpha: 1.0, ..EatRule::default() }));
    assert!(msg.contains("thinking_control.eat.alpha") && msg.contains("1 is not in (0, 1)"), "{msg}");
    let msg = bad(|c| c.eat = Some(EatRule { variance_threshold: -0.5, ..EatRule::default() }));
    assert!(msg.contains("thinking_control.eat.variance_threshold") && msg.contains("-0.5"), "{msg}");
    let msg = bad(|c| c.eat = Some(EatRule { min_lines: 0, ..EatRule::default() }));
    assert!(msg.contains("thinking_control.eat.min_lines"), "{msg}");
    let msg = bad(|c| c.budget_tokens = Some(0));
    assert!(msg.contains("thinking_control.budget_tokens"), "{msg}");
    let msg = bad(|c| {
        c.load_aware =
            Some(LoadAwareBudget { budget_tokens: 10, min_budget_tokens: 20, attainment_floor: 0.9 })
    });
    assert!(msg.contains("thinking_control.load_aware.budget_tokens") && msg.contains("10"), "{msg}");
    let msg =
        bad(|c| c.load_aware = Some(LoadAwareBudget { attainment_floor: 0.0, ..LoadAwareBudget::default() }));
    assert!(msg.contains("thinking_control.load_aware.attainment_floor"), "{msg}");
    let msg =
        bad(|c| c.proxy = Some(ProxyRule { end_prob_threshold: Some(f32::NAN), ..ProxyRule::default() }));
    assert!(msg.contains("thinking_control.proxy.end_prob_threshold") && msg.contains("NaN"), "{msg}");
    let msg =
        bad(|c| c.proxy = Some(ProxyRule { end_prob_threshold: None, max_end_rank: None, min_tokens: 1 }));
    assert!(msg.contains("thinking_control.proxy"), "{msg}");
    let msg = bad(|c| c.rpdi = Some(RpdiRule { ratio_threshold: 1.0, ..RpdiRule::default() }));
    assert!(msg.contains("thinking_control.rpdi.ratio_threshold"), "{msg}");
    let msg = bad(|c| c.rpdi = Some(RpdiRule { high_entropy_nats: 0.0, ..RpdiRule::default() }));
    assert!(msg.contains("thinking_control.rpdi.high_entropy_nats"), "{msg}");
    let msg = bad(|c| c.rpdi = Some(RpdiRule { alpha: f32::INFINITY, ..RpdiRule::default() }));
    assert!(msg.contains("thinking_control.rpdi.alpha") && msg.contains("inf"), "{msg}");
    let msg = bad(|c| c.closing.closing_text = Some("  \n".to_owned()));
    assert!(msg.contains("thinking_control.closing.closing_text"), "{msg}");
    let msg = bad(|c| c.closing.closing_text = Some("x".repeat(MAX_CLOSING_TEXT_CHARS + 1)));
    assert!(msg.contains("thinking_control.closing.closing_text") && msg.contains("513"), "{msg}");
}

#[test]
fn every_default_rule_is_valid() {
    let control = ThinkingControl {
        budget_tokens: Some(1),
        load_aware: Some(LoadAwareBudget::default()),
        eat: Some(EatRule::default()),
        proxy: Some(ProxyRule::default()),
        rpdi: Some(RpdiRule::default()),
        closing: ClosingPolicy { closing_text: Some("Time is up.".to_owned()) },
        boundaries: Boundaries::default(),
        reasoning_effort: EffortBudgets::default(),
    };
    control.validate("thinking_control").unwrap();
    assert!(control.wants_token_entropy() && control.wants_eat_probes() && control.wants_end_token_stats());
}

#[derive(Debug, Clone)]
enum Event {
    Token { entropy: Option<f32>, prob: Option<f32>, rank: Option<u32>, boundary: Boundary },
    Probe(f32),
    Attainment(f64),
}

/// Mostly calm entropies with occasional transitions (so RPDI bursts happen), plus junk.
fn signal_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        14 => 0.0f32..0.5,
        3 => 0.5f32..6.0,
        1 => Just(f32::NAN),
        1 => prop_oneof![Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(1e30f32), Just(-40.0f32)],
    ]
}

fn event() -> impl Strategy<Value = Event> {
    let boundary =
        prop_oneof![6 => Just(Boundary::None), 2 => Just(Boundary::Sentence), 1 => Just(Boundary::Line)];
    let prob = prop_oneof![4 => 0.0f32..0.4, 1 => Just(f32::NAN), 1 => -1.0f32..2.0];
    prop_oneof![
        12 => (
            proptest::option::of(signal_f32()),
            proptest::option::of(prob),
            proptest::option::of(0u32..50),
            boundary,
        )
            .prop_map(|(entropy, prob, rank, boundary)| Event::Token { entropy, prob, rank, boundary }),
        3 => signal_f32().prop_map(Event::Probe),
        1 => prop_oneof![0.0f64..1.0, Just(f64::NAN)].prop_map(Event::Attainment),
    ]
}

fn control() -> impl Strategy<Value = ThinkingControl> {
    let budget = proptest::option::of(1u32..400);
    let load_aware =
        proptest::option::of((1u32..200, 0u32..300, 0.05f64..1.0).prop_map(|(min, extra, floor)| {
            LoadAwareBudget { budget_tokens: min + extra, min_budget_tokens: min, attainment_floor: floor }
        }));
    let eat = proptest::option::of(
        (0.01f32..0.99, 1e-4f32..0.5, 1u32..40).prop_map(|(alpha, delta, min)| EatRule {
            alpha,
            variance_threshold: delta,
            min_lines: min,
        }),
    );
    let proxy = proptest::option::of(
        (proptest::option::of(0.05f32..0.95), proptest::option::of(0u32..3), 0u32..300).prop_map(
            |(threshold, rank, min)| ProxyRule {
                end_prob_threshold: threshold,
                max_end_rank: if threshold.is_none() { Some(rank.unwrap_or(0)) } else { rank },
                min_tokens: min,
            },
        ),
    );
    let rpdi = proptest::option::of((0.5f32..4.0, 0.01f32..0.5, 1.01f32..4.0, 0u32..300).prop_map(
        |(high, alpha, ratio, min)| RpdiRule {
            high_entropy_nats: high,
            alpha,
            ratio_threshold: ratio,
            min_tokens: min,
        },
    ));
    (budget, load_aware, eat, proxy, rpdi).prop_map(|(budget_tokens, load_aware, eat, proxy, rpdi)| {
        ThinkingControl {
            budget_tokens,
            load_aware,
            eat,
            proxy,
            rpdi,
            closing: ClosingPolicy::default(),
            boundaries: Boundaries::default(),
            reasoning_effort: EffortBudgets::default(),
        }
    })
}

/// Runs the events; returns each call's answer and the final state, checking on the way
/// that a firing never comes before the firing rule's own minimum.
fn replay(control: &ThinkingControl, events: &[Event]) -> (Vec<Option<StopReason>>, ThinkingState) {
    let mut state = ThinkingState::new();
    let mut answers = Vec::with_capacity(events.len());
    for event in events {
        let answer = match *event {
            Event::Token { entropy, prob, rank, boundary } => {
                let answer = state.on_think_token(control, entropy, prob, rank, boundary);
                if answer == Some(StopReason::Rpdi) {
                    assert!(boundary.ends_sentence(), "RPDI fired mid-sentence");
                }
                answer
            }
            Event::Probe(x) => state.on_eat_probe(control, x),
            Event::Attainment(a) => {
                state.set_ttfat_attainment(a);
                None
            }
        };
        if let Some(reason) = answer {
            let n = state.num_think_tokens();
            match reason {
                StopReason::Budget => assert_eq!(Some(n), control.budget_tokens),
                StopReason::LoadAwareBudget => {
                    let rule = control.load_aware.unwrap();
                    assert!(n >= rule.effective_budget(state.ttfat_attainment()));
                    assert!(n >= rule.min_budget_tokens);
                }
                StopReason::Eat => assert!(state.eat().count >= control.eat.unwrap().min_lines),
                StopReason::Proxy => assert!(n >= control.proxy.unwrap().min_tokens),
                StopReason::Rpdi => assert!(state.rpdi().num_tokens >= control.rpdi.unwrap().min_tokens),
                StopReason::Overload => unreachable!("only the scheduler ends a thinking for overload"),
            }
            assert_eq!(state.fired(), Some(FiredAt { reason, num_think_tokens: n }));
        }
        assert!(state.eat().mean.is_finite() && state.eat().var.is_finite() && state.eat().var >= 0.0);
        assert!((0.0..=1.0).contains(&state.rpdi().local_rate));
        answers.push(answer);
    }
    (answers, state)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decisions_are_deterministic_single_and_never_early(
        control in control(),
        events in prop::collection::vec(event(), 0..600),
    ) {
        control.validate("thinking_control").unwrap();
        let (first, state) = replay(&control, &events);
        let (second, again) = replay(&control, &events);
        prop_assert_eq!(&first, &second);
        prop_assert_eq!(&state, &again);
        let fired: Vec<_> = first.iter().flatten().collect();
        prop_assert!(fired.len() <= 1, "fired {} times", fired.len());
        prop_assert_eq!(fired.first().copied().copied(), state.fired().map(|f| f.reason));
        if let Some(budget) = control.budget_tokens {
            prop_assert!(state.num_think_tokens() <= budget, "the hard budget is a guarantee");
        }
    }
}
