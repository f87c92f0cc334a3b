# qlm build. `make` builds build/qlm; `make test` sets up what is missing and runs every test (the
# kernel-dependent ones again under each other kernel set the CPU runs, scripts/run_isa_tests.sh);
# `make asan` runs the suite under AddressSanitizer + UndefinedBehaviorSanitizer; `make fuzz` runs
# libFuzzer on every loader (FUZZ_SECONDS each, scripts/fuzz.sh);
# `make CUDA=1` also compiles the CUDA backend with nvcc; `make run` runs the main job.

# GCC unless CC names another compiler (make's own default is cc, whatever that is here): the
# compiler docs/benchmarks.md measures; `make build-clang` checks clang's build.
ifeq ($(origin CC),default)
CC      := gcc
endif
NVCC    ?= nvcc
BUILD   ?= build
# The builds inside the commands below (make test, make run ...) compile a file per core unless make
# was given -j itself; they run after setup.sh, which installs what they compile against. The
# top-level make stays serial by default (`make clean all` must not race); `make -j` as usual.
JOBS    ?= $(shell nproc 2>/dev/null || echo 1)
SUBMAKE  = $(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS))
# GCC's -O2 vectorizes only loops whose trip count the vector width divides; the "cheap" model
# also takes loops with a scalar tail (elementwise ops, softmax passes): pp512 +3%, same results
# (reductions stay in order without -ffast-math). Clang has no such option. No compiler may
# contract a product and a sum into an FMA (clang would by default): the kernels' rounding is
# what the tests' references take.
CLANG   := $(findstring clang,$(shell $(CC) --version 2>/dev/null))
OPT     ?= -O2 $(if $(CLANG),,-fvect-cost-model=cheap)
CFLAGS  += -std=c11 $(OPT) -ffp-contract=off -g -Wall -Wextra -D_GNU_SOURCE -fopenmp -I. $(shell pkg-config --cflags libpcre2-8 libcjson ompi-c 2>/dev/null)
LDLIBS  += -lcjson -lpcre2-8 -lopenblas -lcurl -lmicrohttpd -lcrypto -ledit $(shell pkg-config --libs ompi-c 2>/dev/null || echo -lmpi) -lm -lpthread -fopenmp
TEST_LDLIBS = -lcmocka

