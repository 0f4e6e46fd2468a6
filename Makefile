# Meridian developer targets. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
# scripts/setup.sh installs uv with pip where it is missing.
UV = $(shell command -v uv >/dev/null 2>&1 && echo uv || echo python3 -m uv)
export OMP_NUM_THREADS ?= 1

.DEFAULT_GOAL := help

.PHONY: help
help:  ## List the targets
	@grep -E '^[a-z0-9 -]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-17s %s\n", $$1, $$2}'

.PHONY: setup
setup:  ## Create .venv with vLLM's CPU build and install Meridian's wheel into it
	bash scripts/setup.sh

.PHONY: demo
demo: setup bench-live-setup  ## Set everything up, then run the main job (stock vLLM vs Meridian side by side)
	$(VENV)/bin/meridian demo

.PHONY: lint
lint:  ## rustfmt, clippy (warnings are errors), ruff, mypy --strict, the import contracts, the docs site --strict (needs .venv: make setup)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python/
	$(VENV)/bin/ruff format --check python/
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_import_time.py
	$(PY) scripts/gen_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

.PHONY: docs
docs: setup  ## Regenerate the configuration and metrics references and serve the docs site on 127.0.0.1:8000
	$(PY) scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

.PHONY: test-rust
test-rust:  ## Rust unit, property and doc tests; each criterion bench run once in test mode
	cargo test --workspace --exclude meridian-py
	cargo test -p meridian-core --benches

# One pytest-xdist run: the live-server tests are one scope (tests/conftest.py), run on one worker
# one server at a time, while the other workers take the in-process tests one by one (worksteal in
# test-fast, where there are no servers).
PYTEST = $(PY) -m pytest -q -p no:cacheprovider

.PHONY: test-py
test-py:  ## pytest, every layer: core binding, shim, offline engine, replay, demo, GPU (skips without one), live servers
	$(PYTEST) -n auto --dist loadscope tests

.PHONY: test-fast
test-fast:  ## pytest without the live servers, the engines run as processes and the GPU (about 90 s on 2 cores)
	$(PYTEST) -n auto --dist worksteal -m "not engine_processes" tests --ignore=tests/live --ignore=tests/gpu

.PHONY: test
test: setup bench-live-setup lint test-rust test-py test-vllm033 test-vllm034  ## Set everything up and run every test

#: Newer vLLM releases' Python, each unpacked beside the 0.32 venv into .vllm-MAJOR.MINOR: their
#: wheels are the CUDA build (0.33: about 336 MB, 0.34: 240 MB), whose scheduler, connectors and
#: engine loop import on a CPU-only machine; no model runs there. 0.34's CPU platform refuses x86
#: without triton-cpu: tests/triton_let_through.py lets that one check through for the tests.
test-vllm033: VLLM_RELEASE = 0.33.0
test-vllm034: VLLM_RELEASE = 0.34.0

.PHONY: test-vllm033 test-vllm034
test-vllm033 test-vllm034: setup  ## The in-process layers (core binding, shim, offline engine, replay) against vLLM 0.33's / 0.34's Python
	UV="$(UV)" $(PY) scripts/check_vllm.py $(VLLM_RELEASE) --only layers

#: One vLLM release against Meridian (docs/vllm.md, "Checking a new vLLM release"): its wheel
#: unpacked as for the passes above (the release .venv has, the CPU build, used as it is), the
#: in-process layers on it, then vLLM's own scheduler tests of that release (from its sdist,
#: cached in .cache/vllm-tests/) under vLLM's scheduler and under MeridianScheduler, every
#: difference checked against tests/vllm_own/by_design.toml. Not part of make test.
.PHONY: check-vllm
check-vllm: setup  ## Check a vLLM release against Meridian: make check-vllm VERSION=x.y.z
	@test -n "$(VERSION)" || { echo "usage: make check-vllm VERSION=x.y.z (a vLLM release on PyPI, e.g. 0.34.0)"; exit 2; }
	UV="$(UV)" $(PY) scripts/check_vllm.py $(VERSION)

.PHONY: bench
bench: setup  ## Decision time (criterion) and the shim's per-step overhead against stock vLLM
	cargo bench -p meridian-core --bench plan_step
	$(PY) bench/shim_overhead.py

.PHONY: bench-live-setup
bench-live-setup: setup  ## Install the load generator of the live A/B and demo (bench/requirements-live.txt) into .venv-bench
	$(UV) venv --quiet --allow-existing --python "$$(command -v python3)" .venv-bench
	$(UV) pip install --quiet --compile-bytecode --python .venv-bench/bin/python -r bench/requirements-live.txt

.PHONY: bench-live
bench-live: setup bench-live-setup  ## Live A/B: stock vLLM vs Meridian under aiperf, alternating rounds, both models (bench/live_ab.py)
	$(PY) bench/live_ab.py --model tiny
	$(PY) bench/live_ab.py --model compute

.PHONY: bench-fleet
bench-fleet: setup bench-live-setup  ## Fleet A/B: two vLLM replicas behind vllm-router, stock, vLLM's valve and Meridian's arms, aiperf at the router (bench/fleet_ab.py)
	$(PY) bench/fleet_ab.py

.PHONY: tiny-model
tiny-model: setup  ## Retrain the tiny reasoning model fixture (seeded, ~5 min on 2 cores) and rewrite its manifest
	$(PY) scripts/train_tiny.py tests/fixtures/tiny-reasoner --steps 1500 --seed 0

.PHONY: compute-model
compute-model: setup  ## Retrain the compute-bound fixture (head size 64, 4 layers; seeded, ~25 min on 2 cores)
	$(PY) scripts/train_tiny.py tests/fixtures/compute-reasoner --shape compute --steps 1500 --lr 1e-3 --seed 0 --half

.PHONY: long-model
long-model: setup  ## Retrain the long-reasoning fixture (countdowns up to 990; seeded, ~40 min on 2 cores)
	$(PY) scripts/train_tiny.py tests/fixtures/long-reasoner --shape long --steps 3000 --lr 1e-3 --seed 0

.PHONY: wheel
wheel: setup  ## Build the abi3 wheel into build/wheels (sets up .venv first, for maturin)
	$(VENV)/bin/maturin build --release --out build/wheels

.PHONY: clean
clean:  ## Remove build outputs (keeps .venv and caches)
	rm -rf build target
