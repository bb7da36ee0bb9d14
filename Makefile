# SPDX-License-Identifier: Apache-2.0
# DYAD in C++. `make demo` and `make test` work on a fresh Debian 12 machine
# (as root, or with sudo): they install dependencies, configure, build, run.
BUILD ?= build
PY ?= /usr/bin/python3
CMAKE_FLAGS ?= -DDYAD_WARNINGS_AS_ERRORS=ON

.PHONY: all deps deps-build deps-test deps-bench configure build install test test-long test-asan fuzz fuzz-deps fuzz-merge demo bench bench-scale bench-workflow bench-outside bench-plot format check-format clean

all: build

# Each target installs only the Debian packages it needs (scripts/install-deps.sh
# says which): `make demo` the build's, `make test` adds the test suite's
# (etcd, Slurm, GlusterFS, PyTorch ...), `make bench` the baselines'.
deps:
	bash scripts/install-deps.sh all

deps-build:
	bash scripts/install-deps.sh build

deps-test:
	bash scripts/install-deps.sh test

deps-bench:
	bash scripts/install-deps.sh bench

$(BUILD)/build.ninja: | deps-build
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps-build
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j2

# Installs into $(PREFIX) (DESTDIR= stages it): configures the build for that
# prefix first, so that the library directory is the prefix's (multiarch
# lib/x86_64-linux-gnu for /usr on Debian) and the programs' RUNPATH
# points there.
PREFIX ?= /usr/local
install: | deps-build
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD) -j2
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD)

test: build | deps-test
	cd $(BUILD) && ctest --output-on-failure -LE long --timeout 600

test-long: build | deps-test
	cd $(BUILD) && ctest --output-on-failure -L long --timeout 3000

# The whole suite with AddressSanitizer, LeakSanitizer and UBSan.
test-asan: deps-test
	cmake -S . -B build-asan -G Ninja -DDYAD_ENABLE_ASAN=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan -j2
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --output-on-failure -LE long --timeout 900

# libFuzzer (clang) on every target in fuzz/ for FUZZ_SECONDS each, from a
# scratch copy of fuzz/corpus/ (build-fuzz/corpus): the checked-in corpus
# grows only by `make fuzz-merge`. Crashes land in build-fuzz/crashes/.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 2
FUZZ_TARGETS = frame hello request record address
# clang and libFuzzer's runtime (Debian 12: clang, libclang-rt-14-dev), for
# `make fuzz` only: `make test` never needs clang.
fuzz-deps: | deps-build
	@printf 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }\n' | \
	  clang++ -fsanitize=fuzzer -x c++ - -o /dev/null 2>/dev/null || \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev

