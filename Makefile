# Two entry points for a fresh clone: `make demo` runs the whole pipeline on the built-in
# demo data (CPU), `make test` runs the test suite. Both create .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
CORES ?= 2
BIN := $(VENV)/bin

# PyPI's Linux torch wheel is a multi-GB CUDA build. Machines without a GPU take the CPU build:
# from a local wheel when pip already sees one (find-links), else from PyTorch's CPU index.
# GPU machines (nvidia-smi on PATH) keep PyPI's CUDA build. Override with TORCH_INDEX=... .
TORCH_INDEX ?= $(shell \
  if command -v nvidia-smi >/dev/null 2>&1; then echo ""; \
  elif $(PYTHON) -m pip install --dry-run --no-index --no-deps -q torch==$(TORCH_VERSION) >/dev/null 2>&1; then echo ""; \
  else echo "--index-url https://download.pytorch.org/whl/cpu"; fi)

.PHONY: venv demo test lint dryrun clean-demo

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install $(TORCH_INDEX) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -e ".[dev,pythia]"
	touch $@

demo: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --cores $(CORES)

dryrun: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake -n

test: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q $(TEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --lint

clean-demo:
	rm -rf results resources logs .snakemake
