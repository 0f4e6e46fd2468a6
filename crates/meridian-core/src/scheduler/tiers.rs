//! [`Meridian`]'s side of the KV tiers beyond the device: it registers the tiers, folds the
//! connector's load timings into their fits, and answers the restore-or-recompute question for a
//! request with the step-time model's costs ([`crate::kv_tier`] holds the model). Invariant: a
//! hit offered to a request is counted once, when vLLM allocates it, as loaded or recomputed
//! tokens; an offer that is never allocated (the request left first) counts nowhere.

use super::{Meridian, ReqHandle};
use crate::error::Result;
use crate::kv_tier::{RestorePlan, TierCounters, TierId, TierSpan};
use crate::step_model::StepShape;

impl Meridian {
    /// Whether a tier keeps the blocks a live request stored until the request finishes (the
    /// policy's [`super::PolicyTraits::tier_retention`]; otherwise the tier's own order evicts them).
    pub fn retains_live_tier_blocks(&self) -> bool {
        self.traits.tier_retention
    }

    /// Registers a KV tier by the connector's name for it; the same name gives the same id.
    /// `staged`: slower tiers sit behind it (a lookup ahead of time starts moving a block up),
    /// so the plans prefetch for waiting requests next in line (`kv_tier.prefetch_requests`).
    pub fn add_kv_tier(&mut self, name: &str, staged: bool) -> Result<TierId> {
        self.kv_tiers.add_tier(name, staged)
    }

    /// The waiting requests to prefetch for this step: of the `kv_tier.prefetch_requests`
    /// entries of `waiting_order` right after the `num_admissible` admitted now, those whose
    /// prefix is not yet ready in the fastest tier ([`Self::on_prefetched`]); none without a
    /// staged tier. Indices into `waiting`, in admission order. A move up takes several looks
    /// (a slower tier may first answer "ask again", then move the block, then have it ready),
    /// so a request stays a candidate until the shim reports it ready.
    pub(super) fn prefetch(
        &self,
        waiting: &[ReqHandle],
        waiting_order: &[u32],
        num_admissible: u32,
    ) -> Vec<u32> {
        let window = self.config.kv_tier.prefetch_requests as usize;
        if window == 0 || !self.kv_tiers.any_staged() {
            return Vec::new();
        }
        waiting_order
            .iter()
            .skip(num_admissible as usize)
            .take(window)
            .copied()
            .filter(|&i| {
                self.slots[waiting[i as usize].slot()]
                    .request
                    .as_ref()
                    .is_some_and(|r| !r.prefetched && r.shed.is_none())
            })
            .collect()
    }

    /// The request's prefix is as ready as the tiers can make it (in the fastest tier, or in
    /// none): later plans do not prefetch it again, unless it is preempted.
    pub fn on_prefetched(&mut self, handle: ReqHandle) -> Result<()> {
        self.get_mut(handle)?.prefetched = true;
        Ok(())
    }

    /// Folds a finished load of `num_tokens` tokens from `tier`, taking `duration_ms`, into the
    /// tier's load cost.
    pub fn on_kv_load(&mut self, tier: TierId, num_tokens: u64, duration_ms: f64) -> Result<()> {
        self.kv_tiers.on_load(tier, num_tokens, duration_ms)
    }

    /// How much of a tier hit (`spans`, in prefix order after the device's own hit) the request
    /// should load; the rest is recomputed. Both costs come from the step-time model: the extra
    /// step a load takes is priced as one more step shaped like the last one measured (before
    /// any, a one-decode step), a recomputed token at `per_prefill_token_ms` for each request
    /// that step decoded (the batch a longer step delays). The offer is remembered until
    /// [`Self::on_kv_allocated`].
    pub fn plan_restore(&mut self, handle: ReqHandle, spans: &[TierSpan]) -> Result<RestorePlan> {
        self.get(handle)?;
        let shape =
            self.last_step_shape.unwrap_or(StepShape { num_decode_requests: 1, ..StepShape::default() });
        let step_ms = self.step_model.predict_ms(shape);
        let prefill_ms_per_token = self.step_model.coefficients().per_prefill_token_ms;
        let mut plan = self.kv_tiers.plan(spans, step_ms, prefill_ms_per_token, shape.num_decode_requests)?;
        let request = self.get_mut(handle)?;
        if request.kv_load_failed {
            plan = RestorePlan { num_restore_tokens: 0, cost_ms: plan.recompute_ms, ..plan };
        }
        request.offered_restore_tokens = Some(plan.num_offered_tokens);
        Ok(plan)
    }

