//! What each scheduling policy does, as one table: [`Policy::traits`]. The product (`meridian`)
//! and the baselines it is measured against differ only in the rows of this table, and every
//! policy branch of the scheduler reads a row of it instead of naming a policy, so "what does
//! `scorpio` do differently" is answered here. Invariant: the `meridian` row turns every rule on;
//! a baseline's row turns on only what its paper (or stock vLLM) does.

use crate::config::Policy;

/// How the running requests are ordered (vLLM schedules them in this order and preempts from
/// the back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunningOrder {
    /// Answers by next-token deadline, then thinking by slack, prompts after every decode, late
    /// work last (Meridian's dual queue).
    PhaseAndSlack,
    /// Answering requests first, then arrival order (the `answer_first` ablation).
    AnswersFirst,
    /// Thinking first, answers last, round robin within each (PASCAL).
    ThinkingFirstRoundRobin,
    /// Arrival pushed back by the work the request made known (UniBoost).
    BoostedArrival,
    /// Arrival order (SCORPIO's running requests).
    Arrival,
}

/// How the waiting requests are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingOrderRule {
    /// Preempted first, then class rank with aging, slack or value density, late requests last.
    ClassAndSlack,
    /// vLLM's own: preempted requests (back at the head) first, then arrival.
    PreemptedThenArrival,
    /// Arrival pushed back by the work the request made known (UniBoost).
    BoostedArrival,
    /// TTFT deadline, those that can no longer make it last (SCORPIO).
    TtftDeadline,
}

/// How many waiting requests a step may admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionRule {
    /// First-fit under the answer KV reserve and the TPOT guard, with triage's passed-over list.
    AnswerKvReserve,
    /// Up to SCORPIO's virtual batch: where the step-time model predicts the tightest TPOT target.
    VirtualBatch,
    /// Whatever vLLM's own KV check lets in.
    Vllm,
}

/// One policy's row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyTraits {
    /// Running order.
    pub running_order: RunningOrder,
    /// Waiting order.
    pub waiting_order: WaitingOrderRule,
    /// Admission per step.
    pub admission: AdmissionRule,
    /// Overload triage: a class's `on_overload` applies (otherwise every class is `queue`).
    pub triage: bool,
    /// A request recomputing after a preemption goes after the decodes of its phase.
    pub recompute_after_decodes: bool,
    /// An arriving request may preempt running thinking (`arrival_preemption`).
    pub arrival_preemption: bool,
    /// The per-step token budget from the step-time model (otherwise vLLM's
    /// `max_num_batched_tokens`).
    pub step_budget: bool,
    /// Answers are paced at their TPOT target and skip steps ahead of it (PASCAL).
    pub answer_pacing: bool,
    /// Preempting an answer is the policy, not a failure, so it raises no alarm (PASCAL).
    pub preempts_answers: bool,
    /// Finished reasoning blocks are evicted first (the first eviction tier).
    pub reasoning_eviction: bool,
    /// Prefix-aware admission over the core's prefix index (`prefix_affinity`).
    pub prefix_affinity: bool,
    /// A live request's blocks stored in a KV tier stay until it finishes (the tier's retention).
    pub tier_retention: bool,
}

impl Policy {
    /// What the policy does: one row of the table every policy branch reads.
    pub const fn traits(self) -> PolicyTraits {
        // The baselines run as published: vLLM's budget and admission unless their paper says
        // otherwise, no triage, no eviction tiers, no affinity.
        const BASELINE: PolicyTraits = PolicyTraits {
            running_order: RunningOrder::Arrival,
            waiting_order: WaitingOrderRule::PreemptedThenArrival,
            admission: AdmissionRule::Vllm,
            triage: false,
            recompute_after_decodes: false,
            arrival_preemption: false,
            step_budget: false,
            answer_pacing: false,
            preempts_answers: false,
            reasoning_eviction: false,
            prefix_affinity: false,
            tier_retention: false,
        };
        match self {
            Policy::Meridian => PolicyTraits {
                running_order: RunningOrder::PhaseAndSlack,
                waiting_order: WaitingOrderRule::ClassAndSlack,
                admission: AdmissionRule::AnswerKvReserve,
                triage: true,
                recompute_after_decodes: true,
                arrival_preemption: true,
                step_budget: true,
                answer_pacing: false,
                preempts_answers: false,
                reasoning_eviction: true,
                prefix_affinity: true,
                tier_retention: true,
            },
            Policy::AnswerFirst => PolicyTraits { running_order: RunningOrder::AnswersFirst, ..BASELINE },
            Policy::Pascal => PolicyTraits {
                running_order: RunningOrder::ThinkingFirstRoundRobin,
                answer_pacing: true,
                preempts_answers: true,
                ..BASELINE
            },
            Policy::UniBoost => PolicyTraits {
                running_order: RunningOrder::BoostedArrival,
                waiting_order: WaitingOrderRule::BoostedArrival,
                ..BASELINE
            },
            Policy::Scorpio => PolicyTraits {
                waiting_order: WaitingOrderRule::TtftDeadline,
                admission: AdmissionRule::VirtualBatch,
                ..BASELINE
            },
        }
    }
}

/// The sort groups of the order keys: an [`super::OrderKey`]'s first element, ascending.
pub(super) mod group {
    /// Running: answering requests (and, after them, an answer recomputing after a preemption).
    pub const ANSWERING: u64 = 0;
    /// Running: thinking that can still make its TTFAT target.
    pub const THINKING: u64 = 1;
    /// Running: thinking past its late bound, most sunk work first (and, after it, thinking
    /// recomputing after a preemption).
    pub const THINKING_PAST_BOUND: u64 = 2;
    /// Running: prompts being computed that can still make their targets.
    pub const PROMPT: u64 = 3;
    /// Running: prompts being computed that can no longer make them.
    pub const LATE_PROMPT: u64 = 4;
    /// Running: thinking that can no longer make its target, not yet past its late bound.
    pub const LATE_THINKING: u64 = 5;
    /// Waiting: starved, or late and past its late-wait bound: by arrival, ahead of the rest.
    pub const OVERDUE: u64 = 6;
    /// Waiting: everything else, by class rank then urgency within the key's primary part.
    pub const RANKED: u64 = 7;
    /// Running or waiting: shed, ended by the shim before vLLM schedules the step; last.
    pub const SHED: u64 = 7;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_meridian_triages_and_every_rule_is_meridians() {
        for policy in Policy::ALL {
            let t = policy.traits();
            let is_meridian = policy == Policy::Meridian;
            assert_eq!(t.triage, is_meridian, "{policy:?}");
            assert_eq!(t.step_budget, is_meridian, "{policy:?}");
            assert_eq!(t.reasoning_eviction, is_meridian, "{policy:?}");
            assert_eq!(t.prefix_affinity, is_meridian, "{policy:?}");
            assert_eq!(t.tier_retention, is_meridian, "{policy:?}");
            assert_eq!(t.answer_pacing, policy == Policy::Pascal, "{policy:?}");
        }
        let orders: Vec<_> = Policy::ALL.map(|p| p.traits().running_order).into();
        let mut unique = orders.clone();
        unique.dedup();
        assert_eq!(unique.len(), orders.len(), "each policy orders its running requests its own way");
    }
}
