//! Remaining-length prediction for heavy-tailed phase lengths, as a distribution. Lengths go into
//! a histogram of geometric buckets: the configured prior sample counts as `prior_weight`
//! pseudo-observations in all, every finished request as one, and older observations decay with
//! a memory of `memory_requests`, so this server's own traffic follows a shifting mix. The prior
//! can also fade on its own (`prior_memory_requests`, off by default): a tail it keeps skews every
//! mean of a server far from it (a production prior's 700-token answers, 1 % of the weight, add 7
//! tokens to each mean residual of a server whose answers are 15 tokens long), but it is also what
//! corrects for the long requests that have not finished yet — the first completions a server
//! sees are its short ones (measured: fading it after 50 completions cost the Mooncake replay
//! 2.5 % of its goodput). From the histogram it answers, given the `a` tokens a
//! request has already generated: the mean residual `E[L − a | L > a]` (KV sizing), a quantile of
//! `L − a | L > a` (the remaining work a deadline decision plans for) and the probability that
//! the rest fits in `n` more tokens (whether the request can still make its deadline). Within a
//! bucket lengths are taken as spread log-uniformly; past the largest observed length a Pareto
//! tail of index 2 is assumed (residual = attained). Invariants: every prediction is finite, a
//! residual is ≥ 1 token, a probability lies in [0, 1] and is monotone in `n`; a query costs
//! O(1) with no allocation (the per-bucket tables are rebuilt at most once per plan).

/// Four buckets per power of two (edges at `2^e · (1 + k/4)`): 128 buckets span 1…2^32.
const NUM_BUCKETS: usize = 128;
/// Past the largest observed length, assume a Pareto tail with index 2: residual = attained.
const TAIL_RESIDUAL_PER_ATTAINED: f64 = 1.0;
/// Weight below which a bucket (or a tail) counts as empty.
const EMPTY: f64 = 1e-12;

/// How the prior and the server's own observations are weighed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningRate {
    /// Total weight of the prior sample, in pseudo-observations.
    pub prior_weight: f64,
    /// Effective memory in finished requests: each new observation multiplies the weight of
    /// everything before it (the prior included) by `1 − 1/memory_requests`.
    pub memory_requests: f64,
    /// The prior's own memory, if any: each observation also multiplies the prior's weight by
    /// `1 − 1/prior_memory_requests`, so after a few times this many finished requests of the
    /// class the server's own lengths alone make the prediction. `None`: the prior decays only
    /// with `memory_requests`, like any observation.
    pub prior_memory_requests: Option<f64>,
}

impl Default for LearningRate {
    fn default() -> Self {
        Self { prior_weight: 10.0, memory_requests: 2000.0, prior_memory_requests: None }
    }
}

/// Online estimator of a length distribution and its residuals.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidualLength {
    /// Prior and observations together, per bucket (what every query reads; rebuilt).
    weight: [f64; NUM_BUCKETS],
    weighted_len: [f64; NUM_BUCKETS],
    /// The server's own observations, per bucket.
    observed_weight: [f64; NUM_BUCKETS],
    observed_len: [f64; NUM_BUCKETS],
    /// What is left of the prior, per bucket.
    prior_weight: [f64; NUM_BUCKETS],
    prior_len: [f64; NUM_BUCKETS],
    /// Requests still running, per bucket of what they have generated so far: each says its
    /// length is longer than that (a censored observation), the evidence that keeps the first
    /// completions — a fresh server's short ones — from passing for the whole distribution.
    censored: [f64; NUM_BUCKETS],
    /// Decay of every weight per observation.
    decay: f64,
    /// Extra decay of the prior's weight per observation.
    prior_decay: f64,
    /// Per bucket: total weight of this bucket and every one above (the survival at its edge).
    survival: [f64; NUM_BUCKETS],
    /// Per bucket: mean length of the lengths in this bucket and above (`None`: no weight there).
    tail_mean: [Option<f64>; NUM_BUCKETS],
    /// Per bucket: the median and p90 of `L − e | L > e` at the bucket's lower edge `e`, and its
    /// quantile at the viability level (see [`Quantile::Viable`]).
    residual_p50: [f64; NUM_BUCKETS],
    residual_p90: [f64; NUM_BUCKETS],
    residual_viable: [f64; NUM_BUCKETS],
    /// The level of [`Quantile::Viable`], in (0, 1).
    viable_level: f64,
    /// Index of the highest bucket with weight (`None` when empty).
    top: Option<usize>,
    dirty: bool,
    /// `ln` of every bucket's lower edge, then of the last bucket's upper edge: the survival
    /// query interpolates in log space on the per-step path, and two of its three logarithms are
    /// of these constants.
    ln_edges: [f64; NUM_BUCKETS + 1],
}

