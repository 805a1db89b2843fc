# The two set-up commands: `make demo` and `make test`. Each works on a fresh machine by itself.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.braze-env
BUILD   := build/py
export PATH := $(abspath $(VENV))/bin:$(PATH)
export BRAZE_CACHE_DIR ?= $(abspath build/cache)
export OMP_NUM_THREADS ?= 2

.PHONY: env build demo test test-cpp test-python test-conformance test-fuzz test-install wheel test-wheel bench-cpu bench-cpu-training bench-cpu-memory bench-cnn-training bench-gpu bench-gpu-training bench-gpu-attention bench-gpu-export bench-gpu-dropout bench-gpu-column-sums bench-gpu-column-sweep bench-gpu-bias-sweep bench-gpu-pointwise-sweep bench-optimizer bench-distributed bench-scatter zoo clean \
        sanitize fuzz fuzz-build

$(STAMP): Makefile
	@command -v g++ >/dev/null || (apt-get update && apt-get install -y g++)
	@test -f /usr/include/gtest/gtest.h || (apt-get update && apt-get install -y libgtest-dev)
	# The shared-cache tests start a Redis server of their own (they skip without one).
	@command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server) \
	    || echo "no redis-server: the Redis cache test will be skipped"
	# The compile report's test opens it in a headless browser (it skips without one).
	@command -v chromium >/dev/null || (apt-get update && apt-get install -y \
	    --no-install-recommends chromium) || echo "no chromium: the report's browser test will be skipped"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	# Every version pinned to the one tested (an unpinned package changes under CI).
	$(PIP) install -q numpy==2.4.6 pytest==9.2.0 expecttest==0.3.0 nanobind==3.1.0 \
	    scikit-build-core==1.1.2 cmake==4.4.4 ninja==1.13.2 scipy-openblas64==0.3.34.481.3 \
	    transformers==5.23.0 pytest-xdist==3.8.0 execnet==2.1.2 tlparse==0.4.3
	# oneDNN's GNU OpenMP build: CPU convolutions (it shares PyTorch's libgomp thread pool).
	$(PIP) install -q onednn-cpu-gomp==2023.2.0
	# NVRTC alone (no GPU needed): the tests compile braze's generated CUDA code with it.
	$(PIP) install -q nvidia-cuda-nvrtc-cu12==12.9.86
	touch $(STAMP)

env: $(STAMP)

# One CMake build serves the Python module, braze-opt, the C++ tests and the examples. A unity
# build (8 sources a unit) builds it from scratch in 150 s here against 255 s a source at a time;
# an edit then recompiles its whole unit. UNITY=OFF builds a source at a time.
UNITY ?= ON
BUILD_ARGS := -Cbuild-dir=$(BUILD) -Ccmake.define.BRAZE_BUILD_TESTS=ON \
    -Ccmake.define.CMAKE_UNITY_BUILD=$(UNITY) -Ccmake.define.CMAKE_UNITY_BUILD_BATCH_SIZE=8
build: $(STAMP)
	$(PIP) install -q --no-build-isolation --no-deps . $(BUILD_ARGS)

demo: build
	$(PY) examples/demo.py

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j2

# Two worker processes: the tests wait on the host compiler most of the time, so two share the
# two cores well (half the time of one when it was measured; 7.5 minutes here on 2026-12-03 for
# 1,129 tests, 15-17 minutes on slower days, most of make test). The 20 slowest are listed.
test-python: build
	$(PY) -m pytest -q -n 2 --durations=20 tests/python

# A fixed subset of the OpInfo sweep (a few minutes): zero wrong, zero crashed or it fails.
test-conformance: build
	$(PY) tests/conformance/op_db_sweep.py --subset --quiet

# The C++ package: installed from the build (component cxx), then examples/cpp/deploy built
# against it with find_package(braze) and run; its program links no libtorch and no libpython.
PREFIX := build/prefix
test-install: build
	rm -rf $(PREFIX) build/deploy
	cmake --install $(BUILD) --prefix $(PREFIX) --component cxx
	cmake -S examples/cpp/deploy -B build/deploy -G Ninja -DCMAKE_PREFIX_PATH=$(abspath $(PREFIX))
	cmake --build build/deploy
	@if ldd build/deploy/seed_example | grep -E 'libtorch|libpython'; then \
	    echo "test-install: the deployed program links libtorch or libpython"; exit 1; fi
	BRAZE_CACHE_DIR=$(abspath build/deploy/cache) build/deploy/seed_example 300 77
	BRAZE_CACHE_DIR=$(abspath build/deploy/cache) build/deploy/seed_example 5 77
	# Exported packages run by the runtime alone: no libtorch or libpython linked, no compiler
	# on PATH, BRAZE_CXX pointing nowhere.
	@if ldd build/deploy/run_package | grep -E 'libtorch|libpython'; then \
	    echo "test-install: run_package links libtorch or libpython"; exit 1; fi
	BRAZE_CACHE_DIR=$(abspath build/deploy/cache) $(PY) examples/export_packages.py build/deploy/packages
	for m in mlp cnn gpt2; do \
	    env PATH=/nonexistent BRAZE_CXX=/nonexistent/g++ build/deploy/run_package \
	        build/deploy/packages/$$m build/deploy/packages/$$m.cases/cases.txt || exit 1; \
	done
	env PATH=/nonexistent BRAZE_CXX=/nonexistent/g++ build/deploy/run_package \
	    build/deploy/packages/mlp.zip build/deploy/packages/mlp.cases/cases.txt

