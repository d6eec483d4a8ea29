# nextn: the two commands a fresh machine needs are `make demo` and `make test`.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup build test demo bench clean

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

clean:
	rm -rf $(BUILD_DIR)
