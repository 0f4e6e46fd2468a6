//! The plan's side of prefill/decode hand-offs ([`crate::handoff`]): which requests take part,
//! when a receiving request's KV started and finished arriving, and what its prompt costs the
//! plan. A request that sends its KV on is not a reasoning request here (its thinking runs on the
//! decode engine), so it is ordered, admitted and shed by its TTFT alone; one whose KV arrives is
//! predicted with the fitted arrival cost instead of the prompt's compute, and, while its KV
//! arrives, holds the blocks it needs already. Invariant: with no hand-off every request's
//! prompt costs what the step-time model says, exactly as before hand-offs existed.

use super::{Hot, Meridian, ReqHandle};
use crate::error::{check_time_ms, Result};
use crate::handoff::{HandoffCounters, KvHandoff};

impl Meridian {
    /// Sets a request's part in a prefill/decode hand-off (vLLM's `kv_transfer_params`:
    /// `do_remote_decode` sends, `do_remote_prefill` receives), once, before its first plan.
    pub fn set_kv_handoff(&mut self, handle: ReqHandle, handoff: KvHandoff) -> Result<()> {
        self.get_mut(handle)?.handoff = handoff;
        self.refresh_hot(handle);
        Ok(())
    }

    /// vLLM gave a receiving request the blocks its KV arrives into (it waits for remote KV
    /// from now on). A second report of the same arrival keeps the first time.
    pub fn on_remote_kv_started(&mut self, now_ms: f64, handle: ReqHandle) -> Result<()> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        let request = self.get_mut(handle)?;
        request.kv_arriving_since_ms.get_or_insert(now_ms);
        self.refresh_hot(handle);
        Ok(())
    }

    /// A receiving request's KV arrived (the connector's `finished_recving`): folds the arrival
    /// into the fit. Nothing to fold when its start was not seen.
    pub fn on_remote_kv_received(&mut self, now_ms: f64, handle: ReqHandle) -> Result<()> {
        let now_ms = check_time_ms("now_ms", now_ms)?;
        let request = self.get_mut(handle)?;
        let Some(since_ms) = request.kv_arriving_since_ms.take() else { return Ok(()) };
        let num_prompt_tokens = request.num_prompt_tokens;
        self.refresh_hot(handle);
        self.handoffs.on_received(num_prompt_tokens, (now_ms - since_ms).max(0.0))
    }

    /// A receiving request's KV did not arrive whole (blocks the connector reported invalid,
    /// [`Self::on_kv_load_failure`]): vLLM computes its prompt here after all.
    pub(super) fn on_handoff_failed(&mut self, handle: ReqHandle) -> Result<()> {
        let request = self.get_mut(handle)?;
        if request.handoff != KvHandoff::Receives {
            return Ok(());
        }
        request.handoff = KvHandoff::Local;
        request.kv_arriving_since_ms = None;
        self.refresh_hot(handle);
        self.handoffs.on_failed();
        Ok(())
    }

    /// Hand-off counts of this engine.
    pub fn handoff_counters(&self) -> HandoffCounters {
        self.handoffs.counters()
    }

    /// Milliseconds per prompt token a KV arrival takes here, once one was measured.
    pub fn kv_arrival_ms_per_token(&self) -> Option<f64> {
        self.handoffs.arrival_ms_per_token()
    }

    /// What a queued request's prompt costs before its first token: its KV's arrival when it
    /// comes from another engine and an arrival was measured, else its compute here (a
    /// preempted one computes its tokens again here).
    #[inline]
    pub(super) fn prompt_ms(&self, r: &Hot) -> f64 {
        match (r.handoff, self.handoffs.arrival_ms_per_token()) {
            (KvHandoff::Receives, Some(ms_per_token)) if !r.preempted => {
                f64::from(r.num_tokens) * ms_per_token
            }
            _ => self.prefill_ms(r.num_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tiers::tests::core as new_core;
    use crate::{KvHandoff, Meridian, NewRequest, ReqHandle};

    fn engine() -> Meridian {
        new_core(&format!("{{{CLASSES}}}"))
    }

    /// One class `c` that sheds, with a TTFT target of 1 s; prompts cost 1 ms per token here.
    const CLASSES: &str = r#""classes": {"c": {"ttft_ms": 1000, "ttfat_ms": 60000, "answer_tpot_ms": 100,
        "rank": 0, "on_overload": "shed"}}, "default_class": "c", "step_time": {"base_ms": 10,
        "per_prefill_token_ms": 1, "per_decode_request_ms": 0, "per_context_token_ms": 0, "online_fit": false}"#;

    fn add(core: &mut Meridian, id: &str, arrival_ms: f64, num_prompt_tokens: usize) -> ReqHandle {
        let prompt = vec![7u32; num_prompt_tokens];
        core.add_request(NewRequest {
            req_id: id,
            arrival_ms,
            prompt_token_ids: &prompt,
            max_tokens: 64,
            slo_class: None,
            priority: 0,
            waited_ms: 0.0,
        })
        .unwrap()
        .0
    }

    #[test]
    fn a_fast_arrival_keeps_a_long_prompt_viable_that_its_compute_would_shed() {
        // 1 ms per prompt token computed here is far slower than the arrivals measured here:
        // 2,000 tokens in 20 ms.
        let mut core = engine();
        let long = add(&mut core, "long", 0.0, 4000);
        core.set_kv_handoff(long, KvHandoff::Receives).unwrap();
        let plan = core.plan_step(10.0, &[], &[long], 100_000).unwrap();
        assert_eq!(plan.shed.len(), 1, "no arrival measured: its prompt is priced as compute, too slow");
        let mut core = engine();
        let seen = add(&mut core, "seen", 0.0, 2000);
        core.set_kv_handoff(seen, KvHandoff::Receives).unwrap();
        core.on_remote_kv_started(1.0, seen).unwrap();
        core.on_remote_kv_started(5.0, seen).unwrap();
        core.on_remote_kv_received(21.0, seen).unwrap();
        assert_eq!(core.kv_arrival_ms_per_token(), Some(0.01));
        assert_eq!(core.handoff_counters().num_received, 1);
        let long = add(&mut core, "long", 0.0, 4000);
        core.set_kv_handoff(long, KvHandoff::Receives).unwrap();
        let plan = core.plan_step(10.0, &[], &[long], 100_000).unwrap();
        assert!(plan.shed.is_empty(), "40 ms of arrival fits its 1 s TTFT target");
        assert_eq!(plan.num_admissible, 1);
    }

    #[test]
    fn a_sending_request_is_judged_and_counted_by_its_ttft_and_teaches_nothing() {
        let mut core = engine();
        let before = core.class_counters()[0];
        let sends = add(&mut core, "p", 0.0, 100);
        core.set_kv_handoff(sends, KvHandoff::Sends).unwrap();
        core.on_tokens(50.0, sends, &[9]).unwrap();
        let done = core.finish(60.0, sends, "length", &[9]).unwrap();
        assert_eq!(done.kv_handoff, KvHandoff::Sends);
        assert!(done.attainment.all(), "its TTFT was met; the rest is the decode engine's");
        let counters = core.class_counters()[0];
        assert_eq!(counters.num_met_all, before.num_met_all + 1);
        assert_eq!(core.handoff_counters().num_sent, 1);
        assert_eq!(core.recent_ttfat_attainment()[0], None, "the load-aware budget learns nothing");
        assert_eq!(core.stats().num_finished, 1);
    }

    #[test]
    fn a_failed_arrival_is_computed_here_and_counted() {
        let mut core = engine();
        let r = add(&mut core, "r", 0.0, 100);
        core.set_kv_handoff(r, KvHandoff::Receives).unwrap();
        core.on_remote_kv_started(1.0, r).unwrap();
        core.on_kv_load_failure(r, 2).unwrap();
        assert_eq!(core.handoff_counters().num_failed, 1);
        core.on_remote_kv_received(5.0, r).unwrap();
        assert_eq!(core.handoff_counters().num_received, 0, "a failed arrival is not fitted");
        assert_eq!(core.finish(9.0, r, "stop", &[]).unwrap().kv_handoff, KvHandoff::Local);
    }

    #[test]
    fn bad_times_and_stale_handles_change_nothing() {
        let mut core = engine();
        let r = add(&mut core, "r", 0.0, 100);
        assert!(core.on_remote_kv_started(f64::NAN, r).is_err());
        assert!(core.on_remote_kv_received(-1.0, r).is_err());
        core.finish(1.0, r, "stop", &[]).unwrap();
        assert!(core.set_kv_handoff(r, KvHandoff::Sends).is_err());
        assert!(core.on_remote_kv_started(2.0, r).is_err());
        assert_eq!(core.handoff_counters(), Default::default());
    }
}
