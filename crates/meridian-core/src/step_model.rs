//! The step-time model: `step_ms = base + per_prefill_token · prompt tokens computed +
//! per_decode_request · requests decoding + per_context_token · KV tokens read`, seeded from a
//! profile and refitted online by recursive least squares with forgetting. Prompt tokens and
//! decoding requests get separate coefficients because they cost very differently: a prompt
//! token is compute-bound work, while a decode shares the weight reads of the whole batch, so
//! one blended per-token cost would overcharge decodes many times over and starve them. It turns
//! a latency target into a token budget. The fit is exponentially weighted least squares with a
//! ridge pull toward the seed, re-solved from its sufficient statistics after every step: real
//! step shapes excite the features poorly (long stretches without prompt tokens, decode count
//! and context moving together), and where the data says nothing the seed stands instead of the
//! estimate drifting (plain recursive least squares with forgetting winds up there and then
//! diverges by orders of magnitude on an ordinary step). The budget inverts the model with the
//! larger of the fitted prompt-token cost and the cost per token last seen on a long prompt
//! chunk: a step's time is not linear in its prompt tokens (small chunks ride on the weight reads
//! a decode step does anyway, long ones are compute-bound), so a fit over mostly decode steps
//! prices a prompt token at next to nothing and the budget it inverts to is a chunk several times
//! the target (measured: 227 ms steps against a 90 ms target, stalling every answer stream in
//! them); predictions price prompt tokens the same way, so a prefill or a step in flight is not
//! judged shorter than it will take. The fit is constrained to non-negative coefficients (not
//! clamped after the fact, which biased predictions long). Invariant: the coefficients used for
//! prediction are finite, all are ≥ 0 and `per_prefill_token` > 0, so every budget is finite; an
//! update that cannot be solved is skipped.

use crate::config::StepTimeProfile;

/// Number of coefficients: base, per prefill token, per decode request, per context token.
const N: usize = 4;
/// Feature scales keep the least-squares problem well conditioned: prompt tokens in thousands,
/// decode requests in hundreds, context in hundreds of thousands.
const SCALES: [f64; N] = [1.0, 1.0e-3, 1.0e-2, 1.0e-5];
/// Prompt tokens from which a step counts as a long chunk: its time per prompt token (net of
/// what the fit predicts for its decodes and context) is the compute-bound cost the budget
/// inverts with (on an H200 the weight reads hide the compute of ~130 prompt tokens).
pub const LONG_CHUNK_TOKENS: u32 = 256;
/// Weight of the newest long chunk in the running mean of their per-token cost.
const LONG_CHUNK_WEIGHT: f64 = 0.2;
/// Smallest per-prefill-token cost the fit may reach (ms): keeps budgets finite.
const MIN_PER_PREFILL_TOKEN_MS: f64 = 1.0e-6;
/// Weight of the seed in the fit, in (scaled) observations per direction: directions the data
/// has not excited for a while (their weight decays geometrically) fall back to the seed, while
/// a few real observations outweigh even a seed that is off by 100×.
const SEED_WEIGHT: f64 = 1.0e-3;

/// The shape of one step: what its duration depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Prompt tokens computed (prefill chunks, recompute after preemption).
    pub num_prefill_tokens: u32,
    /// Requests decoding one token.
    pub num_decode_requests: u32,
    /// KV context tokens the step read (sum of the scheduled requests' lengths).
    pub num_context_tokens: u64,
}

impl StepShape {
    fn features(self) -> [f64; N] {
        let raw = [
            1.0,
            f64::from(self.num_prefill_tokens),
            f64::from(self.num_decode_requests),
            self.num_context_tokens as f64,
        ];
        std::array::from_fn(|i| raw[i] * SCALES[i])
    }
}

/// One executed step, as the shim observed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// What the step computed.
    pub shape: StepShape,
    /// Measured duration.
    pub duration_ms: f64,
}

/// Coefficients in natural units (ms per unit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCoefficients {
    /// Fixed cost of a step.
    pub base_ms: f64,
    /// Per prompt token computed.
    pub per_prefill_token_ms: f64,
    /// Per request decoding.
    pub per_decode_request_ms: f64,
    /// Per KV context token read.
    pub per_context_token_ms: f64,
}

