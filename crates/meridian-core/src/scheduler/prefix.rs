//! [`Meridian`]'s side of prefix-aware admission: it keeps the [`PrefixIndex`] current from the
//! device cache's and the tiers' events, holds each request's prompt block hashes, and prices a
//! waiting request's cached prefix as the prefill it saves (device blocks at the step-time
//! model's cost per prompt token; tier blocks at that cost less the tier's load cost, when a
//! resume would load them). Invariant: without a cached block in the index the waiting order is
//! exactly the one without affinity; with one, a request only goes ahead of requests whose slack
//! exceeds their guard.

use super::{Hot, Meridian, ReqHandle};
use crate::error::Result;
use crate::kv_tier::TierId;
use crate::prefix_index::{CachedPrefix, Medium};
use crate::slo::SloTargets;

/// Cache levels of the affinity key: the saved prefill in 0.1 ms, on a log₂ scale.
const MAX_AFFINITY_LEVEL: u64 = 31;

impl Meridian {
    /// The block hashes of a request's prompt, in order (vLLM's `request.block_hashes`, each
    /// reduced to 64 bits the way vLLM's KV events reduce them).
    pub fn set_block_hashes(&mut self, handle: ReqHandle, block_hashes: Vec<u64>) -> Result<()> {
        self.get_mut(handle)?.block_hashes = block_hashes.into_boxed_slice();
        Ok(())
    }

    /// `medium` now holds these blocks (vLLM's `BlockStored`, a tier's store).
    pub fn on_blocks_stored(&mut self, medium: Medium, block_hashes: &[u64]) -> Result<()> {
        self.check_medium(medium)?;
        self.prefix_index.on_stored(medium, block_hashes);
        Ok(())
    }

    /// `medium` dropped these blocks (vLLM's `BlockRemoved`, a tier's eviction).
    pub fn on_blocks_removed(&mut self, medium: Medium, block_hashes: &[u64]) -> Result<()> {
        self.check_medium(medium)?;
        self.prefix_index.on_removed(medium, block_hashes);
        Ok(())
    }

    /// `medium` dropped everything (vLLM's `AllBlocksCleared`, a tier's reset).
    pub fn on_blocks_cleared(&mut self, medium: Medium) -> Result<()> {
        self.check_medium(medium)?;
        self.prefix_index.on_cleared(medium);
        Ok(())
    }

    /// How much of a live request's prompt the index finds cached, and where.
    pub fn cached_prefix(&self, handle: ReqHandle) -> Result<CachedPrefix> {
        Ok(self.prefix_index.cached_prefix(&self.get(handle)?.block_hashes))
    }

    fn check_medium(&self, medium: Medium) -> Result<()> {
        if let Medium::Tier(tier) = medium {
            self.kv_tiers.load_ms_per_token(tier)?;
        }
        Ok(())
    }

    /// Whether the shim should feed the index: the rule is on under Meridian's own policy.
    pub fn wants_block_events(&self) -> bool {
        self.config.prefix_affinity.enabled && self.traits.prefix_affinity
    }

    /// The affinity part of a waiting request's key, when the rule applies (the policy is
    /// Meridian's, the rule is on and the index holds anything): 0 while its slack is within
    /// its guard (least slack first, as without the rule), else `32 + (31 − level)` where
    /// `level` grows with the prefill its cached prefix saves (0: nothing cached).
    #[inline]
    pub(super) fn affinity_key(&self, r: &Hot, targets: &SloTargets, slack_ms: f64) -> Option<u64> {
        let rule = self.config.prefix_affinity;
        if !self.wants_block_events() || self.prefix_index.is_empty() {
            return None;
        }
        // Within its guard a request keeps its least-slack-first place.
        if slack_ms < rule.slack_guard_ttft_factor * targets.ttft_ms {
            return Some(0);
        }
        let saved_ms = self.saved_prefill_ms(r);
        let level =
            if saved_ms >= 0.1 { ((saved_ms * 10.0).log2() as u64 + 1).min(MAX_AFFINITY_LEVEL) } else { 0 };
        Some(32 + (MAX_AFFINITY_LEVEL - level))
    }

