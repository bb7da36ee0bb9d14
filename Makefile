# SPDX-License-Identifier: Apache-2.0
# DYAD in C++. `make demo` and `make test` work on a fresh Debian 12 machine
# (as root, or with sudo): they install dependencies, configure, build, run.
BUILD ?= build
PY ?= /usr/bin/python3
CMAKE_FLAGS ?= -DDYAD_WARNINGS_AS_ERRORS=ON

.PHONY: all deps configure build install test test-long test-asan demo bench bench-plot format check-format clean

all: build

deps:
	bash scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j2

# Installs into $(PREFIX) (DESTDIR= stages it): configures the build for that
# prefix first, so that the library directory is the prefix's (multiarch
# lib/x86_64-linux-gnu for /usr on Debian) and the programs' RUNPATH
# points there.
PREFIX ?= /usr/local
install: | deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD) -j2
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -LE long --timeout 600

test-long: build
	cd $(BUILD) && ctest --output-on-failure -L long --timeout 3000

# The whole suite with AddressSanitizer, LeakSanitizer and UBSan.
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DDYAD_ENABLE_ASAN=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan -j2
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --output-on-failure -LE long --timeout 900

demo: build
	$(PY) scripts/demo.py

# Results (JSON) and charts (PNG) go to $(BENCH_OUT) only; bench/results/
# holds tracked reference results, which `make bench` never rewrites.
BENCH_OUT ?= $(BUILD)/bench
BENCH_ENV = BENCH_OUT=$(abspath $(BENCH_OUT)) DYAD_BUILD_DIR=$(abspath $(BUILD))

bench: build
	$(BENCH_ENV) $(PY) bench/bench.py
	$(BENCH_ENV) $(PY) bench/wrapper_overhead.py
	$(BENCH_ENV) $(PY) bench/ucx_bench.py
	$(BENCH_ENV) $(PY) bench/ofi_bench.py
	$(BENCH_ENV) $(PY) bench/auto_bench.py
	$(BENCH_ENV) $(PY) bench/fairness_bench.py
	$(BENCH_ENV) $(PY) bench/auth_bench.py
	$(PY) bench/plot.py $(BENCH_OUT)

# Charts again from the JSON in $(BENCH_OUT) (no measurement). For the
# tracked reference results: $(PY) bench/plot.py bench/results (PNGs in
# build/bench/reference/).
bench-plot:
	$(PY) bench/plot.py $(BENCH_OUT)

FORMATTED = find include src tools tests examples bench \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.c' \)

format:
	$(FORMATTED) | xargs clang-format -i

check-format:
	$(FORMATTED) | xargs clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD)