# The fuzz campaign under ASan and UBSan (its own clang build, about 5 minutes here) is
# `make test-fuzz`, not part of `make test`; ctest's fuzz-replay runs the fuzz target's checks
# over its regression inputs and the text tests' graphs in the ordinary build.
test: test-cpp test-python test-conformance test-install

# The whole model zoo (tests/python/zoo.py) on the CPU; ZOO_DEVICE=cuda on a machine with a GPU.
ZOO_DEVICE ?= cpu
zoo: build
	$(PY) tests/python/zoo.py --device $(ZOO_DEVICE)

bench-cpu: build
	$(PY) benchmarks/cpu_suite.py

# CPU attention training steps: eager, braze's fused kernels, braze's math path, Inductor.
bench-cpu-training: build
	$(PY) benchmarks/cpu_attention_training.py

# CPU attention's peak memory against the scores it never holds (forward S=4096, training S=2048).
bench-cpu-memory: build
	$(PY) benchmarks/cpu_attention_memory.py

# CNN training steps (ResNet-18-shaped, MobileNetV2) on the CPU: eager, Inductor, braze.
bench-cnn-training: build
	$(PY) benchmarks/cnn_training.py

# On a machine with an NVIDIA GPU and PyTorch's CUDA build: eager vs Inductor vs braze.
bench-gpu: build
	$(PY) benchmarks/gpu_suite.py

# On a machine with an NVIDIA GPU: the training steps of gpu_models.py (GPT-2, BERT-base,
# ResNet-50 in f32; a LLaMA-style decoder and ViT-B/16 under bf16 autocast), eager vs both
# Inductor modes vs braze, one process.
bench-gpu-training: build
	$(PY) benchmarks/gpu_models.py --only gpt2_train,bert_train,resnet50_train,llama_train,vit_train \
	    --backends eager,inductor,inductor_ro,braze

# braze's own CUDA attention kernel against cuDNN's, flash and memory-efficient attention.
bench-gpu-attention: build
	$(PY) benchmarks/gpu_attention.py

# On a machine with an NVIDIA GPU: CUDA packages of ResNet-50 and BERT-base (export, load, first
# run, steady state) against torch.compile, AOTInductor and eager.
bench-gpu-export: build
	$(PY) benchmarks/gpu_export.py build/gpu-packages

# On a machine with an NVIDIA GPU: a GPT-2 training step with attention dropout 0.1, eager vs
# Inductor vs braze, one process.
bench-gpu-dropout: build
	$(PY) benchmarks/gpu_dropout_training.py

# On a machine with an NVIDIA GPU: a channels-last batch norm's statistics, braze's column-sum
# kernel and forms of it alone, and the whole op against eager and Inductor.
bench-gpu-column-sums: build
	$(PY) benchmarks/gpu_column_sums.py

bench-gpu-column-sweep: build
	$(PY) benchmarks/gpu_column_sweep.py

# Bias gradients (column sums of ViT-B/16's and BERT-base's shapes): unsplit and in partials,
# under braze's records and others, on the GPU.
bench-gpu-bias-sweep: build
	$(PY) benchmarks/gpu_bias_sweep.py

# Pointwise kernels of bf16 training (casts, a mixed-precision residual, copies) under braze's
# launch record and others of other lanes and block sizes, on the GPU.
bench-gpu-pointwise-sweep: build
	$(PY) benchmarks/gpu_pointwise_sweep.py

bench-optimizer: build
	$(PY) benchmarks/optimizer_step.py $(if $(shell nvidia-smi -L 2>/dev/null),,--device cpu --scale 0.25)

# DDP and FSDP2 (blocks compiled, then sharded) on 2 ranks: NCCL where there are 2 GPUs, else gloo.
bench-distributed: build
	$(PY) benchmarks/distributed_training.py $(if $(shell nvidia-smi -L 2>/dev/null | sed -n 2p),,--device cpu --dim 256 --blocks 2)

bench-scatter: build
	$(PY) benchmarks/scatter_modes.py