    /// Prefill time a waiting request's cached prefix saves it: device blocks at the step-time
    /// model's cost per prompt token, tier blocks at that less the tier's load cost when a
    /// resume would load them.
    fn saved_prefill_ms(&self, r: &Hot) -> f64 {
        let Some(request) = self.slots[r.handle.slot()].request.as_ref() else { return 0.0 };
        let cached = self.prefix_index.cached_prefix(&request.block_hashes);
        if cached == CachedPrefix::default() {
            return 0.0;
        }
        let block_size = f64::from(self.limits.block_size);
        let per_token_ms = self.step_model.coefficients().per_prefill_token_ms;
        let device_tokens = f64::from(cached.num_device_blocks) * block_size;
        let tier_tokens = f64::from(cached.num_tier_blocks) * block_size;
        let mut saved_ms = device_tokens * per_token_ms;
        if tier_tokens > self.min_restore_tokens[cached.tier.index()] {
            let load_ms = self.kv_tiers.load_ms_per_token(TierId(cached.tier.0)).unwrap_or(f64::INFINITY);
            saved_ms += tier_tokens * (per_token_ms - load_ms).max(0.0);
        }
        saved_ms
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::kv_tier::TierId;
    use crate::prefix_index::Medium;
    use crate::scheduler::tiers::tests::core;
    use crate::{Meridian, NewRequest, ReqHandle};

    /// A waiting request of the default class (TTFT target 3 s: guard 1.5 s) with a 64-token
    /// prompt whose four blocks hash to `first..first + 4`.
    fn waiting(core: &mut Meridian, req_id: &str, arrival_ms: f64, first: u64) -> ReqHandle {
        let new = NewRequest {
            req_id,
            arrival_ms,
            prompt_token_ids: &[7; 64],
            max_tokens: 64,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        };
        let handle = core.add_request(new).unwrap().0;
        core.set_block_hashes(handle, (first..first + 4).collect()).unwrap();
        handle
    }

    #[test]
    fn a_cached_prompt_goes_ahead_of_uncached_ones_with_slack_to_spare_but_not_of_tight_ones() {
        let mut core = core("{}");
        let host = core.add_kv_tier("host", false).unwrap();
        let tight = waiting(&mut core, "tight", 0.0, 100);
        let fresh = waiting(&mut core, "fresh", 2_000.0, 200);
        let cached = waiting(&mut core, "cached", 2_100.0, 300);
        let queue = [cached, fresh, tight];
        // Nothing cached anywhere: least slack first.
        assert_eq!(core.plan_step(2_200.0, &[], &queue, 1000).unwrap().waiting_order, vec![2, 1, 0]);
        core.on_blocks_stored(Medium::Device, &[300, 301, 302]).unwrap();
        assert_eq!(core.cached_prefix(cached).unwrap().num_device_blocks, 3);
        assert_eq!(core.plan_step(2_200.0, &[], &queue, 1000).unwrap().waiting_order, vec![2, 0, 1]);
        // A prefix only a tier holds counts when a resume would load it: at the default costs
        // (0.028 ms a prompt token to recompute, 0.005 to load, one extra step) three blocks are
        // too short to be worth a load.
        core.on_blocks_removed(Medium::Device, &[300, 301, 302]).unwrap();
        core.on_blocks_stored(Medium::Tier(host), &[300, 301, 302]).unwrap();
        assert_eq!(core.plan_step(2_200.0, &[], &queue, 1000).unwrap().waiting_order, vec![2, 1, 0]);
        core.on_blocks_cleared(Medium::Tier(host)).unwrap();
        // Longest saved prefill first among the loose ones.
        core.on_blocks_stored(Medium::Device, &[200]).unwrap();
        core.on_blocks_stored(Medium::Device, &[300, 301, 302, 303]).unwrap();
        assert_eq!(core.plan_step(2_200.0, &[], &queue, 1000).unwrap().waiting_order, vec![2, 0, 1]);
        assert!(core.on_blocks_stored(Medium::Tier(TierId(7)), &[1]).is_err(), "unregistered tier");
    }

    #[test]
    fn the_rule_can_be_turned_off() {
        let mut core = core(r#"{"prefix_affinity": {"enabled": false}}"#);
        let tight = waiting(&mut core, "tight", 0.0, 100);
        let fresh = waiting(&mut core, "fresh", 2_000.0, 200);
        let cached = waiting(&mut core, "cached", 2_100.0, 300);
        core.on_blocks_stored(Medium::Device, &[300, 301, 302, 303]).unwrap();
        let order = core.plan_step(2_200.0, &[], &[cached, fresh, tight], 1000).unwrap().waiting_order;
        assert_eq!(order, vec![2, 1, 0]);
        assert!(Config::from_json(r#"{"prefix_affinity": {"slack_guard_ttft_factor": -1}}"#)
            .unwrap_err()
            .to_string()
            .contains("prefix_affinity.slack_guard_ttft_factor"));
    }
}
