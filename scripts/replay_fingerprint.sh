#!/usr/bin/env bash
# Decision fingerprint: replay summaries of every policy at two seeds on the bundled Azure excerpt
# and on a Mooncake window, written as JSON into OUT_DIR. A change that must not change any
# decision (a restructuring) leaves them byte-identical: run this before and after, then
# `cmp` each pair (`scripts/replay_fingerprint.sh before; ...; scripts/replay_fingerprint.sh after;
# for f in before/*.json; do cmp "$f" "after/${f#before/}"; done`).
set -euo pipefail
out=${1:?usage: scripts/replay_fingerprint.sh OUT_DIR [MOONCAKE_TRACE]}
mooncake=${2:-../shared/traces/mooncake/synthetic_trace.jsonl}
meridian=${MERIDIAN:-.venv/bin/meridian}
mkdir -p "$out"
for seed in 0 1; do
  "$meridian" replay --seed "$seed" --limit 400 --no-progress --json "$out/azure-seed$seed.json" >/dev/null
  if [ -f "$mooncake" ]; then
    "$meridian" replay --trace "$mooncake" --duration-s 240 --rate-scale 0.42 --limit 400 --seed "$seed" --no-progress \
      --json "$out/mooncake-seed$seed.json" >/dev/null
  fi
done
ls -l "$out"
