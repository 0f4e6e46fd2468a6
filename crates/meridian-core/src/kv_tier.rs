//! The KV tiers beyond the device: the fitted cost of loading KV back from each tier, the
//! restore-or-recompute choice for a request whose prefix a tier holds, and the counts of both.
//! The model, in milliseconds of delay summed over the requests it delays: restoring `k` tokens
//! costs the request one extra engine step (vLLM loads asynchronously and schedules it the step
//! after) plus `k · load_ms_per_token` of the tier they come from for every request in the batch
//! (charged as if the copy held the step up, which a synchronous host copy does and a GPU's copy
//! engine mostly does not); recomputing them costs `k · per_prefill_token_ms` of the step-time
//! model for every request in the batch, whose steps the recompute lengthens. Alone on the
//! engine a short hit is recomputed; in a busy batch almost any hit is loaded. Both are linear between the
//! boundaries of the tiers a hit spans, so the cheapest cut lies on a boundary: a partial restore
//! happens exactly when a hit's tail sits in a tier slower than recompute, and a short hit is
//! recomputed when the extra step costs more than its compute. Invariant: a plan restores a
//! prefix of the offered hit that ends on a span boundary, and no boundary is cheaper under the
//! costs the plan reports (ties restore less: a recompute needs no transfer that can fail); the
//! fitted load cost stays finite and ≥ 0.

use crate::config::{KvTierConfig, RestoreMode};
use crate::error::{check_time_ms, Error, Result};

/// How much a tier's seed weighs in its fit, in loaded tokens: the first real load of a block or
/// two already outweighs a seed that is far off.
const SEED_WEIGHT_TOKENS: f64 = 16.0;
/// Per-load forgetting of the fit: it follows a change of bandwidth within a few dozen loads.
const LOAD_FORGETTING: f64 = 0.95;
/// Most tiers one engine registers (each connector tier once).
pub const MAX_TIERS: usize = 16;

/// A tier beyond the device, as registered by the shim ([`KvTiers::add_tier`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TierId(pub u8);

impl TierId {
    /// Index into per-tier tables.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Part of a tier hit: `num_tokens` consecutive tokens of the request's prefix that `tier` holds.
/// A hit is a list of spans in prefix order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierSpan {
    /// Where the tokens are.
    pub tier: TierId,
    /// How many (a multiple of the tier's block size, as the connector reports them).
    pub num_tokens: u32,
}

/// The choice for one tier hit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestorePlan {
    /// Tokens of the hit to load (a prefix of it, ending on a span boundary); the rest is
    /// recomputed.
    pub num_restore_tokens: u32,
    /// Tokens the tiers offered.
    pub num_offered_tokens: u32,
    /// Modelled cost of this plan: the extra step (if anything is loaded), the loads, and the
    /// recompute of what is not loaded.
    pub cost_ms: f64,
    /// Modelled cost of recomputing the whole hit instead.
    pub recompute_ms: f64,
}

/// Restore and recompute counters; monotone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounters {
    /// Requests that loaded (part of) a tier hit.
    pub num_restores: u64,
    /// Tokens they loaded.
    pub num_restored_tokens: u64,
    /// Requests offered a tier hit that recomputed all of it.
    pub num_recomputes: u64,
    /// Offered tokens recomputed instead of loaded (declined by the plan, or trimmed by vLLM).
    pub num_recomputed_tokens: u64,
    /// Blocks whose load failed; vLLM recomputes them (its `kv_load_failure_policy`
    /// `recompute`) or fails their requests (`fail`).
    pub num_failed_load_blocks: u64,
}

#[derive(Debug, Clone)]
struct TierFit {
    name: String,
    /// Exponentially weighted sums of loaded milliseconds and tokens, seed included.
    sum_ms: f64,
    sum_tokens: f64,
    num_loads: u64,
    /// Slower tiers sit behind it: a lookup there starts moving a block up (prefetch pays).
    staged: bool,
}

impl TierFit {
    fn load_ms_per_token(&self) -> f64 {
        self.sum_ms / self.sum_tokens
    }
}

/// The tiers of one engine and their fitted load costs.
#[derive(Debug, Clone)]
pub struct KvTiers {
    config: KvTierConfig,
    tiers: Vec<TierFit>,
    counters: TierCounters,
}

impl KvTiers {
    /// No tiers yet; `config` seeds every tier's load cost.
    pub fn new(config: KvTierConfig) -> Self {
        Self { config, tiers: Vec::new(), counters: TierCounters::default() }
    }

