# dhp — build, test, sanitizer build. See README.md.
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
override CFLAGS += -std=c11 $(OPT) -g -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
           -I. -I$(BUILD)/gen $(MPI_CFLAGS) -MMD -MP
LDLIBS  += -lglpk -lcjson -lcurl -lopenblas $(MPI_LIBS) -lm -lpthread

# CUDA backend: built when nvcc is found (PATH or /usr/local/cuda); CUDA=0 leaves it out.
# The kernels (executor/*.cu) go through nvcc; the C files that call the CUDA
# runtime, cuBLAS and NCCL (their headers are C) through $(CC) with DHP_CUDA=1.
NVCC      ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA      ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_80 (A100), sm_90 (H100/H200) and PTX for newer GPUs to JIT.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
# NCCL (executor/comm_nccl.c, dhp run --comm nccl): with CUDA, where nccl.h is
# found (the CUDA toolkit, /usr/local/cuda, /usr); NCCL=0 leaves it out and
# `--comm nccl` then says so.
NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr/local/cuda /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
NCCL      ?= $(if $(and $(filter 1,$(CUDA)),$(NCCL_HOME)),1,0)
ifeq ($(CUDA),1)
CUDA_LIBDIRS := $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib)
override CFLAGS += -DDHP_CUDA=1 -isystem $(CUDA_HOME)/include
ifeq ($(NCCL),1)
NCCL_LIBDIRS := $(filter-out $(CUDA_LIBDIRS),$(wildcard $(NCCL_HOME)/lib64 $(NCCL_HOME)/lib $(NCCL_HOME)/lib/x86_64-linux-gnu))
override CFLAGS += -DDHP_NCCL=1 $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-isystem $(NCCL_HOME)/include)
LDLIBS  += $(foreach d,$(NCCL_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) -lnccl
endif
# cuBLASLt is not linked: the CUDA backend opens it on first use (executor/cuda_lt_api.cuh says why).
LDLIBS  += $(foreach d,$(CUDA_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) -lcudart -ldl -lstdc++
CU_SRC  := $(wildcard executor/*.cu)
else
CU_SRC  :=
endif
NVCCFLAGS ?= -O2 -g
override NVCCFLAGS += -std=c++17 $(CUDA_ARCH) -I. -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -MMD -MP

MODULES := util models costdb planner executor profile
LIB_SRC := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))
CLI_SRC := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
DATA    := $(sort $(wildcard models/zoo/*.json) $(wildcard costdb/gpus/*.json) $(wildcard costdb/clusters/*.json)) \
           cli/report.html

LIB_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC)) \
            $(BUILD)/obj/gen/embedded.o
CLI_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLI_SRC))
# The tests also run the CUDA kernels' source on the CPU (tests/cudaemu.h), with or without nvcc.
TEST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_SRC)) $(BUILD)/obj/tests/cuda_kernels_emu.o

.PHONY: all deps test test-asan sanitize bench clean fuzz fuzz-build fuzz-bins gpu-bundle
all: dhp

# dhp in the repository root is the release build; other BUILD dirs keep their own copy.
ifeq ($(BUILD),build)
DHP_BIN := dhp
else
DHP_BIN := $(BUILD)/dhp
endif
ifneq ($(DHP_BIN),dhp)
dhp: $(DHP_BIN)
endif

$(DHP_BIN): $(LIB_OBJ) $(CLI_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

# The emulator build, for a machine without a GPU: dhp-emu is dhp with the
# CUDA backend's source (executor/cuda_kernels.cu) compiled for the CPU
# against tests/cudaemu.h, with its device-pointer guard, and
# executor/comm_nccl.c against tests/ncclemu.h (NCCL and the CUDA runtime's
# streams and events emulated over MPI), in place of the real CUDA backend
# and NCCL communicator: `dhp-emu run --backend cuda --comm nccl` drives a
# whole run through both code paths (tests/t_backend.sh, t_comm_nccl.sh);
# comm_check_emu is the communicator check on the same objects (t_comm.sh).
# EMU_OBJS: the emulated objects; EMU_REPLACES: the real ones they stand in for.
EMU_REPLACES := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC)) $(BUILD)/obj/executor/cuda_none.o \
                $(BUILD)/obj/executor/comm_nccl.o $(BUILD)/obj/profile/device_facts.o
EMU_OBJS     := $(BUILD)/obj/tests/cuda_kernels_emu_dhp.o $(BUILD)/obj/emu/executor/comm_nccl.o \
                $(BUILD)/obj/emu/profile/device_facts.o
EMU_LIB_OBJ  := $(filter-out $(EMU_REPLACES),$(LIB_OBJ)) $(EMU_OBJS)

$(BUILD)/dhp-emu: $(EMU_LIB_OBJ) $(CLI_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) -lstdc++

$(BUILD)/comm_check_emu: $(BUILD)/obj/tests/mpi/comm_check.o $(EMU_LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) -lstdc++

$(BUILD)/obj/emu/executor/comm_nccl.o: executor/comm_nccl.c tests/ncclemu.h tests/ncclemu_init.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -UDHP_NCCL -DDHP_NCCL=1 -DDHP_NCCL_EMU -include tests/ncclemu.h -c -o $@ $<

# dhp profile's device queries answered by the emulated runtime (tests/ncclemu.h).
$(BUILD)/obj/emu/profile/device_facts.o: profile/device_facts.c tests/ncclemu.h tests/ncclemu_init.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -UDHP_CUDA -DDHP_PROFILE_EMU -include tests/ncclemu.h -c -o $@ $<

$(BUILD)/test_dhp: $(LIB_OBJ) $(TEST_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) -lstdc++

# Standalone MPI check of the communicator, run by tests/t_comm.sh under mpirun.
$(BUILD)/comm_check: $(BUILD)/obj/tests/mpi/comm_check.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

# Attention kernels' thread scaling (bench/run.sh).
$(BUILD)/attn_threads: $(BUILD)/obj/bench/attn_threads.o $(LIB_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# The CUDA kernels compiled as C++ for the CPU: tests/cudaemu.h runs each
# launch's blocks one after another, a thread per CUDA thread, with
# __syncthreads as a barrier, and stands in for cuBLAS with OpenBLAS.
CXX ?= g++
$(BUILD)/obj/tests/cuda_kernels_emu.o: executor/cuda_kernels.cu tests/cudaemu.h tests/cudaemu_lt.h tests/cudaemu_wmma.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 $(OPT) -g -Wall -Wextra -Werror $(CXXFLAGS) -DEX_CUDA_EMU -I. -MMD -MP -include tests/cudaemu.h \
	  -x c++ -c -o $@ $<

$(BUILD)/obj/tests/cuda_kernels_emu_dhp.o: executor/cuda_kernels.cu tests/cudaemu.h tests/cudaemu_lt.h tests/cudaemu_wmma.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 $(OPT) -g -Wall -Wextra -Werror $(CXXFLAGS) -DEX_CUDA_EMU -DEX_CUDA_EMU_AS_CUDA -DCUDAEMU_GUARD \
	  -I. -MMD -MP -include tests/cudaemu.h -x c++ -c -o $@ $<

# The guard's own check (tests/t_backend.sh).
$(BUILD)/emu_guard_check: tests/emu/guard_check.cpp tests/cudaemu.h tests/cudaemu_lt.h tests/cudaemu_wmma.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 $(OPT) -g -Wall -Wextra -Werror $(CXXFLAGS) -DCUDAEMU_GUARD -I. -include tests/cudaemu.h \
	  -o $@ $< $(LDFLAGS) -lopenblas

# The CPU kernels' loops vectorize only at -O3 (GCC 12's -O2 cost model skips loops with
# a run-time trip count); -fno-math-errno lets sqrtf vectorize. Neither reorders any
# floating-point operation (no -ffast-math), so results are unchanged.
$(BUILD)/obj/executor/cpu_kernels.o $(BUILD)/obj/executor/cpu_attention.o: override CFLAGS += -O3 -fno-math-errno
# The profile's STREAM loops are built like the kernels they stand for.
$(BUILD)/obj/profile/cpu.o: override CFLAGS += -O3 -fno-math-errno

$(BUILD)/tools/embed: tools/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -Wall -Wextra -Werror -o $@ $<

$(BUILD)/gen/embedded.c: $(BUILD)/tools/embed $(DATA)
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed $@ $(DATA)

$(BUILD)/obj/gen/embedded.o: $(BUILD)/gen/embedded.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

deps:
	bash scripts/deps.sh
	bash scripts/venv.sh

# Fuzz targets (tests/fuzz/fuzz_*.c): libFuzzer, so clang, with ASan and UBSan,
# in their own build directory. `make fuzz` runs each for FUZZ_SECONDS on a
# corpus kept in build-fuzz/corpus; `make test` runs each for a short smoke run
# (3 s each: the regression inputs, then the seeds' neighbourhood; CI's time budget).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 3

fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) CUDA=0 OPT=-O1 LDFLAGS= CXXFLAGS= \
	  CFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" fuzz-bins

fuzz-bins: $(addprefix $(BUILD)/fuzz/,$(FUZZ_TARGETS))
# (kept: as intermediates of the pattern rule make would delete and rebuild them every time)
.PRECIOUS: $(BUILD)/obj/tests/fuzz/%.o

$(BUILD)/fuzz/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDFLAGS) $(LDLIBS)

fuzz: $(DHP_BIN) fuzz-build
	DHP=$(abspath $(DHP_BIN)) FUZZ_BIN=$(abspath $(FUZZ_BUILD)/fuzz) bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(abspath $(FUZZ_BUILD))

# The test command (README, CI): unit tests, CLI and integration scripts.
test: $(DHP_BIN) $(BUILD)/dhp-emu $(BUILD)/emu_guard_check $(BUILD)/test_dhp $(BUILD)/comm_check $(BUILD)/comm_check_emu fuzz-build
	DHP_SANITIZED=$(SANITIZED) DHP=$(abspath $(DHP_BIN)) DHP_EMU=$(abspath $(BUILD)/dhp-emu) EMU_GUARD_CHECK=$(abspath $(BUILD)/emu_guard_check) TEST_BIN=$(abspath $(BUILD)/test_dhp) \
	  COMM_CHECK=$(abspath $(BUILD)/comm_check) COMM_CHECK_EMU=$(abspath $(BUILD)/comm_check_emu) \
	  FUZZ_BIN=$(abspath $(FUZZ_BUILD)/fuzz) FUZZ_SMOKE_SECONDS=$(FUZZ_SMOKE_SECONDS) bash tests/run.sh

# Same tests built with AddressSanitizer and UndefinedBehaviorSanitizer.
# The fuzz targets are the same sanitized binaries in both runs (build-fuzz):
# make test gives each FUZZ_SMOKE_SECONDS, test-asan 2 s more (and the regressions again).
test-asan sanitize:
	$(MAKE) BUILD=build-asan OPT=-O1 FUZZ_SMOKE_SECONDS=2 \
	  CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  CXXFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" SANITIZED=1 test

bench: $(DHP_BIN) $(BUILD)/attn_threads
	bash bench/run.sh

# dhp and what it loads, for bench/gpu_check.sh on a GPU machine that has only
# the driver and CUDA (scripts/gpu_bundle.sh; LLMC=an llm.c checkout adds llm.c's trainer)
gpu-bundle:
	bash scripts/gpu_bundle.sh $(BUILD)/gpu-bundle

clean:
	rm -rf build build-asan build-fuzz dhp

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
