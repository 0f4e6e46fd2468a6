//! Remaining-length prediction for heavy-tailed phase lengths. Lengths go into a histogram of
//! geometric buckets (seeded from a prior sample, then fed every finished request); the
//! prediction is the mean residual life `E[L − a | L > a]` given the `a` tokens already
//! generated. Under a heavy tail that residual grows with `a` — the shape that makes
//! least-attained-service a good stand-in for shortest-remaining-first. Invariant: every
//! prediction is a finite number of tokens ≥ 1, and a query costs O(1) (the per-bucket table is
//! rebuilt at most once per observation batch).

/// Four buckets per power of two (edges at `2^e · (1 + k/4)`): 128 buckets span 1…2^32.
const NUM_BUCKETS: usize = 128;
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
    /// Per bucket: mean length of the lengths in this bucket and above (`None`: no weight there).
    tail_mean: [Option<f64>; NUM_BUCKETS],
    dirty: bool,
}

/// Integer bucketing: the exponent and the two bits after the leading one. No `log2` on the hot
/// path (the per-step plan queries this for every thinking request).
fn bucket_of(len: u32) -> usize {
    let len = len.max(1);
    let exponent = 31 - len.leading_zeros();
    let quarter = if exponent >= 2 { (len >> (exponent - 2)) & 3 } else { (len << (2 - exponent)) & 3 };
    (exponent * 4 + quarter) as usize
}

/// Smallest length in bucket `b`.
fn lower_edge(b: usize) -> f64 {
    let exponent = (b / 4) as i32;
    f64::from(2.0f32.powi(exponent)) * (1.0 + (b % 4) as f64 / 4.0)
}

impl ResidualLength {
    /// An estimator seeded with `prior` (lengths in tokens, each weighted 1).
    pub fn new(prior: &[u32]) -> Self {
        let mut p = Self {
            weight: [0.0; NUM_BUCKETS],
            weighted_len: [0.0; NUM_BUCKETS],
            residual_at_bucket: [1.0; NUM_BUCKETS],
            tail_mean: [None; NUM_BUCKETS],
            dirty: true,
        };
        for &len in prior {
            p.add(len, 1.0);
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
        self.add(len_tokens, 1.0);
    }

    /// Expected tokens still to come after `attained_tokens`. Call [`Self::refresh`] after
    /// observations first; a stale table only makes the estimate a little older.
    pub fn expected_remaining(&self, attained_tokens: u32) -> f64 {
        let a = f64::from(attained_tokens);
        let b = bucket_of(attained_tokens);
        let Some(mean_beyond) = self.tail_mean[b] else {
            return (a * TAIL_RESIDUAL_PER_ATTAINED).max(1.0);
        };
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

    fn add(&mut self, len: u32, w: f64) {
        let b = bucket_of(len);
        self.weight[b] += w;
        self.weighted_len[b] += w * f64::from(len.max(1));
        self.dirty = true;
    }

    fn rebuild(&mut self) {
        let mut sum_len = 0.0;
        let mut sum_w = 0.0;
        for b in (0..NUM_BUCKETS).rev() {
            sum_len += self.weighted_len[b];
            sum_w += self.weight[b];
            self.tail_mean[b] = (sum_w > 1e-12).then(|| sum_len / sum_w);
            self.residual_at_bucket[b] =
                if sum_w > 1e-12 { (sum_len / sum_w - lower_edge(b)).max(1.0) } else { 1.0 };
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
    fn buckets_are_monotone_and_match_their_edges() {
        let mut last = 0;
        for len in 1..100_000u32 {
            let b = bucket_of(len);
            assert!(b >= last && b < NUM_BUCKETS);
            assert!(lower_edge(b) <= f64::from(len), "{len} in bucket {b}");
            last = b;
        }
        assert_eq!(bucket_of(u32::MAX), NUM_BUCKETS - 1);
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