    /// Registers a tier by name (the connector's own name for it); registering a name again
    /// returns the same id. `staged`: slower tiers sit behind it, so looking a block up there
    /// ahead of time moves it up (what prefetch does).
    pub fn add_tier(&mut self, name: &str, staged: bool) -> Result<TierId> {
        if let Some(i) = self.tiers.iter().position(|t| t.name == name) {
            self.tiers[i].staged |= staged;
            return Ok(TierId(i as u8));
        }
        if self.tiers.len() >= MAX_TIERS {
            return Err(Error::argument("name", name, "no more than 16 KV tiers per engine"));
        }
        let seed = self.config.load_ms_per_token;
        self.tiers.push(TierFit {
            name: name.to_owned(),
            sum_ms: seed * SEED_WEIGHT_TOKENS,
            sum_tokens: SEED_WEIGHT_TOKENS,
            num_loads: 0,
            staged,
        });
        Ok(TierId((self.tiers.len() - 1) as u8))
    }

    /// Whether any registered tier has slower tiers behind it.
    pub fn any_staged(&self) -> bool {
        self.tiers.iter().any(|t| t.staged)
    }

    /// How many tiers are registered.
    pub fn num_tiers(&self) -> usize {
        self.tiers.len()
    }

    /// A tier's current fitted load cost (ms per token).
    pub fn load_ms_per_token(&self, tier: TierId) -> Result<f64> {
        Ok(self.tier(tier)?.load_ms_per_token())
    }

    /// Folds one finished load (`num_tokens` tokens in `duration_ms`) into the tier's fit, unless
    /// the configuration keeps the seed.
    pub fn on_load(&mut self, tier: TierId, num_tokens: u64, duration_ms: f64) -> Result<()> {
        let duration_ms = check_time_ms("duration_ms", duration_ms)?;
        let fit_online = self.config.online_fit;
        let fit = self.tier_mut(tier)?;
        fit.num_loads += 1;
        if num_tokens == 0 || !fit_online {
            return Ok(());
        }
        fit.sum_ms = fit.sum_ms * LOAD_FORGETTING + duration_ms;
        fit.sum_tokens = fit.sum_tokens * LOAD_FORGETTING + num_tokens as f64;
        Ok(())
    }

    /// Chooses how much of a hit to load. `step_ms` is the cost of the extra step a load takes
    /// and `prefill_ms_per_token` the cost of recomputing a token (both from the step-time
    /// model); `num_batch_requests` (at least 1) is how many requests a longer step delays. An
    /// empty hit, or spans of no tokens, plan nothing.
    pub fn plan(
        &self,
        spans: &[TierSpan],
        step_ms: f64,
        prefill_ms_per_token: f64,
        num_batch_requests: u32,
    ) -> Result<RestorePlan> {
        for span in spans {
            self.tier(span.tier)?;
        }
        let offered: u64 = spans.iter().map(|s| u64::from(s.num_tokens)).sum();
        let num_offered_tokens = u32::try_from(offered)
            .map_err(|_| Error::argument("spans", offered, "a hit cannot exceed 2^32 - 1 tokens"))?;
        let batch = f64::from(num_batch_requests.max(1));
        let recompute_ms = f64::from(num_offered_tokens) * prefill_ms_per_token * batch;
        let mut best =
            RestorePlan { num_restore_tokens: 0, num_offered_tokens, cost_ms: recompute_ms, recompute_ms };
        if self.config.restore == RestoreMode::Never || num_offered_tokens == 0 {
            return Ok(best);
        }
        let mut restored = 0u32;
        let mut load_ms = 0.0;
        for span in spans.iter().filter(|s| s.num_tokens > 0) {
            restored += span.num_tokens;
            load_ms += f64::from(span.num_tokens) * self.tiers[span.tier.index()].load_ms_per_token() * batch;
            let rest_ms = f64::from(num_offered_tokens - restored) * prefill_ms_per_token * batch;
            let cost_ms = step_ms + load_ms + rest_ms;
            // `Always` is vLLM's own behaviour: load whatever the tiers hold.
            if self.config.restore == RestoreMode::Always || cost_ms < best.cost_ms {
                best =
                    RestorePlan { num_restore_tokens: restored, num_offered_tokens, cost_ms, recompute_ms };
            }
        }
        Ok(best)
    }