/// Integer bucketing: the exponent and the two bits after the leading one. No `log2` on the hot
/// path (the per-step plan queries this for every thinking request).
fn bucket_of(len: u32) -> usize {
    let len = len.max(1);
    let exponent = 31 - len.leading_zeros();
    let quarter = if exponent >= 2 { (len >> (exponent - 2)) & 3 } else { (len << (2 - exponent)) & 3 };
    (exponent * 4 + quarter) as usize
}

/// Smallest length of every bucket: `2^exponent · (1 + quarter/4)`, exact in `f64`. A table
/// because the per-step plan reads an edge for every request it judges, and the integer-to-float
/// conversion and arithmetic cost more than the load.
const LOWER_EDGES: [f64; NUM_BUCKETS] = {
    let mut edges = [0.0; NUM_BUCKETS];
    let mut b = 0;
    while b < NUM_BUCKETS {
        edges[b] = (1u64 << (b / 4)) as f64 * (1.0 + (b % 4) as f64 / 4.0);
        b += 1;
    }
    edges
};

/// Smallest length in bucket `b`.
fn lower_edge(b: usize) -> f64 {
    LOWER_EDGES[b]
}

/// Smallest length of the next bucket.
fn upper_edge(b: usize) -> f64 {
    if b + 1 < NUM_BUCKETS {
        lower_edge(b + 1)
    } else {
        lower_edge(b) * 1.25
    }
}

/// Quantiles the plan asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantile {
    /// The median.
    P50,
    /// The 90th percentile.
    P90,
    /// The quantile at the estimator's viability level ([`ResidualLength::set_viable_level`],
    /// default [`DEFAULT_VIABLE_LEVEL`]): a request with at least this much room left still
    /// finishes in it with that probability, so comparing the room with it answers "is the
    /// probability of finishing in time at least the level?" with one table lookup.
    Viable,
}

/// The default level of [`Quantile::Viable`].
pub const DEFAULT_VIABLE_LEVEL: f64 = 0.1;

impl ResidualLength {
    /// An estimator seeded with `prior` (lengths in tokens) at the default learning rate.
    pub fn new(prior: &[u32]) -> Self {
        Self::with_rate(prior, LearningRate::default())
    }

    /// An estimator seeded with `prior` weighing `rate.prior_weight` in all.
    pub fn with_rate(prior: &[u32], rate: LearningRate) -> Self {
        let mut p = Self {
            weight: [0.0; NUM_BUCKETS],
            weighted_len: [0.0; NUM_BUCKETS],
            observed_weight: [0.0; NUM_BUCKETS],
            observed_len: [0.0; NUM_BUCKETS],
            prior_weight: [0.0; NUM_BUCKETS],
            prior_len: [0.0; NUM_BUCKETS],
            censored: [0.0; NUM_BUCKETS],
            decay: 1.0 - 1.0 / rate.memory_requests.max(1.0),
            prior_decay: rate.prior_memory_requests.map_or(1.0, |m| 1.0 - 1.0 / m.max(1.0)),
            survival: [0.0; NUM_BUCKETS],
            tail_mean: [None; NUM_BUCKETS],
            residual_p50: [1.0; NUM_BUCKETS],
            residual_p90: [1.0; NUM_BUCKETS],
            residual_viable: [1.0; NUM_BUCKETS],
            viable_level: DEFAULT_VIABLE_LEVEL,
            top: None,
            dirty: true,
            ln_edges: std::array::from_fn(|b| {
                if b < NUM_BUCKETS { lower_edge(b) } else { upper_edge(NUM_BUCKETS - 1) }.ln()
            }),
        };
        let each = if prior.is_empty() { 0.0 } else { rate.prior_weight / prior.len() as f64 };
        for &len in prior {
            let b = bucket_of(len);
            p.prior_weight[b] += each;
            p.prior_len[b] += each * f64::from(len.max(1));
        }
        p.rebuild();
        p
    }

