# Every target CI uses is here; .ci/run calls `make setup test lint`.
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION = 20

.PHONY: setup demo test lint synth bench bench-accuracy clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Re-installs only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml $(BIN)/python
	$(BIN)/pip install -q "torch==2.13.0" -e ".[dev,torch]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/trainguard demo

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check shared functions infra layers tests bench examples
	$(BIN)/ruff format --check shared functions infra layers tests bench examples
	$(BIN)/mypy

synth: setup
	$(BIN)/python infra/app.py

# Each writes its own section of docs/benchmarks.md; accuracy regenerates docs/accuracy.md.
bench: setup
	$(BIN)/python bench/hook_overhead.py
	$(BIN)/python bench/monitor_overhead.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/integrations_overhead.py

# Trains what the corpus cache lacks (resumable; TG_ACCURACY_CACHE moves it), then rescores
# every stored run and rewrites docs/accuracy.md. ACCURACY_WORKERS=1 on a busy machine.
ACCURACY_WORKERS ?= 2
bench-accuracy: setup
	nice -n 19 $(BIN)/python -m bench.accuracy all --workers $(ACCURACY_WORKERS)

clean:
	rm -rf $(VENV) cdk.out layers/build .pytest_cache .mypy_cache .ruff_cache