fuzz: fuzz-deps
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DDYAD_FUZZ=ON -DDYAD_ENABLE_TESTS=OFF -DDYAD_ENABLE_UCX=OFF \
	  -DDYAD_ENABLE_OFI=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j$(FUZZ_JOBS) --target fuzz_all
	mkdir -p $(FUZZ_BUILD)/crashes
	set -e; for t in $(FUZZ_TARGETS); do \
	  rm -rf $(FUZZ_BUILD)/corpus/$$t; mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  cp fuzz/corpus/$$t/* $(FUZZ_BUILD)/corpus/$$t/; \
	  $(FUZZ_BUILD)/bin/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t- $(FUZZ_BUILD)/corpus/$$t \
	    2>&1 | tee $(FUZZ_BUILD)/fuzz_$$t.log | grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" || true; \
	done

# Adds to fuzz/corpus/ the inputs of the last `make fuzz` that reach new
# coverage (libFuzzer -merge=1: few files, not the whole scratch corpus).
fuzz-merge:
	set -e; for t in $(FUZZ_TARGETS); do \
	  $(FUZZ_BUILD)/bin/fuzz_$$t -merge=1 fuzz/corpus/$$t $(FUZZ_BUILD)/corpus/$$t; \
	done

demo: build
	$(PY) scripts/demo.py

# Results (JSON) and charts (PNG) go to $(BENCH_OUT) only; bench/results/
# holds tracked reference results, which `make bench` never rewrites.
BENCH_OUT ?= $(BUILD)/bench
BENCH_ENV = BENCH_OUT=$(abspath $(BENCH_OUT)) DYAD_BUILD_DIR=$(abspath $(BUILD))

bench: build | deps-bench
	$(BENCH_ENV) $(PY) bench/bench.py
	$(BENCH_ENV) $(PY) bench/wrapper_overhead.py
	$(BENCH_ENV) $(PY) bench/ucx_bench.py
	$(BENCH_ENV) $(PY) bench/ofi_bench.py
	$(BENCH_ENV) $(PY) bench/auto_bench.py
	$(BENCH_ENV) $(PY) bench/fairness_bench.py
	$(BENCH_ENV) $(PY) bench/auth_bench.py
	$(BENCH_ENV) $(PY) bench/ledger_bench.py
	$(BENCH_ENV) $(PY) bench/tail_bench.py
	$(BENCH_ENV) $(PY) bench/store_bench.py
	$(BENCH_ENV) $(PY) bench/range_bench.py
	$(BENCH_ENV) $(PY) bench/origin_bench.py
	$(BENCH_ENV) $(PY) bench/goals.py
	$(PY) bench/plot.py $(BENCH_OUT)

# How the metadata path grows with N = 4, 16, 64 nodes (bench/README.md;
# about 10 minutes): $(BENCH_OUT)/scale.md, scale.json, scale_*.png.
bench-scale: build | deps-bench
	$(BENCH_ENV) $(PY) bench/scale_bench.py

# DYAD against a real GlusterFS volume on DYAD's own workloads (the MD
# pipeline, DLIO-like training reads) across network-namespace nodes: minutes,
# as root. Tables (markdown), charts (PNG) and results.json in
# $(BENCH_OUT)/workflow; docs/workflow-bench.md says how and what it is not.
# BENCH_WORKFLOW_ARGS passes options (bench/workflow/run.py --help).
bench-workflow: build | deps-bench
	$(BENCH_ENV) $(PY) bench/workflow/run.py $(BENCH_WORKFLOW_ARGS)

# Read-through that spares the shared file system (issue 49, item 4;
# bench/README.md): GlusterFS reads per origin file on 3 namespace nodes, and
# a range re-read against pread from GlusterFS, as root. $(BENCH_OUT)/origin_once.json.
bench-origin-once: build | deps-bench
	$(BENCH_ENV) $(PY) bench/origin_once_bench.py

# DYAD beside outside tools (issue 49; bench/README.md): DLIO epochs through
# DYAD's loader (pydyad.dlio), GlusterFS and local disk, and the MD frame
# stream beside MPI send/recv and ADIOS2, on 2 and 4 namespace nodes, as root.
# DLIO_SRC and HYDRA_SRC (PYDFTRACER_SRC) name local source trees
# (scripts/bench-outside-setup.sh makes the venv, nothing is downloaded),
# ADIOS2_DIR an ADIOS2 install; a row whose tool is missing is skipped and
# says why. Debian packages: bash bench/outside/install-deps.sh. Writes
# $(BENCH_OUT)/outside. BENCH_OUTSIDE_ARGS: bench/outside/run.py --help.
bench-outside: build | deps-bench
	$(BENCH_ENV) $(PY) bench/outside/run.py $(BENCH_OUTSIDE_ARGS)

# Charts again from the JSON in $(BENCH_OUT) (no measurement). For the
# tracked reference results: $(PY) bench/plot.py bench/results (PNGs in
# build/bench/reference/).
bench-plot:
	$(PY) bench/plot.py $(BENCH_OUT)

FORMATTED = find include src tools tests examples bench fuzz \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' \)

format:
	$(FORMATTED) | xargs clang-format -i

check-format:
	$(FORMATTED) | xargs clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD)