/// Online-fitted linear step-time model.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimeModel {
    /// The seed, in scaled units: the ridge target.
    seed: [f64; N],
    /// Exponentially weighted `Σ x xᵀ` and `Σ x y` of the observed steps.
    gram: [[f64; N]; N],
    moment: [f64; N],
    /// The fit (non-negative least squares) in natural units, the prompt-token cost floored;
    /// what predictions use.
    coefficients: StepCoefficients,
    forgetting: f64,
    online_fit: bool,
    num_samples: u64,
    /// Running mean of the time per prompt token of long chunks ([`LONG_CHUNK_TOKENS`]), net of
    /// the rest of their step; 0 until one is seen.
    long_chunk_ms_per_token: f64,
    /// The shortest decode-only step measured (ms), the floor of every prediction; 0 until one
    /// is seen.
    shortest_decode_step_ms: f64,
}

impl StepTimeModel {
    /// A model seeded with `profile`.
    pub fn new(profile: &StepTimeProfile) -> Self {
        let natural = [
            profile.base_ms,
            profile.per_prefill_token_ms,
            profile.per_decode_request_ms,
            profile.per_context_token_ms,
        ];
        let seed = std::array::from_fn(|i| natural[i] / SCALES[i]);
        Self {
            coefficients: natural_units(seed),
            seed,
            gram: [[0.0; N]; N],
            moment: [0.0; N],
            forgetting: profile.forgetting,
            online_fit: profile.online_fit,
            num_samples: 0,
            long_chunk_ms_per_token: 0.0,
            shortest_decode_step_ms: 0.0,
        }
    }

    /// Current coefficients in natural units.
    pub fn coefficients(&self) -> StepCoefficients {
        self.coefficients
    }

    /// Samples folded in so far.
    pub fn num_samples(&self) -> u64 {
        self.num_samples
    }

    /// Predicted duration of a step of this shape: never below the shortest decode step
    /// measured, since every step pays what the lightest one did (the weight reads, the launch).
    /// The fit alone can go below it while few steps are in: the first ones, mostly prompt
    /// chunks, are fitted as well by prompt tokens alone, and it then priced the first decode
    /// steps at a tenth of their time or less.
    pub fn predict_ms(&self, shape: StepShape) -> f64 {
        let c = self.coefficients;
        let linear_ms = c.base_ms
            + self.prefill_ms_per_token() * f64::from(shape.num_prefill_tokens)
            + c.per_decode_request_ms * f64::from(shape.num_decode_requests)
            + c.per_context_token_ms * shape.num_context_tokens as f64;
        linear_ms.max(self.shortest_decode_step_ms)
    }

    /// Largest number of prompt tokens a step that already decodes `decodes` (its requests and
    /// context) can add while its predicted time stays within `target_ms` (0 when the decodes
    /// alone do not fit).
    pub fn prefill_tokens_within(&self, target_ms: f64, decodes: StepShape) -> u32 {
        let room_ms = target_ms - self.predict_ms(StepShape { num_prefill_tokens: 0, ..decodes });
        if room_ms <= 0.0 {
            return 0;
        }
        (room_ms / self.prefill_ms_per_token()).floor().min(f64::from(u32::MAX)) as u32
    }

    /// What a prompt token is taken to cost, in predictions and in the budget: the larger of
    /// the fitted cost and the long chunks' own (which overprices the few tokens a short chunk
    /// adds by a fraction of a millisecond; underpricing a long one stalls every answer).
    #[inline]
    fn prefill_ms_per_token(&self) -> f64 {
        self.coefficients.per_prefill_token_ms.max(self.long_chunk_ms_per_token)
    }

    /// The running mean time per prompt token of long chunks (ms), net of the rest of their
    /// steps; 0 until one is seen.
    pub fn long_chunk_ms_per_token(&self) -> f64 {
        self.long_chunk_ms_per_token
    }

