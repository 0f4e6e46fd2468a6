//! Remaining-length prediction for heavy-tailed phase lengths. Lengths go into a histogram of
//! geometric buckets (seeded from a prior sample, then fed every finished request); the
//! prediction is the mean residual life `E[L − a | L > a]` given the `a` tokens already
//! generated. Under a heavy tail that residual grows with `a` — the shape that makes
//! least-attained-service a good stand-in for shortest-remaining-first. Invariant: every
//! prediction is a finite number of tokens ≥ 1, and a query costs O(1) (the per-bucket table is
//! rebuilt at most once per observation batch).

const NUM_BUCKETS: usize = 64;
/// Bucket `b` holds lengths in `[RATIO^b, RATIO^(b+1))`, RATIO = 2^(1/4): 64 buckets span 1…65,536.
const LOG2_RATIO: f64 = 0.25;
/// Past the largest observed length, assume a Pareto tail with index 2: residual = attained.
const TAIL_RESIDUAL_PER_ATTAINED: f64 = 1.0;
/// Weight of old observations after each new one: an effective memory of ~2,000 requests, so the
/// predictor follows the day's shifting mix (`traces/REASONING.md` §1a).
const DECAY: f64 = 0.9995;

/// Online mean-residual-life estimator over token lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidualLength {
    weight: [f64; NUM_BUCKETS],
    weighted_len: [f64; NUM_BUCKETS],
    /// Per bucket: expected residual when the attained length is the bucket's lower edge.
    residual_at_bucket: [f64; NUM_BUCKETS],
    /// Per bucket: `(Σ_{j≥b} w·len, Σ_{j≥b} w)` tail sums.
    tail: [(f64, f64); NUM_BUCKETS],
    dirty: bool,
}

fn bucket_of(len: f64) -> usize {
    if len < 1.0 {
        return 0;
    }
    ((len.log2() / LOG2_RATIO) as usize).min(NUM_BUCKETS - 1)
}

impl ResidualLength {
    /// An estimator seeded with `prior` (lengths in tokens, each weighted 1).
    pub fn new(prior: &[u32]) -> Self {
        let mut p = Self {
            weight: [0.0; NUM_BUCKETS],
            weighted_len: [0.0; NUM_BUCKETS],
            residual_at_bucket: [1.0; NUM_BUCKETS],
            tail: [(0.0, 0.0); NUM_BUCKETS],
            dirty: true,
        };
        for &len in prior {
            p.add(f64::from(len.max(1)), 1.0);
        }
        p.rebuild();
        p
    }

    /// Feeds one finished request's length.
    pub fn observe(&mut self, len_tokens: u32) {
        for (w, wl) in self.weight.iter_mut().zip(self.weighted_len.iter_mut()) {
            *w *= DECAY;
            *wl *= DECAY;
        }
        self.add(f64::from(len_tokens.max(1)), 1.0);
    }

    /// Expected tokens still to come after `attained_tokens`. Call [`Self::refresh`] after
    /// observations first; a stale table only makes the estimate a little older.
    pub fn expected_remaining(&self, attained_tokens: u32) -> f64 {
        let a = f64::from(attained_tokens);
        let b = bucket_of(a.max(1.0));
        let (sum_len, sum_w) = self.tail[b];
        if sum_w <= 1e-12 {
            return (a * TAIL_RESIDUAL_PER_ATTAINED).max(1.0);
        }
        let mean_beyond = sum_len / sum_w;
        if mean_beyond <= a {
            // Attained length already at the mean of its own bucket: fall back to the tail law.
            return (a * TAIL_RESIDUAL_PER_ATTAINED).max(self.residual_at_bucket[b]).max(1.0);
        }
        (mean_beyond - a).max(1.0)
    }

    /// Mean length (the residual at zero).
    pub fn mean(&self) -> f64 {
        self.expected_remaining(0)
    }

    /// Rebuilds the tail sums if observations arrived since the last rebuild.
    pub fn refresh(&mut self) {
        if self.dirty {
            self.rebuild();
        }
    }

    fn add(&mut self, len: f64, w: f64) {
        let b = bucket_of(len);
        self.weight[b] += w;
        self.weighted_len[b] += w * len;
        self.dirty = true;
    }

    fn rebuild(&mut self) {
        let mut sum_len = 0.0;
        let mut sum_w = 0.0;
        for b in (0..NUM_BUCKETS).rev() {
            sum_len += self.weighted_len[b];
            sum_w += self.weight[b];
            self.tail[b] = (sum_len, sum_w);
            let lower_edge = (b as f64 * LOG2_RATIO).exp2();
            self.residual_at_bucket[b] =
                if sum_w > 1e-12 { (sum_len / sum_w - lower_edge).max(1.0) } else { 1.0 };
        }
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_grows_with_attained_under_a_heavy_tail() {
        let p = ResidualLength::new(&[100, 200, 400, 800, 1600, 3200, 6400, 12800]);
        let early = p.expected_remaining(0);
        let late = p.expected_remaining(3000);
        assert!(early > 1.0);
        assert!(late > 1000.0, "late residual {late}");
        assert!(p.expected_remaining(100_000) >= 100_000.0);
    }

    #[test]
    fn observations_move_the_mean() {
        let mut p = ResidualLength::new(&[100]);
        for _ in 0..5000 {
            p.observe(1000);
        }
        p.refresh();
        let mean = p.mean();
        assert!((900.0..1200.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn predictions_are_finite_and_at_least_one() {
        let p = ResidualLength::new(&[1]);
        for a in [0, 1, 2, 10, u32::MAX] {
            let r = p.expected_remaining(a);
            assert!(r.is_finite() && r >= 1.0, "{a} -> {r}");
        }
    }
}