LIB_SRCS  := $(wildcard core/*.c quant/*.c tokenizer/*.c cpu/*.c models/*.c runtime/*.c loaders/*.c lora/*.c eval/*.c server/*.c hub/*.c train/*.c dist/*.c)
CLI_SRCS  := $(wildcard cli/*.c)
TEST_SRCS := $(wildcard tests/test_*.c)
BENCH_SRCS := $(wildcard bench/*.c)

ifeq ($(CUDA),1)
CUDA_SRCS := $(wildcard cuda/*.cu)
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
CFLAGS    += -DQLM_WITH_CUDA
LDLIBS    += -L/usr/local/cuda/lib64 -lcudart -lcublas -lcublasLt -lnccl -lstdc++
NVCCFLAGS ?= -O2 -std=c++20 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -I. -Xcompiler -Wall,-Wextra
else
CUDA_SRCS := cuda/backend_absent.c
CUDA_OBJS := $(BUILD)/cuda/backend_absent.o
endif

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o) $(CUDA_OBJS)
CLI_OBJS  := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
LIB       := $(BUILD)/libqlm.a

.PHONY: all install test asan fuzz build-clang run bench bench-dist eval train-eval qat-eval int4-eval w8a8-eval clean setup setup-test check-tests test-cuda test-cuda-build test-cuda-emu

all: $(BUILD)/qlm

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The chat page's HTML is assembled into its object (.incbin), which -MMD does not see.
$(BUILD)/server/chat_page.o: server/chat_page.html

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/qlm: $(CLI_OBJS) $(LIB)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJS) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS) $(TEST_LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# `make install` (PREFIX=/usr/local, DESTDIR for packaging): the binary and its bash completion.
PREFIX ?= /usr/local
install: $(BUILD)/qlm
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 755 $(BUILD)/qlm $(DESTDIR)$(PREFIX)/bin/qlm
	install -m 644 scripts/qlm-completion.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/qlm

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

check-tests: $(BUILD)/qlm $(TEST_BINS)
	@scripts/check_layers.sh
	@if scripts/check_layers.sh -q --extra core/error.c:../models/model.h >/dev/null; then \
		echo "check_layers: a reversed arrow (core -> models) was not refused"; exit 1; fi
	@QLM_BIN=$(abspath $(BUILD)/qlm) scripts/run_tests.sh $(TEST_BINS)
	@scripts/run_isa_tests.sh $(BUILD)

test: setup-test
	@$(SUBMAKE) check-tests

asan: setup-test
	@$(SUBMAKE) BUILD=build/asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
		check-tests

# The fuzzer links libFuzzer's main; the library under it is built by clang with its coverage hooks.
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
# But for the CPU's matrix kernels: clang 14 takes over 20 minutes a file to put ASan and UBSan's
# checks into their unrolled intrinsics (gcc: 40 s), and the fuzzer feeds the loaders, not them
# (`make asan` runs the kernels under both sanitizers, through the tests).
build/fuzz/quant/matmul_%.o: CFLAGS += -fno-sanitize=all

$(BUILD)/fuzz/%: fuzz/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(LIB) $(LDLIBS)

fuzz:
	@scripts/setup.sh --fuzz
	@$(SUBMAKE) CC=clang BUILD=build/fuzz \
		OPT="-O1 -fno-omit-frame-pointer $(FUZZ_SAN) -fsanitize=fuzzer-no-link" build/fuzz/fuzz/fuzz_loaders
	@scripts/fuzz.sh build/fuzz/fuzz/fuzz_loaders

# A second compiler: qlm, its tests and the CPU benchmarks built by clang (CI's check that the
# code is not GCC's C alone; `make CC=clang BUILD=build/clang test` runs the tests).
CPU_BENCHES := $(filter-out bench/bench_cuda,$(BENCH_SRCS:%.c=%))

build-clang:
	@scripts/setup.sh --fuzz
	@$(SUBMAKE) CC=clang BUILD=build/clang build/clang/qlm $(TEST_SRCS:tests/%.c=build/clang/tests/%) \
		$(CPU_BENCHES:%=build/clang/%)

# The GPU's tests: the op table against references, and the model tests rerun with
# QLM_TEST_DEVICE=cuda (their fixtures and tolerances unchanged), then compute-sanitizer.
CUDA_TESTS := tests/cuda/test_backend_ops tests/cuda/test_attention_backward tests/cuda/test_train_ops tests/cuda/test_fake_quant_cuda tests/cuda/test_comm_nccl tests/test_llama tests/test_t5 tests/test_batch tests/test_lora tests/test_smollm2 tests/test_train tests/test_train_t5 tests/test_train_cli

test-cuda-build:
	@$(SUBMAKE) CUDA=1 BUILD=build/cuda build/cuda/qlm build/cuda/bench/bench_cuda $(CUDA_TESTS:%=build/cuda/%)

# The CUDA backend on the host emulation (tools/cuda_emu; no GPU): op tests that take the queue, its
# graphs, the index ring and the pool through their paths, and qlm with --device cuda: greedy decoding
# gives the CPU's tokens, three LoRA training steps its losses and gradient norms.
CUDA_EMU_TESTS := test_matmul_group test_matmul_special_weight test_step_matmul_group_kv test_ring_between_arrays test_attention test_lora \
	test_out_of_memory test_matmul_backward_x_huge_dy test_cross_entropy test_sum_squares test_adamw test_store_weight test_attention_backward test_fake_quant_nan
test-cuda-emu:
	@$(SUBMAKE) all
	@QLM_EMU_ASAN=0 tools/cuda_emu/check.sh $(CUDA_EMU_TESTS)

test-cuda: setup-test
	@$(SUBMAKE) test-cuda-build
	@scripts/run_cuda_tests.sh build/cuda $(CUDA_TESTS); rc=$$?; scripts/memcheck_cuda.sh build/cuda && exit $$rc

run: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/run_main_job.sh $(BUILD)/qlm

bench: setup
	@$(SUBMAKE) $(BUILD)/qlm $(BUILD)/bench/bench_lora $(BUILD)/bench/bench_serve $(BUILD)/bench/weights_diff
	@scripts/bench.sh $(BUILD)/qlm
	@if [ "$${QLM_BENCH_DIST:-1}" != 0 ]; then scripts/bench_dist.sh $(BUILD)/qlm; fi

bench-dist: setup
	@$(SUBMAKE) $(BUILD)/qlm $(BUILD)/bench/weights_diff
	@scripts/bench_dist.sh $(BUILD)/qlm

eval: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/eval_dialogsum.sh $(BUILD)/qlm

train-eval: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/train_dialogsum.sh $(BUILD)/qlm

qat-eval: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/qat_eval.sh $(BUILD)/qlm

int4-eval: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/int4_eval.sh $(BUILD)/qlm

w8a8-eval: setup
	@$(SUBMAKE) $(BUILD)/qlm
	@scripts/w8a8_eval.sh $(BUILD)/qlm

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
