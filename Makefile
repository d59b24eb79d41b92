# Two entry points for a fresh clone: `make demo` runs the whole pipeline on the built-in
# demo data (CPU), `make test` runs the checks and the test suite. Both create .venv when it is
# missing: `demo` with what a user needs, `test` with the test tools added.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
CORES ?= all
BIN := $(VENV)/bin
RUN := PATH="$(abspath $(BIN)):$$PATH"
PYTEST := $(RUN) $(BIN)/python -m pytest -q --strict-markers --durations=15 -n 2 --dist loadfile

# PyPI's Linux torch wheel is a multi-GB CUDA build. Machines without a GPU take the CPU build:
# from a local wheel when pip already sees one (find-links), else from PyTorch's CPU index.
# GPU machines (nvidia-smi on PATH) keep PyPI's CUDA build. Override with TORCH_INDEX=... (a
# login node without nvidia-smi installs the CPU build: training jobs that ask for GPUs then
# stop before training, saying so; install with TORCH_INDEX= there).
TORCH_INDEX ?= $(shell \
  if command -v nvidia-smi >/dev/null 2>&1; then echo ""; \
  elif $(PYTHON) -m pip install --dry-run --no-index --no-deps -q torch==$(TORCH_VERSION) >/dev/null 2>&1; then echo ""; \
  else echo "--index-url https://download.pytorch.org/whl/cpu"; fi)

.PHONY: venv dev-venv bench-venv demo demo-full dryrun test test-all test-fast lint clean-demo

venv: $(VENV)/.installed
dev-venv: $(VENV)/.installed-dev

# The torch installed is pinned for every later install (a constraints file): a dependency that
# pins torch itself (torchvision, through the resenc extra's timm) must take the one installed,
# not pull PyPI's CUDA build over it.
$(VENV)/.torch:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install $(TORCH_INDEX) "torch==$(TORCH_VERSION)"
	touch $@

$(VENV)/constraints.txt: $(VENV)/.torch
	echo "torch==$$($(BIN)/python -c 'import torch; print(torch.__version__)')" > $@

# a user's install: voxjet and the demo's event generator (where a wheel exists), no test tools
$(VENV)/.installed: pyproject.toml $(VENV)/constraints.txt
	$(BIN)/pip install -c $(VENV)/constraints.txt -e ".[pythia]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/constraints.txt
	$(BIN)/pip install -c $(VENV)/constraints.txt -e ".[dev]"
	touch $@ $(VENV)/.installed

# The benchmarks' peers (nnU-Net v2) in a venv of their own, the same torch pinned (their
# dependencies would otherwise pull another torch build): .venv-bench/bin/python benchmarks/...
BENCH_VENV ?= .venv-bench
bench-venv: $(BENCH_VENV)/.installed

$(BENCH_VENV)/.installed: pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -c "import torch" 2>/dev/null || $(BENCH_VENV)/bin/pip install $(TORCH_INDEX) "torch==$(TORCH_VERSION)"
	echo "torch==$$($(BENCH_VENV)/bin/python -c 'import torch; print(torch.__version__)')" > $(BENCH_VENV)/constraints.txt
	$(BENCH_VENV)/bin/pip install -c $(BENCH_VENV)/constraints.txt -e ".[bench]"
	touch $@

demo: venv
	$(RUN) $(BIN)/snakemake --cores $(CORES)

# the longer demo (config/demo-full.yaml): more jets and steps, every particle input
demo-full: venv
	$(RUN) $(BIN)/snakemake --cores $(CORES) --configfile config/demo-full.yaml

dryrun: venv
	$(RUN) $(BIN)/snakemake -n

lint: dev-venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports
	$(RUN) $(BIN)/snakemake --lint

# CI's suite (.ci/run): everything but the long studies (marker long: every --until, retries on
# the fake SLURM, compile, every benchmark; `make test-all` runs them too); `make test-fast`
# also leaves out the end-to-end runs (marker slow).
# Two pytest workers, a test file each at a time: the workflow tests spend much of their time
# waiting on subprocesses (Snakemake, torchrun, the fake SLURM's polling), and a file's session
# fixtures and fake SLURM job numbers stay in one process
test: lint
	$(PYTEST) -m "not long" $(TEST_ARGS)

test-all: lint
	$(PYTEST) $(TEST_ARGS)

test-fast: dev-venv
	$(PYTEST) -m "not slow and not long" $(TEST_ARGS)

clean-demo:
	rm -rf results resources logs .snakemake