    /// The shortest stored prefix of `tier` that a resume would load rather than recompute under
    /// the same costs as [`Self::plan`] with one span (`f64::INFINITY`: none would be loaded,
    /// 0: any would). The plan loads `s` tokens when `step_ms + s·load < s·prefill` (per request
    /// of the batch), so the bound is `step_ms / ((prefill − load) · batch)`, exclusive.
    pub fn min_restore_tokens(
        &self,
        tier: TierId,
        step_ms: f64,
        prefill_ms_per_token: f64,
        num_batch_requests: u32,
    ) -> f64 {
        let Some(fit) = self.tiers.get(tier.index()) else { return f64::INFINITY };
        match self.config.restore {
            RestoreMode::Never => f64::INFINITY,
            RestoreMode::Always => 0.0,
            RestoreMode::Auto => {
                let saved_ms_per_token =
                    (prefill_ms_per_token - fit.load_ms_per_token()) * f64::from(num_batch_requests.max(1));
                if saved_ms_per_token > 0.0 {
                    step_ms / saved_ms_per_token
                } else {
                    f64::INFINITY
                }
            }
        }
    }

    /// Counts what became of an offered hit: `num_loaded_tokens` of `num_offered_tokens` were
    /// loaded (vLLM may load less than planned, never more).
    pub fn on_allocated(&mut self, num_offered_tokens: u32, num_loaded_tokens: u32) {
        let loaded = num_loaded_tokens.min(num_offered_tokens);
        if num_offered_tokens == 0 {
            return;
        }
        if loaded > 0 {
            self.counters.num_restores += 1;
            self.counters.num_restored_tokens += u64::from(loaded);
        } else {
            self.counters.num_recomputes += 1;
        }
        self.counters.num_recomputed_tokens += u64::from(num_offered_tokens - loaded);
    }

    /// Counts blocks whose load failed.
    pub fn on_load_failure(&mut self, num_blocks: u64) {
        self.counters.num_failed_load_blocks += num_blocks;
    }

    /// The counters.
    pub fn counters(&self) -> TierCounters {
        self.counters
    }

    fn tier(&self, tier: TierId) -> Result<&TierFit> {
        self.tiers.get(tier.index()).ok_or_else(|| Self::unknown(tier))
    }

    fn tier_mut(&mut self, tier: TierId) -> Result<&mut TierFit> {
        self.tiers.get_mut(tier.index()).ok_or_else(|| Self::unknown(tier))
    }