    /// vLLM allocated the request with `num_loaded_tokens` coming from a tier: counts the last
    /// offer as loaded and recomputed tokens. Without an offer pending nothing is counted.
    pub fn on_kv_allocated(&mut self, handle: ReqHandle, num_loaded_tokens: u32) -> Result<()> {
        if let Some(offered) = self.get_mut(handle)?.offered_restore_tokens.take() {
            self.kv_tiers.on_allocated(offered, num_loaded_tokens);
        }
        Ok(())
    }

    /// A tier now holds the first `num_tokens` tokens of the request's KV (its stored prefix;
    /// it may shrink when the tier evicts a block of it): a preemption of it then costs a load
    /// instead of a recompute of those tokens, which the running order and the choice of
    /// arrival victims count. 0 forgets the prefix.
    pub fn on_kv_stored(&mut self, handle: ReqHandle, tier: TierId, num_tokens: u32) -> Result<()> {
        self.kv_tiers.load_ms_per_token(tier)?;
        let request = self.get_mut(handle)?;
        request.stored_prefix = (num_tokens > 0).then_some(TierSpan { tier, num_tokens });
        self.refresh_hot(handle);
        Ok(())
    }

    /// Tokens of the request's KV a tier holds as far as the core knows (0 after a failed load:
    /// it recomputes whatever is stored).
    pub fn num_stored_tokens(&self, handle: ReqHandle) -> Result<u32> {
        let request = self.get(handle)?;
        Ok(request.stored_prefix.filter(|_| !request.kv_load_failed).map_or(0, |s| s.num_tokens))
    }

    /// Loads of `num_blocks` of the request's blocks failed (vLLM's `invalid_block_ids`); vLLM
    /// recomputes them or fails the request, per its `kv_load_failure_policy`. From now on the
    /// request recomputes whatever a tier offers it: a tier that failed once may hold the same
    /// bad copy at the next lookup, and loading it again would fail again.
    pub fn on_kv_load_failure(&mut self, handle: ReqHandle, num_blocks: u64) -> Result<()> {
        self.get_mut(handle)?.kv_load_failed = true;
        self.on_handoff_failed(handle)?;
        self.refresh_hot(handle);
        self.kv_tiers.on_load_failure(num_blocks);
        Ok(())
    }

    /// Restore and recompute counters of the KV tiers.
    pub fn kv_tier_counters(&self) -> TierCounters {
        self.kv_tiers.counters()
    }

