#!/usr/bin/env bash
# The core's state-machine fuzz at benchmark size (crates/meridian-core/src/scheduler/state_machine.rs):
# random interleavings of everything a shim can call, random configurations, hostile arguments.
# CI runs 64 seeded cases in `cargo test`; this runs CASES cases (default 60,000, about ten million
# operations) per seed in release mode and keeps the printed counts and rates.
#   bench/fuzz_core.sh [CASES] [SEED...]        e.g. bench/fuzz_core.sh 60000 1 2 3
set -euo pipefail
cd "$(dirname "$0")/.."
CASES=${1:-60000}
shift || true
SEEDS=("${@:-1}")
OUT=bench/results/fuzz_core_$(date +%Y-%m-%d)
mkdir -p "$OUT"
for seed in "${SEEDS[@]}"; do
  PROPTEST_CASES=$CASES MERIDIAN_FUZZ_SEED=$seed cargo test -q --release -p meridian-core \
    scheduler::state_machine -- --nocapture 2>&1 | grep -E "core state machine|test result|panicked|minimal failing" \
    | tee -a "$OUT/run.log"
done
