# normlab: `make demo` runs the main job, `make test` installs what it needs and runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# Two stamps: CORE (torch and normlab's own dependencies: what `make demo` imports) and STAMP (everything the tests
# need: the integrations and test tools as extras). A `make demo` install followed by `make test` installs the rest;
# after `make test`, `make demo` installs nothing.
CORE := $(VENV)/.core-$(HASH)
STAMP := $(VENV)/.installed-$(HASH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test bench install clean

# A checkout of karpathy/nanoGPT for `make bench` (git clone https://github.com/karpathy/nanoGPT ../nanoGPT);
# without one the nanoGPT rows are skipped.
NANOGPT ?= ../nanoGPT

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first (the local CPU wheel), then the project: a plain torch requirement would pull CUDA packages.
$(CORE): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $(CORE)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,hf,interop,lm-eval,ray,tensorboard,wandb,mlflow]'
	touch $(CORE) $(STAMP)

install: $(STAMP)

# The demo needs only the core: after a full install (`make test`) it installs nothing.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(CORE))
	$(BIN)/python -m normlab.demo

# Debian's chromium lets the report-rendering test run; installing it is best effort and never fails the build.
# Two pytest-xdist workers: alone, the suite keeps less than one of 2 cores busy (it waits on subprocesses, Ray and
# torchrun), so two workers nearly halve its wall time. --dist loadscope keeps a module's tests in one worker, so a
# module-scoped fixture (a trained run, a sweep, the Ray cluster) is built once.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y chromium >/dev/null 2>&1) || echo "chromium not installed: the report screenshot test will be skipped")
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/train_throughput.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/nanogpt_speed.py $(if $(wildcard $(NANOGPT)/model.py),--nanogpt $(NANOGPT)) --out docs/benchmarks.md
	$(BIN)/python benchmarks/precision_numerics.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/attention_speed.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/diag_overhead.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/norm_speed.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/ddp_throughput.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/sweep_overhead.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/heap_policy.py --shapes demo,S,M --out docs/benchmarks.md

clean:
	rm -rf $(VENV) runs .pytest_cache
