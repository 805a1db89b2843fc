# The two set-up commands: `make demo` and `make test`. Each works on a fresh machine by itself.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.braze-env
BUILD   := build/py
export PATH := $(abspath $(VENV))/bin:$(PATH)
export BRAZE_CACHE_DIR ?= $(abspath build/cache)
export OMP_NUM_THREADS ?= 2

.PHONY: env build demo test test-cpp test-python test-conformance bench-cpu bench-gpu clean

$(STAMP):
	@command -v g++ >/dev/null || (apt-get update && apt-get install -y g++)
	@test -f /usr/include/gtest/gtest.h || (apt-get update && apt-get install -y libgtest-dev)
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q numpy pytest expecttest nanobind scikit-build-core cmake ninja scipy-openblas64 transformers
	# NVRTC alone (no GPU needed): the tests compile braze's generated CUDA code with it.
	$(PIP) install -q nvidia-cuda-nvrtc-cu12
	touch $(STAMP)

env: $(STAMP)

# One CMake build serves the Python module, braze-opt, the C++ tests and the examples.
build: $(STAMP)
	$(PIP) install -q --no-build-isolation --no-deps . \
	    -Cbuild-dir=$(BUILD) -Ccmake.define.BRAZE_BUILD_TESTS=ON

demo: build
	$(PY) examples/demo.py

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j2

test-python: build
	$(PY) -m pytest -q tests/python

# A fixed subset of the OpInfo sweep (a few minutes): zero wrong, zero crashed or it fails.
test-conformance: build
	$(PY) tests/conformance/op_db_sweep.py --subset --quiet

test: test-cpp test-python test-conformance

bench-cpu: build
	$(PY) benchmarks/cpu_suite.py

# On a machine with an NVIDIA GPU and PyTorch's CUDA build: eager vs Inductor vs braze.
bench-gpu: build
	$(PY) benchmarks/gpu_suite.py

clean:
	rm -rf build

.PHONY: conformance

# The op_db conformance sweep (long): every OpInfo and dtype through backend="braze" against eager.
conformance: build
	$(PY) tests/conformance/op_db_sweep.py
