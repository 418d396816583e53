# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# An exact pin: on the CPU-only development/CI machines it resolves to the CPU
# wheel on disk; a bare `torch` would pull the newest release with several GB
# of CUDA packages. The runtime image installs the CUDA build (Containerfile).
TORCH_SPEC ?= torch==2.13.0

.PHONY: install run test compile bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[local,test]" "$(TORCH_SPEC)"
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) -m pipelines.run

test: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m pytest

compile: install
	$(PY) -m pipelines.compile

bench: install
	$(PY) benchmarks/prep_bench.py
	$(PY) benchmarks/train_bench.py
	$(PY) benchmarks/fit_bench.py
	$(PY) benchmarks/gguf_bench.py

clean:
	rm -rf local-run .pytest_cache
