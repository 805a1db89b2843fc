# The two set-up commands: `make demo` and `make test`. Each works on a fresh machine by itself.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.braze-env
BUILD   := build/py
export PATH := $(abspath $(VENV))/bin:$(PATH)
export BRAZE_CACHE_DIR ?= $(abspath build/cache)
export OMP_NUM_THREADS ?= 2

.PHONY: env build demo test test-cpp test-python test-conformance bench-cpu bench-gpu zoo clean

$(STAMP): Makefile
	@command -v g++ >/dev/null || (apt-get update && apt-get install -y g++)
	@test -f /usr/include/gtest/gtest.h || (apt-get update && apt-get install -y libgtest-dev)
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	# Every version pinned to the one tested (an unpinned package changes under CI).
	$(PIP) install -q numpy==2.4.6 pytest==9.2.0 expecttest==0.3.0 nanobind==3.1.0 \
	    scikit-build-core==1.1.2 cmake==4.4.4 ninja==1.13.2 scipy-openblas64==0.3.34.481.3 \
	    transformers==5.23.0
	# oneDNN's GNU OpenMP build: CPU convolutions (it shares PyTorch's libgomp thread pool).
	$(PIP) install -q onednn-cpu-gomp==2023.2.0
	# NVRTC alone (no GPU needed): the tests compile braze's generated CUDA code with it.
	$(PIP) install -q nvidia-cuda-nvrtc-cu12==12.9.86
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

# The whole model zoo (tests/python/zoo.py) on the CPU; ZOO_DEVICE=cuda on a machine with a GPU.
ZOO_DEVICE ?= cpu
zoo: build
	$(PY) tests/python/zoo.py --device $(ZOO_DEVICE)

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
