//! Meridian's policy core: phase- and SLO-aware scheduling decisions for serving reasoning
//! models on vLLM. Pure Rust with no Python: the vLLM shim hands it plain numbers once per engine
//! step and gets plain decisions back (orders, budgets, victims, never-reusable blocks).
//!
//! ```
//! use meridian_core::{Config, EngineLimits, Meridian, NewRequest, ReasoningMarkers};
//!
//! const THINK_END: u32 = 2;
//! let limits = EngineLimits::new(16, 2048, 64);
//! let markers = ReasoningMarkers::new(vec![1], vec![THINK_END], vec![]);
//! let mut core = Meridian::new(Config::default(), limits, markers).unwrap();
//! let new = |req_id| NewRequest {
//!     req_id, arrival_ms: 0.0, prompt_token_ids: &[7, 8, 9], max_tokens: 64,
//!     slo_class: None, priority: 0, waited_ms: 0.0,
//! };
//! let (thinker, class) = core.add_request(new("a")).unwrap();
//! assert_eq!(core.config().classes[class.index()].name, "standard"); // priority 0's class
//! let (answerer, _) = core.add_request(new("b")).unwrap();
//! core.on_tokens(5.0, thinker, &[42]).unwrap();
//! core.on_tokens(5.0, answerer, &[42, THINK_END, 43]).unwrap();
//! let plan = core.plan_step(10.0, &[thinker, answerer], &[], 100).unwrap();
//! // The answering request goes first; the thinking one is the preemption victim.
//! assert_eq!(plan.running_order, vec![1, 0]);
//! // vLLM's finish reason and its full output list: the unseen tail (44) is fed first.
//! let done = core.finish(12.0, answerer, "stop", &[42, THINK_END, 43, 44]).unwrap();
//! assert_eq!((done.reason.name(), done.ledger.num_answer_tokens), ("stopped", 2));
//! ```

#![warn(missing_docs)]

pub mod admission;
pub mod config;
pub mod error;
pub mod handoff;
pub mod kv_tier;
pub mod ledger;
pub mod phase;
pub mod predictor;
pub mod prefix_index;
pub mod reasoning_effort;
pub mod request_args;
pub mod scheduler;
pub mod slo;
pub mod step_model;
pub mod thinking;

pub use admission::{ArrivalDecision, ArrivalGate, ArrivalSnapshot, ARRIVAL_SNAPSHOT_FORMAT};
pub use config::{
    ArrivalPreemption, Config, KvTierConfig, Overload, Policy, PrefixAffinity, ReasoningBlockRule,
    RestoreMode, StepTimeProfile, SHED_STATUSES,
};
pub use error::{Error, Result};
pub use handoff::{HandoffCounters, KvHandoff};
pub use kv_tier::{RestorePlan, TierCounters, TierId, TierSpan};
pub use ledger::{
    Attainment, ClassCounters, FinishReason, PhaseCounts, PhaseCountsU64, RequestLedger, RequestMetrics,
};
pub use phase::{Phase, ReasoningMarkers, TokenKind};
pub use prefix_index::{CachedPrefix, Medium, PrefixIndex};
pub use reasoning_effort::{EffortBudgets, ReasoningEffort, EFFORT_ARG};
pub use request_args::{check_request_args, thinking_control_for_request, MAX_WAITED_MS, WAITED_ARG};
pub use scheduler::{
    parse_shed_notice, AdmissionRule, AsyncKvLoads, ClassLoad, EngineLimits, EngineLoad, FinishedRequest,
    Footprint, Meridian, NewRequest, PolicyTraits, Preemption, ReqHandle, RunningOrder, SchedulerStats, Shed,
    ShedNotice, ShedReason, StepPlan, WaitingOrderRule, SHED_MARKER,
};
pub use slo::{ClassId, OnOverload, ShedUntil, SloClass, SloTargets, WaitingOrder, CLASS_ARG};
pub use step_model::{StepCoefficients, StepShape};
pub use thinking::{
    Boundaries, Boundary, ClosingPolicy, EatRule, EatSignal, FiredAt, IgnoredInputs, LoadAwareBudget,
    ProxyRule, RpdiRule, RpdiSignal, StopReason, StreamPhase, ThinkingControl, ThinkingState, ThinkingStream,
    TokenSignals, THINKING_ARG, THINKING_BUDGET_ARG,
};