    fn unknown(tier: TierId) -> Error {
        Error::argument("tier", tier.0, "not a registered KV tier (add_kv_tier returns the ids)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tiers(restore: RestoreMode, seeds: &[f64]) -> (KvTiers, Vec<TierId>) {
        let mut all = KvTiers::new(KvTierConfig {
            restore,
            load_ms_per_token: 0.0,
            online_fit: false,
            prefetch_requests: 0,
        });
        let ids = seeds
            .iter()
            .enumerate()
            .map(|(i, &seed)| {
                all.config.load_ms_per_token = seed;
                all.add_tier(&format!("tier{i}"), false).unwrap()
            })
            .collect();
        (all, ids)
    }

    fn span(tier: TierId, num_tokens: u32) -> TierSpan {
        TierSpan { tier, num_tokens }
    }

    #[test]
    fn decision_flips_where_the_costs_cross() {
        // Recompute 0.1 ms/token, load 0.02 ms/token, one step 8 ms: restore pays from
        // 8 / (0.1 - 0.02) = 100 tokens on.
        let (t, ids) = tiers(RestoreMode::Auto, &[0.02]);
        let short = t.plan(&[span(ids[0], 96)], 8.0, 0.1, 1).unwrap();
        assert_eq!(short.num_restore_tokens, 0);
        assert!((short.cost_ms - 9.6).abs() < 1e-9);
        let long = t.plan(&[span(ids[0], 112)], 8.0, 0.1, 1).unwrap();
        assert_eq!(long.num_restore_tokens, 112);
        assert!((long.cost_ms - (8.0 + 112.0 * 0.02)).abs() < 1e-9);
        assert!((long.recompute_ms - 11.2).abs() < 1e-9);
        // At GPU speeds the same hit is recomputed: a 0.028 ms/token prefill against a slow link.
        let (slow, ids) = tiers(RestoreMode::Auto, &[0.05]);
        assert_eq!(slow.plan(&[span(ids[0], 4096)], 6.0, 0.028, 1).unwrap().num_restore_tokens, 0);
    }

    #[test]
    fn a_tail_in_a_slower_tier_than_recompute_is_recomputed() {
        let (t, ids) = tiers(RestoreMode::Auto, &[0.01, 0.5]);
        let plan = t.plan(&[span(ids[0], 512), span(ids[1], 256)], 5.0, 0.1, 1).unwrap();
        assert_eq!(plan.num_restore_tokens, 512);
        assert_eq!(plan.num_offered_tokens, 768);
        assert!((plan.cost_ms - (5.0 + 512.0 * 0.01 + 256.0 * 0.1)).abs() < 1e-9);
    }

    #[test]
    fn modes_override_the_model() {
        let (never, ids) = tiers(RestoreMode::Never, &[0.0]);
        assert_eq!(never.plan(&[span(ids[0], 4096)], 1.0, 1.0, 1).unwrap().num_restore_tokens, 0);
        let (always, ids) = tiers(RestoreMode::Always, &[10.0]);
        assert_eq!(always.plan(&[span(ids[0], 16)], 1.0, 0.001, 1).unwrap().num_restore_tokens, 16);
    }

    #[test]
    fn the_fit_follows_loads_and_the_seed_fades() {
        let mut t = KvTiers::new(KvTierConfig {
            restore: RestoreMode::Auto,
            load_ms_per_token: 1.0,
            online_fit: true,
            prefetch_requests: 0,
        });
        let id = t.add_tier("host", false).unwrap();
        assert_eq!(t.add_tier("host", true).unwrap(), id);
        assert!(t.any_staged(), "a later registration can only add staging");
        for _ in 0..20 {
            t.on_load(id, 320, 3.2).unwrap();
        }
        let fitted = t.load_ms_per_token(id).unwrap();
        assert!((fitted - 0.01).abs() < 0.002, "{fitted}");
        assert!(t.on_load(id, 16, f64::NAN).is_err());
        assert!(t.on_load(TierId(3), 16, 1.0).is_err());
        assert!(t.plan(&[span(TierId(9), 16)], 1.0, 1.0, 1).is_err());
    }

    #[test]
    fn counters_split_loaded_and_recomputed_tokens() {
        let (mut t, _) = tiers(RestoreMode::Auto, &[0.0]);
        t.on_allocated(64, 48);
        t.on_allocated(32, 0);
        t.on_allocated(0, 0);
        t.on_load_failure(3);
        let c = t.counters();
        assert_eq!((c.num_restores, c.num_restored_tokens), (1, 48));
        assert_eq!((c.num_recomputes, c.num_recomputed_tokens), (1, 48));
        assert_eq!(c.num_failed_load_blocks, 3);
    }

    proptest! {
        /// A stored prefix above the bound is exactly one the plan would load.
        #[test]
        fn min_restore_tokens_agrees_with_the_plan(
            num_tokens in 1u32..8192,
            load in 0.0f64..0.2,
            step_ms in 0.0f64..50.0,
            prefill in 0.0f64..0.2,
            batch in 1u32..64,
        ) {
            let (t, ids) = tiers(RestoreMode::Auto, &[load]);
            let bound = t.min_restore_tokens(ids[0], step_ms, prefill, batch);
            let plan = t.plan(&[span(ids[0], num_tokens)], step_ms, prefill, batch).unwrap();
            // Away from the boundary itself, where rounding may fall either way.
            if (f64::from(num_tokens) - bound).abs() > 1e-6 * bound.max(1.0) {
                prop_assert_eq!(plan.num_restore_tokens > 0, f64::from(num_tokens) > bound);
            }
        }

        /// The plan is a span-boundary prefix of the hit and no boundary is cheaper.
        #[test]
        fn plan_is_the_cheapest_boundary(
            spans in prop::collection::vec((0usize..3, 0u32..2048), 0..6),
            seeds in prop::collection::vec(0.0f64..1.0, 3),
            step_ms in 0.0f64..50.0,
            prefill in 0.0f64..1.0,
        ) {
            let (t, ids) = tiers(RestoreMode::Auto, &seeds);
            let spans: Vec<_> = spans.into_iter().map(|(tier, n)| span(ids[tier], n)).collect();
            let plan = t.plan(&spans, step_ms, prefill, 1).unwrap();
            let total: u32 = spans.iter().map(|s| s.num_tokens).sum();
            prop_assert_eq!(plan.num_offered_tokens, total);
            let mut boundaries = vec![0u32];
            let mut cost = vec![plan.recompute_ms];
            let (mut at, mut load) = (0u32, 0.0);
            for s in spans.iter().filter(|s| s.num_tokens > 0) {
                at += s.num_tokens;
                load += f64::from(s.num_tokens) * seeds[s.tier.index()];
                boundaries.push(at);
                cost.push(step_ms + load + f64::from(total - at) * prefill);
            }
            prop_assert!(boundaries.contains(&plan.num_restore_tokens));
            for c in cost {
                prop_assert!(plan.cost_ms <= c + 1e-9);
            }
        }
    }
}