    fn observe_long_chunk(&mut self, sample: StepSample) {
        if sample.shape.num_prefill_tokens < LONG_CHUNK_TOKENS {
            return;
        }
        let rest_ms = self.predict_ms(StepShape { num_prefill_tokens: 0, ..sample.shape });
        let per_token_ms =
            (sample.duration_ms - rest_ms).max(0.0) / f64::from(sample.shape.num_prefill_tokens);
        self.long_chunk_ms_per_token = if self.long_chunk_ms_per_token > 0.0 {
            (1.0 - LONG_CHUNK_WEIGHT) * self.long_chunk_ms_per_token + LONG_CHUNK_WEIGHT * per_token_ms
        } else {
            per_token_ms
        };
    }

    /// Folds one observed step in and re-solves the fit.
    pub fn observe(&mut self, sample: StepSample) {
        if !(self.online_fit && sample.duration_ms.is_finite() && sample.duration_ms >= 0.0) {
            return;
        }
        // Before the fit takes this step in: its net time is judged against what the model
        // predicted for the rest of it.
        self.observe_long_chunk(sample);
        if sample.shape.num_prefill_tokens == 0 && sample.shape.num_decode_requests > 0 {
            self.shortest_decode_step_ms = if self.shortest_decode_step_ms > 0.0 {
                self.shortest_decode_step_ms.min(sample.duration_ms)
            } else {
                sample.duration_ms
            };
        }
        let x = sample.shape.features();
        let lambda = self.forgetting;
        let gram: [[f64; N]; N] =
            std::array::from_fn(|i| std::array::from_fn(|j| lambda * self.gram[i][j] + x[i] * x[j]));
        let moment: [f64; N] = std::array::from_fn(|i| lambda * self.moment[i] + x[i] * sample.duration_ms);
        if !gram.iter().flatten().chain(&moment).all(|v| v.is_finite()) {
            return;
        }
        self.gram = gram;
        self.moment = moment;
        self.num_samples += 1;
        // Ridge toward the seed: (G + w I) θ = m + w θ_seed.
        let mut lhs = gram;
        for (i, row) in lhs.iter_mut().enumerate() {
            row[i] += SEED_WEIGHT;
        }
        let rhs: [f64; N] = std::array::from_fn(|i| moment[i] + SEED_WEIGHT * self.seed[i]);
        if let Some(theta) = solve_non_negative(lhs, rhs) {
            self.coefficients = natural_units(theta);
        }
    }
}

/// The minimum of `θᵀ a θ − 2 bᵀ θ` over `θ ≥ 0` for a symmetric positive-definite `a`: the
/// least-squares fit with every coefficient non-negative, or `None` when `a` is not definite.
/// Clamping the unconstrained fit instead is not the constrained fit: on real step shapes
/// (step time flat in the batch until compute-bound, decode count and context moving together)
/// the unconstrained fit trades a negative base for steeper slopes, and zeroing the base alone
/// left the slopes steep — measured on a replay's decode steps: predictions 1.3× the real step
/// time overall and 2× on one step in ten without noise, 3× with a live engine's noise, which
/// the TTFT and TTFAT judgements read as late requests. The optimum is the unconstrained
/// minimum of the coefficients it leaves positive, so with four coefficients every support
/// is tried when the unconstrained fit is not feasible.
fn solve_non_negative(a: [[f64; N]; N], b: [f64; N]) -> Option<[f64; N]> {
    let full = solve_spd(a, b)?;
    if full.iter().all(|&v| v >= 0.0) {
        return Some(full);
    }
    let objective = |x: &[f64; N]| {
        (0..N).map(|i| x[i] * ((0..N).map(|j| a[i][j] * x[j]).sum::<f64>() - 2.0 * b[i])).sum::<f64>()
    };
    let mut best = ([0.0; N], 0.0); // θ = 0 is feasible, objective 0
    for support in 1..(1u32 << N) - 1 {
        let Some(x) = solve_on_support(a, b, support) else { continue };
        if x.iter().all(|&v| v >= 0.0) {
            let value = objective(&x);
            if value < best.1 {
                best = (x, value);
            }
        }
    }
    Some(best.0)
}