# A wheel of braze (build/dist), from the same CMake build as `make build`.
wheel: build
	rm -rf build/dist
	$(PIP) wheel -q --no-build-isolation --no-deps -w build/dist . $(BUILD_ARGS)

# The wheel in a fresh virtual environment with torch and the wheel's dependencies (pinned as
# above): torch.compile(backend="braze") of the seed example compiles and matches eager.
WHEEL_VENV := build/wheel-venv
test-wheel: wheel
	rm -rf $(WHEEL_VENV)
	python3 -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q torch==2.13.0 scipy-openblas64==0.3.34.481.3 \
	    onednn-cpu-gomp==2023.2.0
	$(WHEEL_VENV)/bin/python -m pip install -q build/dist/braze-*.whl
	cd build && BRAZE_CACHE_DIR=$(abspath build/wheel-cache) $(abspath $(WHEEL_VENV))/bin/python \
	    $(abspath examples/wheel_check.py)

clean:
	rm -rf build

.PHONY: conformance

# The op_db conformance sweep (long): every OpInfo and dtype through backend="braze" against eager.
conformance: build
	$(PY) tests/conformance/op_db_sweep.py

# ---- hostile input: sanitizers and the fuzzer -------------------------------------------------

# Sanitizer reports end the process with an error; a leak inside a system library is suppressed
# in tests/sanitize/lsan.supp, which says why.
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    LSAN_OPTIONS=suppressions=$(abspath tests/sanitize/lsan.supp):print_suppressions=0

# The C++ libraries, braze-opt, the C++ tests and the examples under ASan and UBSan; runs ctest
# (the text tests included).
sanitize: $(STAMP)
	cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
	    -DBRAZE_SANITIZE=address,undefined -DBRAZE_BUILD_TESTS=ON
	cmake --build build/asan -j2
	cd build/asan && $(SAN_ENV) ctest --output-on-failure -j2

# libFuzzer (Debian's clang) over graph text -> parse -> verify -> every stage, under ASan and
# UBSan: tests/fuzz/GraphTextFuzz.cpp. Seeds: tests/lit and tests/fuzz/regressions (each crash
# found becomes a file there and a text test). New inputs collect in build/fuzz/corpus.
CLANGXX ?= clang++-14
FUZZ_SECONDS ?= 3600
FUZZ_ARGS := -timeout=20 -rss_limit_mb=4096 -max_len=16384 -print_final_stats=1
fuzz-build: $(STAMP)
	@command -v $(CLANGXX) >/dev/null && test -f /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a \
	    || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang-14 libclang-rt-14-dev)
	# A unity build (8 sources a unit): 168 s here against 235-250 s a source at a time.
	cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=$(CLANGXX) \
	    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRAZE_SANITIZE=address,undefined -DBRAZE_FUZZ=ON \
	    -DBRAZE_BUILD_TESTS=OFF -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8
	cmake --build build/fuzz --target braze-fuzz -j2

fuzz: fuzz-build
	mkdir -p build/fuzz/corpus
	$(SAN_ENV) build/fuzz/tests/fuzz/braze-fuzz $(FUZZ_ARGS) -max_total_time=$(FUZZ_SECONDS) \
	    build/fuzz/corpus tests/lit tests/fuzz/regressions

# Every regression input once under the sanitizers, then 3000 fuzzed inputs from the seeds with
# a fixed random seed (about 100 s here after a 170 s build; not part of make test, whose 20
# minutes it does not fit in), so that a run is reproducible and a failure is a regression of
# this commit. The seeds are listed in sorted order: given as directories, they load in the file
# system's order, which differs between machines, and so did the inputs. Exploring is `make
# fuzz`'s job. The log is build/fuzz/test-fuzz.log; its tail is printed when it finds something.
test-fuzz: fuzz-build
	$(SAN_ENV) build/fuzz/tests/fuzz/braze-fuzz $(FUZZ_ARGS) tests/fuzz/regressions/* \
	    > build/fuzz/test-fuzz.log 2>&1 || (tail -40 build/fuzz/test-fuzz.log; exit 1)
	rm -rf build/fuzz/corpus-test && mkdir -p build/fuzz/corpus-test
	find tests/lit tests/fuzz/regressions -type f -name '*.txt' | LC_ALL=C sort | paste -sd, > build/fuzz/seeds
	$(SAN_ENV) build/fuzz/tests/fuzz/braze-fuzz $(FUZZ_ARGS) -seed=1 -runs=3000 \
	    -seed_inputs=@build/fuzz/seeds build/fuzz/corpus-test \
	    >> build/fuzz/test-fuzz.log 2>&1 || (tail -60 build/fuzz/test-fuzz.log; exit 1)
	@grep "^Done\|stat::number_of_executed_units\|stat::new_units" build/fuzz/test-fuzz.log
