# nextn: the two commands a fresh machine needs are `make demo` and `make test`.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup build test demo bench clean build-asan test-asan fuzz

setup:
	@bash scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)/bin/nextn

# Speed measurements (not tests): bandwidth, decode, verify cost and speculation on the bundled model and
# on a 2-layer-MTP fixture; kernel micro-benchmarks when built. Numbers go to docs/performance.md.
bench: build
	$(BUILD_DIR)/bin/nextn bench
	$(BUILD_DIR)/bin/nextn bench --model tests/fixtures/hy_v4/b_fp32 --tokens 128
	@if [ -x $(BUILD_DIR)/bin/nextn_bench_kernels ]; then $(BUILD_DIR)/bin/nextn_bench_kernels; fi

# Sanitizer build (clang): the whole suite under AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer,
# which abort at the first report, so the test fails. The same build holds the libFuzzer targets (fuzz/).
ASAN_BUILD_DIR ?= build-asan
ASAN_CXX ?= clang++-14
ASAN_CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=$(ASAN_CXX) \
	-DNEXTN_SANITIZE=address,undefined -DNEXTN_FUZZ=ON -DNEXTN_BUILD_BENCH=OFF
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ASAN_SYMBOLIZER_PATH=$(shell command -v llvm-symbolizer-14 || command -v llvm-symbolizer)
FUZZ_SECONDS ?= 60

$(ASAN_BUILD_DIR)/build.ninja:
	cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja $(ASAN_CMAKE_FLAGS)

build-asan: setup $(ASAN_BUILD_DIR)/build.ninja
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS) --target nextn_tests nextn_cli nextn_fuzzers

test-asan: build-asan
	cd $(ASAN_BUILD_DIR) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS)

# Each fuzzer for FUZZ_SECONDS, from seeds made of the committed fixtures (fuzz/run.sh; docs/testing.md).
fuzz: build-asan
	$(SANITIZER_ENV) bash fuzz/run.sh $(ASAN_BUILD_DIR) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR)