    /// Sets the level of [`Quantile::Viable`] (clamped into [0.001, 0.999]); the table follows
    /// at the next [`Self::refresh`].
    pub fn set_viable_level(&mut self, level: f64) {
        let level = if level.is_nan() { DEFAULT_VIABLE_LEVEL } else { level.clamp(0.001, 0.999) };
        if level != self.viable_level {
            self.viable_level = level;
            self.dirty = true;
        }
    }

    /// Feeds one finished request's length.
    pub fn observe(&mut self, len_tokens: u32) {
        let decay = self.decay;
        for (w, wl) in self.observed_weight.iter_mut().zip(self.observed_len.iter_mut()) {
            *w *= decay;
            *wl *= decay;
        }
        let prior_decay = decay * self.prior_decay;
        for (w, wl) in self.prior_weight.iter_mut().zip(self.prior_len.iter_mut()) {
            *w *= prior_decay;
            *wl *= prior_decay;
        }
        let b = bucket_of(len_tokens);
        self.observed_weight[b] += 1.0;
        self.observed_len[b] += f64::from(len_tokens.max(1));
        self.dirty = true;
    }

    /// Replaces the censored observations: the lengths generated so far by the requests still
    /// running (a length of 0 says nothing and is left out). Takes effect at the next
    /// [`Self::refresh`].
    pub fn set_censored(&mut self, attained_tokens: impl IntoIterator<Item = u32>) {
        let mut censored = [0.0; NUM_BUCKETS];
        for len in attained_tokens.into_iter().filter(|&len| len > 0) {
            censored[bucket_of(len)] += 1.0;
        }
        if censored != self.censored {
            self.censored = censored;
            self.dirty = true;
        }
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
            return (a * TAIL_RESIDUAL_PER_ATTAINED).max(self.residual_p50[b]).max(1.0);
        }
        (mean_beyond - a).max(1.0)
    }

    /// The `q` quantile of the tokens still to come after `attained_tokens` (O(1): read at the
    /// lower edge of the attained length's bucket, less what the request is already past it).
    pub fn remaining_quantile(&self, attained_tokens: u32, q: Quantile) -> f64 {
        let a = f64::from(attained_tokens);
        let b = bucket_of(attained_tokens);
        if self.tail_mean[b].is_none() {
            return (a * TAIL_RESIDUAL_PER_ATTAINED).max(1.0);
        }
        let at_edge = match q {
            Quantile::P50 => self.residual_p50[b],
            Quantile::P90 => self.residual_p90[b],
            Quantile::Viable => self.residual_viable[b],
        };
        (at_edge - (a - lower_edge(b))).max(1.0)
    }

    /// The probability that a request which has generated `attained_tokens` ends within
    /// `more_tokens` more (its length is at most `attained + more`).
    pub fn prob_within(&self, attained_tokens: u32, more_tokens: f64) -> f64 {
        if more_tokens.is_nan() || more_tokens < 1.0 {
            return 0.0;
        }
        let a = f64::from(attained_tokens);
        let here = self.survival_at(a);
        if here <= EMPTY {
            // Past everything observed: the Pareto(2) tail, P(L ≤ x | L > a) = 1 − (a / x)².
            let x = a.max(1.0) + more_tokens;
            return (1.0 - (a.max(1.0) / x).powi(2)).clamp(0.0, 1.0);
        }
        let beyond = self.survival_at(a + more_tokens);
        (1.0 - beyond / here).clamp(0.0, 1.0)
    }

    /// Mean length (the residual at zero).
    pub fn mean(&self) -> f64 {
        self.expected_remaining(0)
    }

    /// Total weight of the histogram (what is left of the prior plus decayed observations).
    pub fn total_weight(&self) -> f64 {
        self.prior_weight.iter().chain(&self.observed_weight).sum()
    }

    /// Rebuilds the tables if observations arrived since the last rebuild.
    pub fn refresh(&mut self) {
        if self.dirty {
            self.rebuild();
        }
    }

    /// The weight of lengths above `x` (log-uniform within a bucket).
    fn survival_at(&self, x: f64) -> f64 {
        let Some(top) = self.top else { return 0.0 };
        let len = x.clamp(1.0, f64::from(u32::MAX)) as u32;
        let b = bucket_of(len);
        if b > top {
            return 0.0;
        }
        let above = if b + 1 < NUM_BUCKETS { self.survival[b + 1] } else { 0.0 };
        let (ln_lo, ln_hi) = (self.ln_edges[b], self.ln_edges[b + 1]);
        let inside = ((ln_hi - x.max(lower_edge(b)).ln()) / (ln_hi - ln_lo)).clamp(0.0, 1.0);
        above + self.weight[b] * inside
    }

    /// Folds the censored observations into `weight` (Kaplan–Meier over the buckets): each bucket's
    /// finished weight ends that share of what is still at risk there — finished or running at
    /// that length or beyond — so the running requests carry their weight to the lengths above
    /// theirs in proportion. What survives every finished bucket (running requests longer than any
    /// finished one) goes to twice the longest running length: the Pareto tail's `E[L | L > a] =
    /// 2a`. The running requests add their own weight to the total; a censored bucket is counted
    /// at risk through itself (the request has passed its lower edge, and most of the bucket is
    /// above it).
    fn spread_censored(&mut self) {
        let total: f64 = self.weight.iter().zip(&self.censored).map(|(w, c)| w + c).sum();
        if total <= EMPTY {
            return;
        }
        let mut at_risk = [0.0; NUM_BUCKETS];
        let mut above = 0.0;
        for b in (0..NUM_BUCKETS).rev() {
            above += self.weight[b] + self.censored[b];
            at_risk[b] = above;
        }
        let mut surviving = 1.0;
        for ((weight, weighted_len), &at_risk) in
            self.weight.iter_mut().zip(&mut self.weighted_len).zip(&at_risk)
        {
            let finished = *weight;
            if finished <= EMPTY || at_risk <= EMPTY {
                continue;
            }
            let mean_len = *weighted_len / finished;
            let share = surviving * finished / at_risk;
            surviving -= share;
            *weight = total * share;
            *weighted_len = *weight * mean_len;
        }
        if let Some(longest) = (0..NUM_BUCKETS).rev().find(|&b| self.censored[b] > 0.0) {
            let tail_len = 2.0 * lower_edge(longest).max(1.0);
            let tail = bucket_of(tail_len.min(f64::from(u32::MAX)) as u32);
            let mass = total * surviving.max(0.0);
            if mass > EMPTY {
                self.weight[tail] += mass;
                self.weighted_len[tail] += mass * tail_len;
            }
        }
    }

    /// The length at which the survival falls to `target`, searching buckets upward from
    /// `*cursor` (log-uniform within a bucket). Targets asked in increasing bucket order fall,
    /// so the cursor only moves forward: a rebuild costs O(buckets), not O(buckets²).
    fn length_where_survival_is(&self, cursor: &mut usize, target: f64) -> f64 {
        let Some(top) = self.top else { return lower_edge(*cursor) };
        while *cursor <= top {
            let b = *cursor;
            let above = if b + 1 < NUM_BUCKETS { self.survival[b + 1] } else { 0.0 };
            if above <= target {
                let w = self.weight[b];
                let (lo, hi) = (lower_edge(b), upper_edge(b));
                if w <= EMPTY {
                    return lo;
                }
                let inside = ((target - above) / w).clamp(0.0, 1.0);
                // survival = above + w · (ln hi − ln x) / (ln hi − ln lo)
                return (hi.ln() - inside * (hi.ln() - lo.ln())).exp();
            }
            *cursor += 1;
        }
        upper_edge(top)
    }

    fn rebuild(&mut self) {
        let mut sum_len = 0.0;
        let mut sum_w = 0.0;
        self.top = None;
        for b in 0..NUM_BUCKETS {
            self.weight[b] = self.prior_weight[b] + self.observed_weight[b];
            self.weighted_len[b] = self.prior_len[b] + self.observed_len[b];
        }
        if self.censored.iter().any(|&c| c > 0.0) {
            self.spread_censored();
        }
        for b in (0..NUM_BUCKETS).rev() {
            sum_len += self.weighted_len[b];
            sum_w += self.weight[b];
            self.survival[b] = sum_w;
            self.tail_mean[b] = (sum_w > EMPTY).then(|| sum_len / sum_w);
            if self.top.is_none() && self.weight[b] > EMPTY {
                self.top = Some(b);
            }
        }
        let (mut cursor_p50, mut cursor_p90, mut cursor_viable) = (0, 0, 0);
        for b in 0..NUM_BUCKETS {
            let here = self.survival[b];
            if here <= EMPTY {
                self.residual_p50[b] = 1.0;
                self.residual_p90[b] = 1.0;
                self.residual_viable[b] = 1.0;
                continue;
            }
            let edge = lower_edge(b);
            cursor_p50 = cursor_p50.max(b);
            cursor_p90 = cursor_p90.max(b);
            cursor_viable = cursor_viable.max(b);
            let x50 = self.length_where_survival_is(&mut cursor_p50, here * 0.5);
            let x90 = self.length_where_survival_is(&mut cursor_p90, here * 0.1);
            let viable = self.length_where_survival_is(&mut cursor_viable, here * (1.0 - self.viable_level));
            self.residual_p50[b] = (x50 - edge).max(1.0);
            self.residual_p90[b] = (x90 - edge).max(1.0);
            self.residual_viable[b] = (viable - edge).max(1.0);
        }
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A deterministic heavy-tailed sample: lengths `median · 2^z` for standard-normal-ish `z`.
    fn lognormal_sample(median: f64, n: usize, seed: u64) -> Vec<u32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                let mut z = 0.0;
                for _ in 0..12 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    z += (state >> 11) as f64 / (1u64 << 53) as f64;
                }
                (median * (z - 6.0).exp2()).round().max(1.0) as u32
            })
            .collect()
    }

    fn quantile_of(sample: &[u32], q: f64) -> f64 {
        let mut sorted = sample.to_vec();
        sorted.sort_unstable();
        f64::from(sorted[((sorted.len() - 1) as f64 * q).round() as usize])
    }

    #[test]
    fn residual_grows_with_attained_under_a_heavy_tail() {
        let p = ResidualLength::new(&[100, 200, 400, 800, 1600, 3200, 6400, 12800]);
        let early = p.expected_remaining(0);
        let late = p.expected_remaining(3000);
        assert!(early > 1.0);
        assert!(late > 1000.0, "late residual {late}");
        assert!(p.expected_remaining(100_000) >= 100_000.0);
        assert!(p.remaining_quantile(3000, Quantile::P50) > p.remaining_quantile(0, Quantile::P50) / 2.0);
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
            assert!(f64::from(len) < upper_edge(b), "{len} below the next edge");
            last = b;
        }
        assert_eq!(bucket_of(u32::MAX), NUM_BUCKETS - 1);
    }

    #[test]
    fn predictions_are_finite_and_at_least_one() {
        let p = ResidualLength::new(&[1]);
        for a in [0, 1, 2, 10, u32::MAX] {
            for r in [
                p.expected_remaining(a),
                p.remaining_quantile(a, Quantile::P50),
                p.remaining_quantile(a, Quantile::P90),
            ] {
                assert!(r.is_finite() && r >= 1.0, "{a} -> {r}");
            }
        }
    }

    #[test]
    fn quantiles_of_a_known_sample_match_it() {
        let sample = lognormal_sample(400.0, 4000, 7);
        let p = ResidualLength::with_rate(
            &sample,
            LearningRate { prior_weight: 4000.0, ..LearningRate::default() },
        );
        for (q, level) in [(Quantile::P50, 0.5), (Quantile::P90, 0.9)] {
            let want = quantile_of(&sample, level);
            let got = p.remaining_quantile(0, q) + 1.0;
            assert!((got / want - 1.0).abs() < 0.1, "{q:?}: {got} vs {want}");
        }
        let median = quantile_of(&sample, 0.5);
        let within = p.prob_within(0, median);
        assert!((within - 0.5).abs() < 0.05, "P(L ≤ median) = {within}");
    }

    /// The check: a server whose answers and thinking are 10× shorter (or longer) than
    /// the configured prior; after 200 finished requests the median and p90 are within 25 % of
    /// the new truth.
    #[test]
    fn a_shifted_distribution_is_learnt_within_two_hundred_requests() {
        let prior = lognormal_sample(500.0, 10, 1);
        for scale in [0.1, 10.0] {
            let truth = lognormal_sample(500.0 * scale, 20_000, 2);
            let mut p = ResidualLength::new(&prior);
            for &len in lognormal_sample(500.0 * scale, 200, 3).iter() {
                p.observe(len);
            }
            p.refresh();
            for (q, level) in [(Quantile::P50, 0.5), (Quantile::P90, 0.9)] {
                let want = quantile_of(&truth, level);
                let got = p.remaining_quantile(0, q) + 1.0;
                assert!(
                    (got / want - 1.0).abs() < 0.25,
                    "scale {scale} {q:?}: predicted {got}, truth {want}"
                );
            }
            let mean_truth = truth.iter().map(|&l| f64::from(l)).sum::<f64>() / truth.len() as f64;
            assert!(
                (p.mean() / mean_truth - 1.0).abs() < 0.35,
                "scale {scale}: mean {} vs {mean_truth}",
                p.mean()
            );
        }
    }

    #[test]
    fn running_requests_keep_the_first_completions_from_passing_for_the_whole_distribution() {
        // A fresh server: 50 requests finished at 10 tokens while 10 others run past 200.
        let mut p =
            ResidualLength::with_rate(&[10], LearningRate { prior_weight: 0.01, ..LearningRate::default() });
        for _ in 0..50 {
            p.observe(10);
        }
        p.refresh();
        let survivors_only = p.mean();
        p.set_censored([200; 10]);
        p.refresh();
        let with_running = p.mean();
        assert!(survivors_only < 12.0, "{survivors_only}");
        // At least their 10 × 200 tokens among 60 requests; the tail law puts them at ~400.
        assert!(with_running > (50.0 * 10.0 + 10.0 * 200.0) / 60.0, "{with_running}");
        assert!(p.prob_within(0, 20.0) < 0.9, "a sixth of the requests are longer than 200");
        // Running requests shorter than every finished one change nothing: they are still at risk.
        let mut q =
            ResidualLength::with_rate(&[100], LearningRate { prior_weight: 0.01, ..LearningRate::default() });
        for _ in 0..50 {
            q.observe(100);
        }
        q.refresh();
        let before = q.mean();
        q.set_censored([5; 10]);
        q.refresh();
        assert!((q.mean() - before).abs() < 1e-6 * before, "{} vs {before}", q.mean());
        // Once they finish, their own lengths replace them.
        p.set_censored([]);
        p.refresh();
        assert!((p.mean() - survivors_only).abs() < 1e-9);
    }

    #[test]
    fn the_prior_counts_as_its_pseudo_weight() {
        let p = ResidualLength::with_rate(
            &[100, 200, 300],
            LearningRate { prior_weight: 6.0, memory_requests: 100.0, prior_memory_requests: Some(50.0) },
        );
        assert!((p.total_weight() - 6.0).abs() < 1e-9);
        let mut q = p.clone();
        q.observe(50);
        assert!((q.total_weight() - (6.0 * 0.99 * 0.98 + 1.0)).abs() < 1e-9);
    }

    /// The case the prior's own memory is for: a production prior (answers of hundreds of
    /// tokens) on a server whose answers are about 15 tokens. Kept at full weight, the prior's
    /// tail still holds up the mean residual many times over after a few hundred completions;
    /// fading, it is the server's own lengths within a few hundred.
    #[test]
    fn a_long_prior_stops_holding_up_the_mean_of_short_traffic() {
        let prior = lognormal_sample(500.0, 100, 1);
        let short = lognormal_sample(15.0, 300, 4);
        let mean_truth = short.iter().map(|&l| f64::from(l)).sum::<f64>() / short.len() as f64;
        let fading = LearningRate { prior_memory_requests: Some(50.0), ..LearningRate::default() };
        let (mut fading, mut kept) = (ResidualLength::with_rate(&prior, fading), ResidualLength::new(&prior));
        for &len in &short {
            fading.observe(len);
            kept.observe(len);
        }
        fading.refresh();
        kept.refresh();
        assert!(kept.mean() > 1.5 * mean_truth, "kept prior: mean {} vs {mean_truth}", kept.mean());
        assert!(
            (fading.mean() / mean_truth - 1.0).abs() < 0.1,
            "fading prior: mean {} vs {mean_truth}",
            fading.mean()
        );
    }

    proptest! {
        #[test]
        fn probabilities_are_in_range_and_monotone(
            sample in prop::collection::vec(1u32..100_000, 1..50),
            running in prop::collection::vec(0u32..200_000, 0..20),
            attained in 0u32..200_000,
            a in 0.0f64..1e6,
            b in 0.0f64..1e6,
        ) {
            let mut p = ResidualLength::new(&sample);
            p.set_censored(running.iter().copied());
            p.refresh();
            prop_assert!(p.mean().is_finite() && p.mean() >= 1.0);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (p_lo, p_hi) = (p.prob_within(attained, lo), p.prob_within(attained, hi));
            prop_assert!((0.0..=1.0).contains(&p_lo) && (0.0..=1.0).contains(&p_hi));
            prop_assert!(p_lo <= p_hi + 1e-12, "P(within {lo}) = {p_lo} > P(within {hi}) = {p_hi}");
            let (m, q90) = (p.remaining_quantile(attained, Quantile::P50), p.remaining_quantile(attained, Quantile::P90));
            prop_assert!(m.is_finite() && q90.is_finite() && m >= 1.0);
            prop_assert!(q90 + 1e-9 >= m, "p90 {q90} below the median {m}");
        }

        /// The viability quantile answers the probability question: read at a bucket's lower
        /// edge (where the table is exact), room of that many tokens holds the rest with the
        /// level's probability.
        #[test]
        fn the_viable_quantile_matches_prob_within(
            sample in prop::collection::vec(1u32..20_000, 5..60),
            bucket in 0usize..60,
            level in 0.05f64..0.95,
        ) {
            let mut p = ResidualLength::new(&sample);
            p.set_viable_level(level);
            p.refresh();
            let attained = lower_edge(bucket) as u32;
            let q = p.remaining_quantile(attained, Quantile::Viable);
            prop_assert!(q.is_finite() && q >= 1.0);
            if q > 1.0 && p.survival_at(f64::from(attained)) > EMPTY {
                let within = p.prob_within(attained, q);
                prop_assert!((within - level).abs() < 0.02, "room {q}: P = {within}, level {level}");
            }
        }
    }
}
