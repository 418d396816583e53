# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# An exact pin: on the CPU-only development/CI machines it resolves to the CPU
# wheel on disk; a bare `torch` would pull the newest release with several GB
# of CUDA packages. The runtime image installs the CUDA build of the same
# version, which `make lock` writes into $(IMAGE_LOCK).
TORCH_SPEC ?= torch==2.13.0

# The exact versions, with hashes, that the suite passes with (README: "The lock files").
# $(LOCK): `make install` here and in CI, the local and test extras; torch is left to TORCH_SPEC.
# $(IMAGE_LOCK): the runtime image, the gpu extra and the CUDA torch, every version
# it shares with $(LOCK) held to it.
LOCK := requirements.lock
IMAGE_LOCK := requirements-image.lock
# $(BUILD_LOCK): what the image builds $(IMAGE_LOCK)'s sdist-only packages with (llama-cpp-python and the others
# $(BUILD_IN) names), installed before it so that pip builds them with --no-build-isolation from hashed files.
BUILD_IN := requirements-build.in
BUILD_LOCK := requirements-build.lock
# `make lock` resolves with uv for the Python and platform of the development and CI
# machines and of the runtime image (UBI 9, Python 3.11, x86_64 glibc).
UV_SPEC ?= uv==0.13.9
UV_HOME := $(VENV)/uv
LOCK_UPGRADE ?= --upgrade
UV := $(UV_HOME)/bin/uv
UV_RESOLVE = --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
	--custom-compile-command "make lock" --quiet $(LOCK_UPGRADE)
