//! The step-time model: `step_ms = base + per_token · scheduled_tokens + per_ctx · context_tokens`,
//! seeded from a profile and refitted online by recursive least squares with forgetting. It turns
//! a latency target into a token budget. Invariant: the coefficients used for prediction are
//! finite, `base` and `per_ctx` are ≥ 0 and `per_token` > 0, so every budget is finite; a fit
//! that drifts outside that is clamped, and a singular update is skipped.

use crate::config::StepTimeProfile;

/// Feature scales keep the least-squares problem well conditioned: tokens in thousands, context
/// in hundreds of thousands.
const TOKEN_SCALE: f64 = 1.0e-3;
const CONTEXT_SCALE: f64 = 1.0e-5;
/// Smallest per-token cost the fit may reach (ms): keeps budgets finite.
const MIN_PER_TOKEN_MS: f64 = 1.0e-6;
/// Initial covariance: how loosely the seed is held, relative to one observation.
const PRIOR_VARIANCE: f64 = 10.0;

/// One executed step, as the shim observed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Tokens scheduled in the step.
    pub num_scheduled_tokens: u32,
    /// KV context tokens the step read (sum of the scheduled requests' lengths).
    pub num_context_tokens: u64,
    /// Measured duration.
    pub duration_ms: f64,
}

/// Online-fitted linear step-time model.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimeModel {
    theta: [f64; 3],
    /// `theta` clamped into the invariant's range, in natural units; what predictions use.
    coefficients: (f64, f64, f64),
    covariance: [[f64; 3]; 3],
    forgetting: f64,
    online_fit: bool,
    num_samples: u64,
}

impl StepTimeModel {
    /// A model seeded with `profile`.
    pub fn new(profile: &StepTimeProfile) -> Self {
        let mut covariance = [[0.0; 3]; 3];
        for (i, row) in covariance.iter_mut().enumerate() {
            row[i] = PRIOR_VARIANCE;
        }
        let theta = [
            profile.base_ms,
            profile.per_token_ms / TOKEN_SCALE,
            profile.per_context_token_ms / CONTEXT_SCALE,
        ];
        Self {
            coefficients: natural_units(theta),
            theta,
            covariance,
            forgetting: profile.forgetting,
            online_fit: profile.online_fit,
            num_samples: 0,
        }
    }

    /// Current coefficients in natural units: `(base_ms, per_token_ms, per_context_token_ms)`.
    pub fn coefficients(&self) -> (f64, f64, f64) {
        self.coefficients
    }

    /// Samples folded in so far.
    pub fn num_samples(&self) -> u64 {
        self.num_samples
    }

    /// Predicted duration of a step.
    pub fn predict_ms(&self, num_tokens: u32, num_context_tokens: u64) -> f64 {
        let (base, per_token, per_ctx) = self.coefficients();
        base + per_token * f64::from(num_tokens) + per_ctx * num_context_tokens as f64
    }

    /// Largest token count whose predicted step time stays within `target_ms` (0 when even an
    /// empty step would not).
    pub fn tokens_within(&self, target_ms: f64, num_context_tokens: u64) -> u32 {
        let (base, per_token, per_ctx) = self.coefficients();
        let room_ms = target_ms - base - per_ctx * num_context_tokens as f64;
        if room_ms <= 0.0 {
            return 0;
        }
        (room_ms / per_token).floor().min(f64::from(u32::MAX)) as u32
    }

    /// Folds one observed step in (recursive least squares with forgetting).
    pub fn observe(&mut self, sample: StepSample) {
        if !(self.online_fit && sample.duration_ms.is_finite() && sample.duration_ms >= 0.0) {
            return;
        }
        let x = [
            1.0,
            f64::from(sample.num_scheduled_tokens) * TOKEN_SCALE,
            sample.num_context_tokens as f64 * CONTEXT_SCALE,
        ];
        let p = &self.covariance;
        let px = [dot(&p[0], &x), dot(&p[1], &x), dot(&p[2], &x)];
        let denom = self.forgetting + dot(&x, &px);
        if !(denom.is_finite() && denom > 1e-12) {
            return;
        }
        let gain = [px[0] / denom, px[1] / denom, px[2] / denom];
        let error = sample.duration_ms - dot(&self.theta, &x);
        let mut theta = self.theta;
        for (t, g) in theta.iter_mut().zip(gain) {
            *t += g * error;
        }
        let mut next = [[0.0; 3]; 3];
        for (i, row) in next.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = (p[i][j] - gain[i] * px[j]) / self.forgetting;
            }
        }
        if theta.iter().chain(next.iter().flatten()).all(|v| v.is_finite()) {
            self.theta = theta;
            self.coefficients = natural_units(theta);
            self.covariance = next;
            self.num_samples += 1;
        }
    }
}

fn natural_units(theta: [f64; 3]) -> (f64, f64, f64) {
    (theta[0].max(0.0), (theta[1] * TOKEN_SCALE).max(MIN_PER_TOKEN_MS), (theta[2] * CONTEXT_SCALE).max(0.0))
}

fn dot(a: &[f64; 3], b: &[f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(online_fit: bool) -> StepTimeProfile {
        StepTimeProfile {
            base_ms: 5.0,
            per_token_ms: 0.05,
            per_context_token_ms: 1e-5,
            online_fit,
            forgetting: 0.98,
        }
    }

    #[test]
    fn seed_predicts_and_inverts() {
        let m = StepTimeModel::new(&profile(false));
        assert!((m.predict_ms(100, 100_000) - 11.0).abs() < 1e-9);
        assert_eq!(m.tokens_within(11.0, 100_000), 100);
        assert_eq!(m.tokens_within(4.0, 0), 0);
    }

    #[test]
    fn online_fit_recovers_true_coefficients() {
        let mut m = StepTimeModel::new(&profile(true));
        let truth = |tokens: u32, ctx: u64| 2.0 + 0.01 * f64::from(tokens) + 2e-5 * ctx as f64;
        let mut state = 12345u64;
        for _ in 0..3000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let tokens = 1 + (state >> 40) as u32 % 4096;
            let ctx = (state >> 20) % 400_000;
            m.observe(StepSample {
                num_scheduled_tokens: tokens,
                num_context_tokens: ctx,
                duration_ms: truth(tokens, ctx),
            });
        }
        let (base, per_token, per_ctx) = m.coefficients();
        assert!((base - 2.0).abs() < 0.05, "base {base}");
        assert!((per_token - 0.01).abs() < 1e-4, "per_token {per_token}");
        assert!((per_ctx - 2e-5).abs() < 1e-6, "per_ctx {per_ctx}");
    }

    #[test]
    fn garbage_samples_never_break_the_invariant() {
        let mut m = StepTimeModel::new(&profile(true));
        for d in [f64::NAN, -1.0, f64::INFINITY, 0.0, 1e12] {
            m.observe(StepSample { num_scheduled_tokens: 1, num_context_tokens: 0, duration_ms: d });
        }
        let (base, per_token, per_ctx) = m.coefficients();
        assert!(base.is_finite() && base >= 0.0 && per_token > 0.0 && per_ctx >= 0.0);
        assert!(m.tokens_within(50.0, 1000) < u32::MAX);
    }
}