    /// A tier's current fitted load cost (ms per token).
    pub fn kv_load_ms_per_token(&self, tier: TierId) -> Result<f64> {
        self.kv_tiers.load_ms_per_token(tier)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use crate::config::Config;
    use crate::kv_tier::TierSpan;
    use crate::{EngineLimits, Meridian, NewRequest, ReasoningMarkers};

    /// A core with 16-token blocks, markers 1 (start) and 2 (end), and `config`.
    pub(in crate::scheduler) fn core(config: &str) -> Meridian {
        let limits = EngineLimits::new(16, 2048, 64);
        Meridian::new(
            Config::from_json(config).unwrap(),
            limits,
            ReasoningMarkers::new(vec![1], vec![2], vec![]),
        )
        .unwrap()
    }

    fn add(core: &mut Meridian, req_id: &str) -> crate::ReqHandle {
        let new = NewRequest {
            req_id,
            arrival_ms: 0.0,
            prompt_token_ids: &[7; 64],
            max_tokens: 64,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        };
        core.add_request(new).unwrap().0
    }

    /// The stated costs: seed step profile `base_ms` 10 with `per_prefill_token_ms` 0.1 (no fit),
    /// load 0.02 ms/token: a hit restores from 10 / 0.08 = 125 tokens on.
    const STATED: &str = r#"{"step_time": {"base_ms": 10, "per_prefill_token_ms": 0.1, "per_decode_request_ms": 0,
        "per_context_token_ms": 0, "online_fit": false}, "kv_tier": {"load_ms_per_token": 0.02, "online_fit": false}}"#;

    #[test]
    fn restore_flips_at_the_stated_break_even_and_is_counted_once() {
        let mut core = core(STATED);
        let host = core.add_kv_tier("host", false).unwrap();
        let a = add(&mut core, "a");
        let short = core.plan_restore(a, &[TierSpan { tier: host, num_tokens: 112 }]).unwrap();
        assert_eq!(short.num_restore_tokens, 0);
        core.on_kv_allocated(a, 0).unwrap();
        let long = core.plan_restore(a, &[TierSpan { tier: host, num_tokens: 128 }]).unwrap();
        assert_eq!(long.num_restore_tokens, 128);
        core.on_kv_allocated(a, 127).unwrap(); // vLLM cut a full hit by one token
        core.on_kv_allocated(a, 127).unwrap(); // no offer pending: not counted again
        let c = core.kv_tier_counters();
        assert_eq!(
            (c.num_recomputes, c.num_restores, c.num_restored_tokens, c.num_recomputed_tokens),
            (1, 1, 127, 113)
        );
    }

    #[test]
    fn after_a_failed_load_the_request_recomputes() {
        let mut core = core(STATED);
        let host = core.add_kv_tier("host", false).unwrap();
        let a = add(&mut core, "a");
        let hit = [TierSpan { tier: host, num_tokens: 512 }];
        assert_eq!(core.plan_restore(a, &hit).unwrap().num_restore_tokens, 512);
        core.on_kv_allocated(a, 512).unwrap();
        core.on_kv_load_failure(a, 2).unwrap();
        let again = core.plan_restore(a, &hit).unwrap();
        assert_eq!((again.num_restore_tokens, again.cost_ms), (0, again.recompute_ms));
        assert_eq!(core.kv_tier_counters().num_failed_load_blocks, 2);
    }

    /// A thinking request with a 256-token prompt that has produced one thinking token.
    fn thinker(core: &mut Meridian, req_id: &str, num_think_tokens: usize) -> crate::ReqHandle {
        let new = NewRequest {
            req_id,
            arrival_ms: 0.0,
            prompt_token_ids: &[7; 256],
            max_tokens: 4096,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        };
        let handle = core.add_request(new).unwrap().0;
        core.on_tokens(1.0, handle, &[1]).unwrap();
        core.on_tokens(1.0, handle, &vec![9; num_think_tokens]).unwrap();
        handle
    }

    #[test]
    fn a_late_thinker_s_sunk_work_is_net_of_what_a_tier_holds() {
        // TTFAT 1 ms: every thinker is late at once, and late thinkers go least sunk work last.
        let config = STATED.replacen(
            "{",
            r#"{"classes": {"standard": {"ttft_ms": 1, "ttfat_ms": 1, "answer_tpot_ms": 100, "rank": 0}},"#,
            1,
        );
        let mut core = core(&config);
        let host = core.add_kv_tier("host", false).unwrap();
        let (long, short) = (thinker(&mut core, "long", 300), thinker(&mut core, "short", 4));
        let now = 10_000.0;
        assert_eq!(core.plan_step(now, &[short, long], &[], 100).unwrap().running_order, vec![1, 0]);
        // The long thinker's whole context is stored: preempting it now throws away less.
        core.on_kv_stored(long, host, 544).unwrap();
        assert_eq!(core.plan_step(now, &[short, long], &[], 100).unwrap().running_order, vec![0, 1]);
        // Below the break-even of the stated costs (125 tokens) a resume would recompute anyway.
        core.on_kv_stored(long, host, 96).unwrap();
        assert_eq!(core.plan_step(now, &[short, long], &[], 100).unwrap().running_order, vec![1, 0]);
        // After a failed load it recomputes whatever is stored.
        core.on_kv_stored(long, host, 544).unwrap();
        core.on_kv_load_failure(long, 1).unwrap();
        assert_eq!(core.num_stored_tokens(long).unwrap(), 0);
        assert_eq!(core.plan_step(now, &[short, long], &[], 100).unwrap().running_order, vec![1, 0]);
    }

    fn core_with_restore(mode: &str, config: &str) -> Result<Meridian, crate::Error> {
        let config = config.replacen(r#""kv_tier": {"#, &format!(r#""kv_tier": {{"restore": "{mode}", "#), 1);
        let limits = EngineLimits::new(16, 2048, 64);
        Meridian::new(Config::from_json(&config)?, limits, ReasoningMarkers::new(vec![1], vec![2], vec![]))
    }

    #[test]
    fn with_restore_never_a_stored_prefix_counts_for_nothing() {
        let config = STATED.replacen(
            "{",
            r#"{"classes": {"standard": {"ttft_ms": 1, "ttfat_ms": 1, "answer_tpot_ms": 100, "rank": 0}},"#,
            1,
        );
        let mut core = core_with_restore("never", &config).unwrap();
        let host = core.add_kv_tier("host", false).unwrap();
        let (long, short) = (thinker(&mut core, "long", 300), thinker(&mut core, "short", 4));
        core.on_kv_stored(long, host, 544).unwrap();
        assert_eq!(core.plan_step(10_000.0, &[short, long], &[], 100).unwrap().running_order, vec![1, 0]);
        assert!(core.on_kv_stored(long, crate::kv_tier::TierId(5), 16).is_err());
    }

    #[test]
    fn prefetch_looks_ahead_of_admission_once_per_request_and_only_with_a_staged_tier() {
        // Two seats: two requests are admitted each plan, the next four are prefetched.
        let limits = EngineLimits::new(16, 2048, 2);
        let new_core = || {
            Meridian::new(
                Config::from_json("{}").unwrap(),
                limits,
                ReasoningMarkers::new(vec![1], vec![2], vec![]),
            )
            .unwrap()
        };
        let mut core = new_core();
        let queue: Vec<_> = (0..8).map(|i| add(&mut core, &format!("r{i}"))).collect();
        core.add_kv_tier("host", false).unwrap();
        assert!(
            core.plan_step(1.0, &[], &queue, 1000).unwrap().prefetch.is_empty(),
            "nothing slower behind it"
        );
        core.add_kv_tier("host", true).unwrap();
        let plan = core.plan_step(2.0, &[], &queue, 1000).unwrap();
        assert_eq!(plan.num_admissible, 2);
        let next: Vec<u32> = plan.waiting_order[2..6].to_vec();
        assert_eq!(plan.prefetch, next);
        assert_eq!(core.plan_step(3.0, &[], &queue, 1000).unwrap().prefetch, next, "until ready");
        for &i in &next {
            core.on_prefetched(queue[i as usize]).unwrap();
        }
        assert!(core.plan_step(3.0, &[], &queue, 1000).unwrap().prefetch.is_empty(), "ready ones are done");
        // A preempted request's KV goes to the tiers again: it is prefetched again.
        let moved = queue[next[0] as usize];
        core.on_preempted(4.0, moved).unwrap();
        assert_eq!(core.plan_step(5.0, &[], &queue, 1000).unwrap().prefetch.len(), 1);
        let mut off = Meridian::new(
            Config::from_json(r#"{"kv_tier": {"prefetch_requests": 0}}"#).unwrap(),
            limits,
            ReasoningMarkers::new(vec![1], vec![2], vec![]),
        )
        .unwrap();
        let queue: Vec<_> = (0..8).map(|i| add(&mut off, &format!("r{i}"))).collect();
        off.add_kv_tier("host", true).unwrap();
        assert!(off.plan_step(1.0, &[], &queue, 1000).unwrap().prefetch.is_empty());
    }

    #[test]
    fn unknown_requests_and_tiers_are_errors() {
        let mut core = core("{}");
        let a = add(&mut core, "a");
        assert!(core
            .plan_restore(a, &[TierSpan { tier: crate::kv_tier::TierId(0), num_tokens: 16 }])
            .is_err());
        assert!(core.plan_restore(crate::ReqHandle(99), &[]).is_err());
        assert!(core.on_kv_load_failure(crate::ReqHandle(99), 1).is_err());
    }
}