UV_COMPILE = $(UV) pip compile pyproject.toml - $(UV_RESOLVE)
# Where `make lock` finds the CPU build of torch whose dependencies $(LOCK) records:
# pip's find-links where they are set (the wheel on disk here), else PyTorch's CPU wheels.
TORCH_CPU_WHEELS ?= $(or $(PIP_FIND_LINKS),https://download.pytorch.org/whl/cpu/torch/)
# What the development environment resolves: $(LOCK), and `make test-lowest`'s venv.
DEV_RESOLVE = --extra local --extra test --find-links "$(TORCH_CPU_WHEELS)" --no-emit-package torch

.PHONY: install test-packages lock test-lowest run test test-fast compile bench clean

# The venv, with the project installed in it in editable mode.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Every install (so every `make test` and `make run`) brings the venv to the lock:
# about two seconds when it is there already, and the fix tests/test_lock.py names
# when it is not (after a pull that moved the lock, or a hand-installed version).
# One pip per core, each with part of the lock and its hashes (tools/install_lock.py):
# a clean clone's install took 79 s on a 2-core host, and 147-152 s with one pip.
install: $(VENV)/.installed
	$(PY) tools/install_lock.py $(LOCK) --also "$(TORCH_SPEC)"
	$(PY) -m pip check

# Move the locks forward to the newest versions pyproject.toml and $(BUILD_IN) admit (LOCK_UPGRADE=
# keeps the current pins and only adds what pyproject.toml newly asks for). Then
# recompile the pipeline, run the suite, and commit the locks and compiled/ together. uv lives
# outside the project's environment, which holds exactly the lock.
lock: $(UV)
	echo "$(TORCH_SPEC)" | $(UV_COMPILE) $(DEV_RESOLVE) --output-file $(LOCK)
	@! grep -E '^(nvidia-|triton==)' $(LOCK) || { echo "$(LOCK) holds CUDA packages: torch resolved to its CUDA build; \
	set TORCH_CPU_WHEELS to a folder or page with the CPU wheel of $(TORCH_SPEC)." >&2; exit 1; }
	echo "$(TORCH_SPEC)" | $(UV_COMPILE) --extra gpu --constraint $(LOCK) --output-file $(IMAGE_LOCK)
	$(UV) pip compile $(BUILD_IN) $(UV_RESOLVE) --constraint $(IMAGE_LOCK) --output-file $(BUILD_LOCK)

$(UV): Makefile
	$(PYTHON) -m pip install --quiet --upgrade --target $(UV_HOME) "$(UV_SPEC)"
	touch $@

# pyproject.toml's lower bounds, checked: the suite on the lowest versions its ranges
# admit (uv's lowest-direct resolution), in a venv of its own. The drift test is left
# out, since this venv is not the lock by design. Run it when a range moves.
LOWEST_VENV ?= .venv-lowest
# The rest resolves against the exact torch installed first: a lowest resolution would
# otherwise take the plain (CUDA) build over the CPU one, whose version sorts above it.
test-lowest: $(UV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install --quiet --no-deps "$(TORCH_SPEC)"
	$(LOWEST_VENV)/bin/python -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' \
		| $(UV_COMPILE) $(DEV_RESOLVE) --resolution lowest-direct --output-file $(LOWEST_VENV)/lowest.txt
	$(LOWEST_VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r $(LOWEST_VENV)/lowest.txt
	$(LOWEST_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(LOWEST_VENV)/bin/python -m pip check
	$(LOWEST_VENV)/bin/python -m pytest --deselect tests/test_lock.py::test_the_installed_packages_are_the_locked_ones

run: install
	$(PY) -m pipelines.run

# What the suite runs for real that pip cannot install (Debian packages): the CNCF distribution registry,
# skopeo (the independent client that pulls pushed images back) and a static busybox (the modelcar base).
# As root, as in CI, `make test` installs what is missing; otherwise it stops at once with the command.
TEST_PACKAGES := docker-registry skopeo busybox-static
test-packages:
	@missing=$$(for package in $(TEST_PACKAGES); do dpkg-query -W -f='$${Status}' $$package 2>/dev/null \
		| grep -q "ok installed" || echo $$package; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "make test needs" $$missing "- install them with:" \
			"sudo apt-get install -y --no-install-recommends $(TEST_PACKAGES)" >&2; exit 1; fi; \
		apt-get install -y --no-install-recommends $$missing \
		|| { apt-get update && apt-get install -y --no-install-recommends $$missing; }; \
	fi

# The suite runs in $(TEST_WORKERS) processes (pytest-xdist), one per core of the 2-core CI hosts; each gets its
# share of the cores for torch's threads (tests/process_settings.py). TEST_WORKERS=4 on a bigger machine.
TEST_WORKERS ?= 2

# The docs site fails on a broken link, a missing page or an anchor that is not there (strict).
test: install test-packages
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=20

# While you iterate: the checks a change most often breaks, in under 3 minutes (docs/contributing.md). It is not
# the suite: `make test` is, and what CI runs.
TEST_FAST := tests/test_lock.py tests/test_layers.py tests/test_parameters.py tests/test_run_parameters.py \
	tests/test_cli_options.py tests/test_compile.py tests/test_prepare_inputs.py tests/test_prepare_rejects.py \
	tests/test_prepare_shapes.py tests/test_split.py tests/test_train_manifests.py tests/test_train_render.py
test-fast: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) -q $(TEST_FAST)

# After adding or changing a run parameter: the literal signatures KFP reads and the run-parameter
# guide's table, then the pipeline YAML.
compile: install
	$(PY) -m pipelines.generate
	$(PY) -m pipelines.compile

bench: install
	$(PY) benchmarks/prep_bench.py
	$(PY) benchmarks/tokenise_bench.py
	$(PY) benchmarks/train_bench.py
	$(PY) benchmarks/fit_bench.py
	$(PY) benchmarks/qlora_bench.py
	$(PY) benchmarks/gguf_bench.py
	$(PY) benchmarks/gguf_reader_bench.py
	$(PY) benchmarks/lm_eval_bench.py
	$(PY) benchmarks/contamination_bench.py

# What the GPU check (benchmarks/gpu_check.py) carries to a GPU machine with no network: the wheels its image
# lacks, at $(IMAGE_LOCK)'s versions, and SmolLM2's tokenizer, into .gpu-check/ (docs/benchmarks.md).
.PHONY: gpu-check
gpu-check: install
	$(PY) benchmarks/gpu_check.py --fetch

clean:
	rm -rf local-run .pytest_cache