/// The unconstrained minimum with the coefficients outside `support` (a bit mask) held at 0.
fn solve_on_support(a: [[f64; N]; N], b: [f64; N], support: u32) -> Option<[f64; N]> {
    let inside = |i: usize| support >> i & 1 == 1;
    // The held coefficients become decoupled unit rows with a zero right-hand side, so the
    // same N×N solve serves every support.
    let sub_a: [[f64; N]; N] = std::array::from_fn(|i| {
        std::array::from_fn(|j| match (inside(i), inside(j)) {
            (true, true) => a[i][j],
            _ => f64::from(u8::from(i == j)),
        })
    });
    let sub_b: [f64; N] = std::array::from_fn(|i| if inside(i) { b[i] } else { 0.0 });
    solve_spd(sub_a, sub_b)
}

/// Solves `a x = b` for a symmetric positive-definite `a` (Cholesky); `None` when it is not.
fn solve_spd(a: [[f64; N]; N], b: [f64; N]) -> Option<[f64; N]> {
    let mut l = [[0.0; N]; N];
    for i in 0..N {
        for j in 0..=i {
            let sum = a[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            if i == j {
                if sum.is_nan() || sum <= 1e-12 {
                    return None;
                }
                l[i][i] = sum.sqrt();
            } else {
                l[i][j] = sum / l[j][j];
            }
        }
    }
    let mut y = [0.0; N];
    for i in 0..N {
        y[i] = (b[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = [0.0; N];
    for i in (0..N).rev() {
        x[i] = (y[i] - (i + 1..N).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

fn natural_units(theta: [f64; N]) -> StepCoefficients {
    StepCoefficients {
        base_ms: theta[0].max(0.0),
        per_prefill_token_ms: (theta[1] * SCALES[1]).max(MIN_PER_PREFILL_TOKEN_MS),
        per_decode_request_ms: (theta[2] * SCALES[2]).max(0.0),
        per_context_token_ms: (theta[3] * SCALES[3]).max(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(online_fit: bool) -> StepTimeProfile {
        StepTimeProfile {
            base_ms: 5.0,
            per_prefill_token_ms: 0.05,
            per_decode_request_ms: 0.01,
            per_context_token_ms: 1e-5,
            online_fit,
            forgetting: 0.98,
        }
    }

    fn shape(num_prefill_tokens: u32, num_decode_requests: u32, num_context_tokens: u64) -> StepShape {
        StepShape { num_prefill_tokens, num_decode_requests, num_context_tokens }
    }

    #[test]
    fn seed_predicts_and_inverts() {
        let m = StepTimeModel::new(&profile(false));
        assert!((m.predict_ms(shape(100, 100, 100_000)) - 12.0).abs() < 1e-9);
        // 100 decodes over 100k context take 7 ms; 4 ms more room is 80 prompt tokens.
        assert_eq!(m.prefill_tokens_within(11.0, shape(0, 100, 100_000)), 80);
        assert_eq!(m.prefill_tokens_within(4.0, shape(0, 0, 0)), 0);
    }

    #[test]
    fn online_fit_recovers_true_coefficients() {
        let mut m = StepTimeModel::new(&profile(true));
        let truth = |s: StepShape| {
            2.0 + 0.01 * f64::from(s.num_prefill_tokens)
                + 0.03 * f64::from(s.num_decode_requests)
                + 2e-5 * s.num_context_tokens as f64
        };
        let mut state = 12345u64;
        for _ in 0..4000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let s = shape((state >> 40) as u32 % 4096, (state >> 28) as u32 % 256, (state >> 8) % 400_000);
            m.observe(StepSample { shape: s, duration_ms: truth(s) });
        }
        let c = m.coefficients();
        assert!((c.base_ms - 2.0).abs() < 0.05, "{c:?}");
        assert!((c.per_prefill_token_ms - 0.01).abs() < 1e-4, "{c:?}");
        assert!((c.per_decode_request_ms - 0.03).abs() < 1e-3, "{c:?}");
        assert!((c.per_context_token_ms - 2e-5).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn poorly_excited_steps_never_wind_the_fit_up() {
        // Long stretches of near-identical decode steps, then a rare prompt chunk: the fit must
        // keep predicting both within a few percent instead of diverging.
        let mut m = StepTimeModel::new(&profile(true));
        let truth = |s: StepShape| {
            18.0 + 0.12 * f64::from(s.num_prefill_tokens.saturating_sub(150))
                + 0.04 * f64::from(s.num_decode_requests)
                + 7e-5 * s.num_context_tokens as f64
        };
        let mut state = 7u64;
        for i in 0..50_000u64 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let decodes = 10 + (i / 5_000) as u32;
            let prefill = if i % 997 == 0 { 200 + (state >> 50) as u32 % 2_000 } else { 0 };
            let s = shape(prefill, decodes, u64::from(decodes) * 2_000 + (state >> 40) % 500);
            m.observe(StepSample { shape: s, duration_ms: truth(s) });
            let c = m.coefficients();
            assert!(c.per_decode_request_ms < 1.0 && c.per_prefill_token_ms < 1.0, "step {i}: {c:?}");
        }
        let decode = shape(0, 19, 38_000);
        let err = (m.predict_ms(decode) - truth(decode)).abs() / truth(decode);
        assert!(err < 0.05, "decode prediction off by {err}");
    }

    #[test]
    fn the_budget_prices_prompt_tokens_at_what_long_chunks_cost() {
        // A roofline step: 5 ms of weight reads hide the compute of 200 prompt tokens at
        // 0.025 ms each; past that every prompt token costs its compute. A few long chunks,
        // then a long stretch of decode steps with short chunks, where prompt tokens are free
        // (the fit forgets the long ones and drifts, as it did on the Mooncake trace).
        let truth = |s: StepShape| {
            (0.025 * f64::from(s.num_prefill_tokens)).max(5.0) + 0.01 * f64::from(s.num_decode_requests)
        };
        let mut m = StepTimeModel::new(&profile(true));
        for i in 0..1_000u32 {
            let prefill = if i < 5 { 4_000 } else { i % 200 };
            let s = shape(prefill, 16, 0);
            m.observe(StepSample { shape: s, duration_ms: truth(s) });
        }
        // The fit prices a prompt token well below its compute-bound cost; a 90 ms target
        // inverted with it would be a chunk that takes far longer.
        let fitted = m.coefficients().per_prefill_token_ms;
        assert!(fitted < 0.0125, "fitted {fitted}");
        let chunk = m.long_chunk_ms_per_token();
        assert!((chunk - 0.025).abs() < 0.003, "long chunks {chunk}");
        let decodes = shape(0, 16, 0);
        let tokens = m.prefill_tokens_within(90.0, decodes);
        let step_ms = truth(shape(tokens, 16, 0));
        assert!((80.0..=95.0).contains(&step_ms), "{tokens} tokens take {step_ms} ms");
        // Short chunks alone never set it.
        let mut short = StepTimeModel::new(&profile(true));
        short.observe(StepSample { shape: shape(LONG_CHUNK_TOKENS - 1, 16, 0), duration_ms: 50.0 });
        assert_eq!(short.long_chunk_ms_per_token(), 0.0);
    }

    /// Uniform in [0, 1) from a linear congruential generator: the tests stay deterministic.
    fn uniform(state: &mut u64) -> f64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn noisy_steps_flat_in_the_batch_are_predicted_without_bias() {
        // A decode step is flat in its batch until compute-bound (the weight reads dominate),
        // its context grows with the batch, and each step is ±40 % off at random, as steps on a
        // shared machine are. The unconstrained fit takes a negative base; clamped, its
        // predictions ran 2.5× the real steps overall. The constrained fit stays unbiased.
        let truth = |s: StepShape| {
            18.0 + (0.2 * (f64::from(s.num_decode_requests) - 100.0)).max(0.0)
                + 7e-6 * s.num_context_tokens as f64
        };
        let mut m = StepTimeModel::new(&profile(true));
        let (mut state, mut real_ms, mut predicted_ms) = (11u64, 0.0, 0.0);
        for i in 0..20_000u32 {
            let decodes = 1 + (139.0 * (f64::from(i) / 700.0).sin().abs()) as u32;
            let context = u64::from(decodes) * 1_500 + (uniform(&mut state) * 3_000.0) as u64;
            let s = shape(0, decodes, context);
            let duration_ms = truth(s) * (0.6 + 0.8 * uniform(&mut state));
            if i >= 10_000 {
                real_ms += duration_ms;
                predicted_ms += m.predict_ms(s);
            }
            m.observe(StepSample { shape: s, duration_ms });
        }
        let ratio = real_ms / predicted_ms;
        assert!((0.95..=1.05).contains(&ratio), "real / predicted = {ratio}");
    }

    #[test]
    fn the_fit_is_the_least_squares_optimum_over_non_negative_coefficients() {
        // Karush-Kuhn-Tucker: the gradient of the ridge objective is zero along every positive
        // coefficient and points outward (≥ 0) at every coefficient held at zero.
        let mut m = StepTimeModel::new(&profile(true));
        let mut state = 3u64;
        for i in 0..3_000u32 {
            let decodes = 1 + (i / 30) % 120;
            let prefill = if i % 50 == 0 { 300 + (uniform(&mut state) * 2_000.0) as u32 } else { 0 };
            let s = shape(prefill, decodes, u64::from(decodes) * 900);
            let duration_ms = (18.0f64).max(0.3 * f64::from(decodes)) + 0.1 * f64::from(prefill);
            m.observe(StepSample { shape: s, duration_ms: duration_ms * (0.8 + 0.4 * uniform(&mut state)) });
            let c = m.coefficients();
            let natural =
                [c.base_ms, c.per_prefill_token_ms, c.per_decode_request_ms, c.per_context_token_ms];
            let theta: [f64; N] = std::array::from_fn(|k| natural[k] / SCALES[k]);
            for (k, &coefficient) in natural.iter().enumerate() {
                let gradient = (0..N)
                    .map(|j| (m.gram[k][j] + if j == k { SEED_WEIGHT } else { 0.0 }) * theta[j])
                    .sum::<f64>()
                    - (m.moment[k] + SEED_WEIGHT * m.seed[k]);
                let scale = m.moment[k].abs().max(1.0);
                if coefficient > MIN_PER_PREFILL_TOKEN_MS {
                    assert!(
                        gradient.abs() < 1e-6 * scale,
                        "step {i}, coefficient {k}: gradient {gradient} at {c:?}"
                    );
                } else {
                    assert!(
                        gradient > -1e-6 * scale,
                        "step {i}, coefficient {k}: gradient {gradient} at {c:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn after_prompt_chunks_alone_a_decode_step_is_never_priced_below_the_shortest_measured() {
        // The first steps of a server are prompt chunks, fitted exactly by prompt tokens and
        // context alone (base 0); the decode steps after them must not be priced near zero.
        let mut m = StepTimeModel::new(&profile(true));
        for (prefill, context) in [(1_759, 1_759), (1_757, 3_516), (580, 4_096)] {
            let s = shape(prefill, 0, context);
            m.observe(StepSample { shape: s, duration_ms: 18.0 + 0.1 * f64::from(prefill) });
        }
        m.observe(StepSample { shape: shape(0, 1, 4_097), duration_ms: 12.2 });
        assert!(m.predict_ms(shape(0, 3, 5_800)) >= 12.2, "{:?}", m.coefficients());
        // A prompt step never lowers the floor, and a faster decode step does.
        m.observe(StepSample { shape: shape(300, 2, 6_000), duration_ms: 5.0 });
        assert!(m.predict_ms(shape(0, 0, 0)) >= 12.2);
        m.observe(StepSample { shape: shape(0, 1, 100), duration_ms: 9.0 });
        assert!(m.predict_ms(shape(0, 0, 0)) >= 9.0 && m.predict_ms(shape(0, 0, 0)) < 12.2);
    }

    #[test]
    fn garbage_samples_never_break_the_invariant() {
        let mut m = StepTimeModel::new(&profile(true));
        for d in [f64::NAN, -1.0, f64::INFINITY, 0.0, 1e12] {
            m.observe(StepSample { shape: shape(1, 1, 0), duration_ms: d });
        }
        let c = m.coefficients();
        assert!(c.base_ms.is_finite() && c.base_ms >= 0.0 && c.per_prefill_token_ms > 0.0);
        assert!(c.per_decode_request_ms >= 0.0 && c.per_context_token_ms >= 0.0);
        assert!(m.prefill_tokens_within(50.0, shape(0, 10, 1000)) < u32::MAX);
    }
}
