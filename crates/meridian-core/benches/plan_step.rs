//! One engine step's decisions (`Meridian::plan_step`) at 64 / 256 / 1,024 / 4,096 live requests,
//! half running (a mix of answering and thinking), half waiting. Target: under 20 µs at 1,024,
//! also with prefix-aware admission ordering the head of a queue of cached prompts.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use meridian_core::{Config, EngineLimits, Medium, Meridian, NewRequest, ReasoningMarkers, ReqHandle};
use std::hint::black_box;

const END: u32 = 2;

fn populated(num_requests: usize) -> (Meridian, Vec<ReqHandle>, Vec<ReqHandle>) {
    populated_with(Config::default(), num_requests)
}

fn populated_with(config: Config, num_requests: usize) -> (Meridian, Vec<ReqHandle>, Vec<ReqHandle>) {
    let limits = EngineLimits::new(16, 8192, 4096);
    let markers = ReasoningMarkers::new(vec![1], vec![END], vec![]);
    let mut core = Meridian::new(config, limits, markers).unwrap();
    let classes = ["interactive", "standard", "batch"];
    let mut running = Vec::new();
    let mut waiting = Vec::new();
    let prompt = vec![7u32; 512];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..num_requests {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let id = format!("req-{i}");
        let (h, _) = core
            .add_request(NewRequest {
                req_id: &id,
                arrival_ms: (i as f64) * 3.0,
                prompt_token_ids: &prompt[..64 + (rng % 448) as usize],
                max_tokens: 8192,
                slo_class: Some(classes[i % 3]),
                priority: 0,
                waited_ms: 0.0,
            })
            .unwrap();
        if i % 2 == 0 {
            let thought = vec![9u32; 1 + (rng >> 20) as usize % 400];
            core.on_tokens(i as f64 * 3.0 + 100.0, h, &thought).unwrap();
            if rng % 3 == 0 {
                core.on_tokens(i as f64 * 3.0 + 200.0, h, &[END, 9, 9]).unwrap();
            }
            running.push(h);
        } else {
            waiting.push(h);
        }
    }
    (core, running, waiting)
}

/// The lists as the engine loop hands them back: in the order of one plan made at `now_ms`.
fn in_plan_order(
    core: &mut Meridian,
    now_ms: f64,
    running: &[ReqHandle],
    waiting: &[ReqHandle],
) -> (Vec<ReqHandle>, Vec<ReqHandle>) {
    let plan = core.plan_step(now_ms, running, waiting, 10_000).unwrap();
    (
        plan.running_order.iter().map(|&i| running[i as usize]).collect(),
        plan.waiting_order.iter().map(|&i| waiting[i as usize]).collect(),
    )
}

/// Times the steady-state plan of `n` requests: the lists as one plan left them.
fn bench_steady(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    mut core: Meridian,
    running: &[ReqHandle],
    waiting: &[ReqHandle],
) {
    let now_ms = n as f64 * 3.0 + 500.0;
    let (running, waiting) = in_plan_order(&mut core, now_ms, running, waiting);
    group.throughput(Throughput::Elements(n as u64));
    group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
        b.iter(|| {
            black_box(core.plan_step(now_ms, black_box(&running), black_box(&waiting), 10_000).unwrap())
        })
    });
}

/// Steady state: as in the engine loop, the lists come back in the previous plan's order.
fn bench_plan_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_step");
    for n in [64usize, 256, 1024, 4096] {
        let (core, running, waiting) = populated(n);
        bench_steady(&mut group, n, core, &running, &waiting);
    }
    group.finish();
}

/// The same steady state with the waiting order before value density (least slack first), for
/// the cost of the density key side by side.
fn bench_plan_step_slack(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_step_slack");
    for n in [1024usize, 4096] {
        let config = Config::from_json(r#"{"overload": {"waiting_order": "slack"}}"#).unwrap();
        let (core, running, waiting) = populated_with(config, n);
        bench_steady(&mut group, n, core, &running, &waiting);
    }
    group.finish();
}

/// Worst case: lists in an order unrelated to the policy's (first step after a burst of arrivals).
fn bench_plan_step_shuffled(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_step_shuffled");
    let n = 1024usize;
    let (mut core, running, waiting) = populated(n);
    let now_ms = n as f64 * 3.0 + 500.0;
    group.throughput(Throughput::Elements(n as u64));
    group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
        b.iter(|| {
            black_box(core.plan_step(now_ms, black_box(&running), black_box(&waiting), 10_000).unwrap())
        })
    });
    group.finish();
}

/// With prefix-aware admission at work: every waiting request's prompt has its block hashes (one
/// of 16 shared system prompts of 16 blocks, then its own blocks), the device cache holds the
/// shared prompts' blocks, so the head of the waiting order is ordered again by cached prefix.
fn bench_plan_step_prefix(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_step_prefix");
    let n = 1024usize;
    let (mut core, running, waiting) = populated(n);
    let shared = |doc: u64, block: u64| 0xA5A5_0000_0000 + doc * 1_000 + block;
    for (i, &h) in waiting.iter().enumerate() {
        let doc = i as u64 % 16;
        let own = (0..16).map(|b| 0x5A5A_0000_0000 + i as u64 * 1_000 + b);
        core.set_block_hashes(h, (0..16).map(|b| shared(doc, b)).chain(own).collect()).unwrap();
    }
    let cached: Vec<u64> = (0..16).flat_map(|doc| (0..16).map(move |b| shared(doc, b))).collect();
    core.on_blocks_stored(Medium::Device, &cached).unwrap();
    bench_steady(&mut group, n, core, &running, &waiting);
    group.finish();
}

criterion_group!(
    benches,
    bench_plan_step,
    bench_plan_step_slack,
    bench_plan_step_shuffled,
    bench_plan_step_prefix
);
criterion_main!(benches);
