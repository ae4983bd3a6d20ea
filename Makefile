# dsckpt — build, test and demo.
#
#   make            build/dsckptd, build/dsckptctl, build/libdsckpt.so, build/libdsckpt.a,
#                   build/_match.abi3.so (the Python package's optional C matcher)
#   make deps       install the Debian packages we build on (apt-get; sudo when not root)
#   make check      unit + integration tests, the man pages against the code (check-docs), the
#                   daemon's file-level call graph (check-layers), an
#                   install into build/destdir (check-install), the same tests under
#                   ASan/UBSan, the threaded parts under TSan (make check-tsan), the Python
#                   binding's tests (check-python; check-python-modern: DCP and Lightning on a
#                   pinned PyPI torch), pip install into fresh venvs and a save and a load
#                   through them (check-pip), and 20 s of each libFuzzer target (make check-fuzz)
#   make demo       start the daemon on conf/dsckptd.json in build/demo and run an example job
#   make install    PREFIX=/usr/local DESTDIR= (binaries, library, header, dsckpt.pc, man
#                   pages, units, config in SYSCONFDIR), then systemd/finish-install: as root
#                   on a systemd host, PREFIX /usr or /usr/local, it runs systemd-sysusers,
#                   systemd-tmpfiles, ldconfig and systemctl daemon-reload; otherwise it
#                   prints those commands for the target machine
#
# Packagers' variables are honoured: CC, CFLAGS, CPPFLAGS, LDFLAGS, AR, PREFIX, DESTDIR,
# LIBDIR, INCLUDEDIR, MANDIR, SYSCONFDIR (/etc for PREFIX /usr or /usr/local, else
# $(PREFIX)/etc).
# Warnings are errors only where asked: WERROR=1, which the check targets (and so CI) set.
#   make gpu-bundle build/gpu/ to carry to a GPU node; there: make gpu-check, make bench-gpu
#   make fuzz       libFuzzer on the frame decoder and the config loader (FUZZ_SECONDS=60)
#
# Python: the binding's tests use Debian's /usr/bin/python3 (tests/python/python.mk says why).
# The tests that need a modern PyTorch (DCP, DTensor) use PyPI's, pinned, in build/venv-torch
# (make check-python-modern; tests/python/modern.mk says why and how).

PREFIX ?= /usr/local
DESTDIR ?=
LIBDIR ?= $(PREFIX)/lib
# /etc for the system's prefixes, where dsckptd looks without -c; a PREFIX of its own keeps its
# configuration inside it (the unit's -c names it).
SYSCONFDIR ?= $(if $(filter /usr /usr/local,$(PREFIX)),/etc,$(PREFIX)/etc)
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
BUILD ?= build
CC ?= gcc
CUDA_HOME ?= /usr/local/cuda
SAN ?=
V ?= 0
CPPFLAGS ?=
LDFLAGS ?=
# -Werror for our own checks (make check and its parts, .ci/run), never by default: a
# packager's newer compiler may warn where ours does not.
WERROR ?= $(if $(filter check%,$(MAKECMDGOALS)),1,0)
WERROR_FLAG := $(if $(filter 1,$(WERROR)),-Werror)
# Quiet by default; V=1 shows every command.
ifeq ($(V),0)
Q := @
endif

DEBIAN_PKGS := build-essential pkg-config libuv1-dev libmsgpack-dev libcjson-dev \
	libxxhash-dev check clang-14 libclang-rt-14-dev groff-base man-db python3 python3-dev \
	ninja-build strace libcurl4-openssl-dev libucx-dev ucx-utils libssl-dev

CFLAGS_BASE := -MMD -MP -std=gnu11 -g -O2 -Wall -Wextra $(WERROR_FLAG) -Wshadow -Wno-unused-parameter \
	-Wstrict-prototypes -Wmissing-prototypes -D_GNU_SOURCE -fvisibility=hidden
ifneq ($(SAN),)
CFLAGS_BASE += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDSAN := -fsanitize=$(SAN)
endif
CFLAGS ?=
override CFLAGS := $(CFLAGS_BASE) $(CPPFLAGS) $(CFLAGS)
# The one version number, in the public header; the daemon gets it from here.
VERSION := $(shell sed -n 's/^\#define DSCKPT_VERSION_STRING "\(.*\)"/\1/p' client/dsckpt.h)
VERSION_DEF := -DDSCKPTD_VERSION='"$(VERSION)"'

# Dependencies' flags come from pkg-config (make deps installs it); the -l spelled after each
# is used only where a .pc file is missing, as on a fresh machine, where make reads this file
# before make deps has run (those are right for Debian; CHECK_LIBS, used only by the tests'
# link, is read when it runs). msgpack-c's .pc is msgpack-c from version 6 on, msgpack before
# (Debian 12).
PKG_CONFIG ?= pkg-config
pc_cflags = $(strip $(shell $(PKG_CONFIG) --cflags $(1) 2>/dev/null))
pc_libs = $(or $(strip $(shell $(PKG_CONFIG) --libs $(1) 2>/dev/null)),$(2))
MSGPACK_PC := $(firstword $(foreach p,msgpack-c msgpack,\
	$(shell $(PKG_CONFIG) --exists $(p) 2>/dev/null && echo $(p))) msgpack)
UV_LIBS := $(call pc_libs,libuv,-luv)
MSGPACK_LIBS := $(call pc_libs,$(MSGPACK_PC),-lmsgpackc)
CJSON_LIBS := $(call pc_libs,libcjson,-lcjson)
XXHASH_LIBS := $(call pc_libs,libxxhash,-lxxhash)
CURL_LIBS := $(call pc_libs,libcurl,-lcurl)
# Peer copies: UCX's ucp (libucx-dev) between daemons, HMAC-SHA256 from OpenSSL's libcrypto.
UCX_LIBS := $(call pc_libs,ucx,-lucp -luct -lucs -lucm)
CRYPTO_LIBS := $(call pc_libs,libcrypto,-lcrypto)
CHECK_LIBS = $(call pc_libs,check,-lcheck)
DEPS_CFLAGS := $(call pc_cflags,libuv $(MSGPACK_PC) libcjson libxxhash)
override CFLAGS += $(DEPS_CFLAGS)
LIBS_COMMON := $(MSGPACK_LIBS) -lpthread

# The CUDA runtime is linked statically where the toolkit exists; never -lcuda. The daemon's
# one kernel file (XXH3 on the device, daemon/cuda_xxh3.cu) is compiled by nvcc for Ampere and
# Hopper, with Hopper's PTX for later GPUs (a GPU it cannot run on checksums on the host).
NVCC ?= $(CUDA_HOME)/bin/nvcc
ifneq ($(wildcard $(CUDA_HOME)/lib64/libcudart_static.a),)
ifneq ($(wildcard $(NVCC)),)
CUDA_CFLAGS := -DHAVE_CUDA -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
DAEMON_CU := daemon/cuda_xxh3.cu
endif
endif
CU_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
comma := ,
CU_FLAGS := -std=c++17 -O2 -g $(CU_ARCH) $(DEPS_CFLAGS) \
	-Xcompiler -Wall,-Wextra$(if $(WERROR_FLAG),$(comma)-Werror),-fno-exceptions,-fno-rtti \
	-Xcompiler -fno-threadsafe-statics

PROTO_SRC := $(wildcard proto/*.c)
FORMAT_SRC := $(wildcard format/*.c)
# The part of format/ that libdsckpt links: it links msgpack only, neither cJSON nor xxhash
# (which the header and manifest code use); dsckptctl links the rest itself.
FORMAT_LIB_SRC := format/errors.c format/dtype.c
FORMAT_CTL_SRC := $(filter-out $(FORMAT_LIB_SRC),$(FORMAT_SRC))
DAEMON_SRC := $(wildcard daemon/*.c)
LIB_SRC := $(wildcard client/lib/*.c)
CTL_SRC := $(wildcard client/ctl/*.c)

obj = $(patsubst %.cu,$(BUILD)/obj/%.o,$(patsubst %.c,$(BUILD)/obj/%.o,$(1)))
pic = $(patsubst %.c,$(BUILD)/pic/%.o,$(1))
# Daemon objects other than main.o, linked into unit tests too.
DAEMON_LIBOBJ := $(call obj,$(filter-out daemon/main.c,$(DAEMON_SRC)) $(DAEMON_CU) $(PROTO_SRC) \
	$(FORMAT_SRC))

BINS := $(BUILD)/dsckptd $(BUILD)/dsckptctl $(BUILD)/libdsckpt.so $(BUILD)/libdsckpt.a \
	$(BUILD)/dsckpt-example-trainer $(BUILD)/dsckpt.pc
# The installed library: libdsckpt.so.$(VERSION), and the soname's libdsckpt.so.0 and the
# linker's libdsckpt.so as links to it. Bump SOMAJOR (and _lib.py's name) on an ABI break.
SOMAJOR := 0
MANPAGES := $(wildcard man/*.[1-8])
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/check_*.c))

.PHONY: all deps check check-plain check-san check-fuzz demo install clean fuzz bench-remote FORCE
all: $(BINS) $(BUILD)/_match.abi3.so

deps:
	@need=""; for p in $(DEBIAN_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || need="$$need $$p"; \
	done; \
	if [ -n "$$need" ]; then \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing:$$need"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$need; \
	fi

$(BUILD)/obj/daemon/%.o: daemon/%.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC      $<" || true
	$(Q)$(CC) $(CFLAGS) $(CUDA_CFLAGS) $(VERSION_DEF) -c $< -o $@
$(BUILD)/obj/daemon/%.o: daemon/%.cu daemon/%.h
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  NVCC    $<" || true
	$(Q)$(NVCC) $(CU_FLAGS) $(foreach f,$(CPPFLAGS),-Xcompiler $(f)) -c $< -o $@
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC      $<" || true
	$(Q)$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC      $< (pic)" || true
	$(Q)$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(BUILD)/dsckptd: $(call obj,$(DAEMON_SRC) $(DAEMON_CU) $(PROTO_SRC) $(FORMAT_SRC))
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(LDSAN) $(LDFLAGS) -o $@ $^ $(UV_LIBS) $(CJSON_LIBS) $(XXHASH_LIBS) \
		$(CURL_LIBS) $(UCX_LIBS) $(CRYPTO_LIBS) $(LIBS_COMMON) $(CUDA_LIBS)

$(BUILD)/libdsckpt.so: $(call pic,$(LIB_SRC) $(PROTO_SRC) $(FORMAT_LIB_SRC))
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(LDSAN) $(LDFLAGS) -shared -Wl,-soname,libdsckpt.so.$(SOMAJOR) -o $@ $^ \
		$(LIBS_COMMON)

# pkg-config's entry for the installed library, made at every make and replaced only when it
# changed (PREFIX, LIBDIR or INCLUDEDIR given, a new version); directories under PREFIX are
# written from ${prefix}, so that pkg-config --define-prefix can move the tree.
pc_dir = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
$(BUILD)/dsckpt.pc: client/dsckpt.pc.in client/dsckpt.h FORCE
	@mkdir -p $(dir $@)
	$(Q)sed -e 's#@PREFIX@#$(PREFIX)#' -e 's#@LIBDIR@#$(call pc_dir,$(LIBDIR))#' \
		-e 's#@INCLUDEDIR@#$(call pc_dir,$(INCLUDEDIR))#' -e 's#@VERSION@#$(VERSION)#' \
		-e 's#@LIBS_PRIVATE@#$(LIBS_COMMON) -ldl#' $< > $@.tmp
	$(Q)if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

$(BUILD)/libdsckpt.a: $(call obj,$(LIB_SRC) $(PROTO_SRC) $(FORMAT_LIB_SRC))
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(BUILD)/dsckptctl: $(call obj,$(CTL_SRC) $(FORMAT_CTL_SRC)) $(BUILD)/libdsckpt.a
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(LDSAN) $(LDFLAGS) -o $@ $(call obj,$(CTL_SRC) $(FORMAT_CTL_SRC)) \
		$(BUILD)/libdsckpt.a \
		$(CJSON_LIBS) $(XXHASH_LIBS) $(LIBS_COMMON) -lm

$(BUILD)/dsckpt-example-trainer: $(call obj,client/examples/trainer.c) $(BUILD)/libdsckpt.a
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(LDSAN) $(LDFLAGS) -o $@ $< $(BUILD)/libdsckpt.a $(LIBS_COMMON)

# dsckpt._match, the optional C Shape.match and pointer proof of the Python package
# (client/python/dsckpt/_match.c; _freeze.c, which encodes leaves without pickle and tells
# those that encode as last time; _match_ptrs.cc, which catches torch's C++ exceptions),
# against the limited API of Debian's Python 3.11 (python3-dev): one abi3 module serves 3.11
# and later. It links only libstdc++ (the interpreter provides Python's symbols) and is built
# without sanitizers, for an uninstrumented python3 to load. The package finds it beside the
# library DSCKPT_LIB names, or in build/ (client/python/dsckpt/_lib.py); the GPU bundle
# carries it too.
PYTHON_INCLUDE ?= $(shell /usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("include"))' 2>/dev/null)
PYEXT_CFLAGS := $(filter-out -MMD -MP -D_GNU_SOURCE -fsanitize=% -fno-sanitize-recover=%,$(CFLAGS_BASE)) \
	-fPIC -isystem $(PYTHON_INCLUDE) $(CPPFLAGS)
PYEXT_CXXFLAGS := -std=c++17 -g -O2 -Wall -Wextra $(WERROR_FLAG) -fvisibility=hidden -fPIC \
	$(CPPFLAGS)
$(BUILD)/_match.abi3.so: client/python/dsckpt/_match.c client/python/dsckpt/_freeze.c \
		client/python/dsckpt/_freeze.h client/python/dsckpt/_match_ptrs.cc
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CC      $< (python)" || true
	$(Q)$(CC) $(PYEXT_CFLAGS) -c -o $(BUILD)/_match.o $<
	$(Q)$(CC) $(PYEXT_CFLAGS) -c -o $(BUILD)/_freeze.o client/python/dsckpt/_freeze.c
	$(Q)$(CXX) $(PYEXT_CXXFLAGS) -c -o $(BUILD)/_match_ptrs.o client/python/dsckpt/_match_ptrs.cc
	$(Q)$(CXX) $(LDFLAGS) -shared -o $@ $(BUILD)/_match.o $(BUILD)/_freeze.o \
		$(BUILD)/_match_ptrs.o

# The daemon's modules as an archive, so a unit test pulls in only the ones it uses.
$(BUILD)/libdsckptd-core.a: $(DAEMON_LIBOBJ)
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)rm -f $@ && $(AR) rcs $@ $^

# What the suites share (tests/harness*.c), as an archive: a suite links the helpers it uses.
$(BUILD)/libtest-harness.a: $(call obj,$(wildcard tests/harness*.c))
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)rm -f $@ && $(AR) rcs $@ $^

# Unit tests link the daemon's modules; integration tests use the binaries and the library.
# A test links the shared helpers (the harness archive) and every other .c it depends on:
# the client suites' fake daemon, the ctl suites' dsckptctl runner (named below).
$(BUILD)/tests/check_%: tests/check_%.c $(wildcard tests/harness*.h) $(BUILD)/libtest-harness.a \
		$(BUILD)/libdsckptd-core.a $(BUILD)/libdsckpt.a
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(CFLAGS) $(CUDA_CFLAGS) $(VERSION_DEF) $(LDFLAGS) -o $@ $(filter %.c,$^) \
		$(BUILD)/libtest-harness.a $(BUILD)/libdsckptd-core.a $(BUILD)/libdsckpt.a \
		$(LDSAN) $(UV_LIBS) $(CJSON_LIBS) $(XXHASH_LIBS) $(CURL_LIBS) $(UCX_LIBS) \
		$(CRYPTO_LIBS) $(LIBS_COMMON) $(CUDA_LIBS) $(CHECK_LIBS)

$(BUILD)/tests/check_lib_save $(BUILD)/tests/check_lib_fail \
		$(BUILD)/tests/check_lib_load $(BUILD)/tests/check_lib_batch: tests/fake_peer.c \
		tests/fake_peer.h
$(BUILD)/tests/check_ctl $(BUILD)/tests/check_ctl_verify: tests/ctl_run.c tests/ctl_run.h
$(BUILD)/tests/check_remote_s3 $(BUILD)/tests/check_remote_s3_faults \
		$(BUILD)/tests/check_remote_restore $(BUILD)/tests/check_upload \
		$(BUILD)/tests/check_upload_retain $(BUILD)/tests/check_remote_overwrite \
		$(BUILD)/tests/check_remote_orphans: tests/moto.c tests/moto.h
# check_nodes_ops preloads tests/metaops.c into its daemons: it counts their metadata operations.
$(BUILD)/tests/libmetaops.so: tests/metaops.c tests/metaops.h
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(CFLAGS) -fvisibility=default -fPIC -shared -o $@ tests/metaops.c -ldl
$(BUILD)/tests/check_nodes_ops: | $(BUILD)/tests/libmetaops.so
# The engine suites that hold a flush thread at a chosen write: tests/engine_hooks.c interposes
# pwrite for the whole binary, so it is linked into these alone, never into the harness archive.
$(BUILD)/tests/check_engine_cancel $(BUILD)/tests/check_engine_fail: tests/engine_hooks.c
# The overwrite crash suite stops a commit before its n-th change to the tree: tests/swap_hooks.c
# interposes renameat, unlinkat, fsync and their kind, so it is linked into that suite alone.
$(BUILD)/tests/check_overwrite_crash: tests/swap_hooks.c tests/swap_hooks.h

# libFuzzer targets for the frame decoder and the config loader (clang-14 from make deps).
# tests/run-fuzz runs each for FUZZ_SECONDS, growing a corpus in build/fuzz/corpus-<name>
# from tests/fuzz_seeds/<name>, and prints one line per target; a crash fails the target.
FUZZ_CC := clang-14
FUZZ_CFLAGS := -g -O1 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
FUZZERS := $(BUILD)/fuzz/proto $(BUILD)/fuzz/config

$(BUILD)/fuzz/proto: tests/fuzz_proto.c $(PROTO_SRC) proto/proto.h | deps
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  FUZZ    $@" || true
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz_proto.c $(PROTO_SRC) $(MSGPACK_LIBS)
$(BUILD)/fuzz/config: tests/fuzz_config.c daemon/config.c daemon/config_load.c daemon/log.c \
		daemon/config_remote.c daemon/config_peer.c format/userfile.c \
		format/errors.c daemon/config.h daemon/dsckptd.h | deps
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  FUZZ    $@" || true
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz_config.c daemon/config.c \
		daemon/config_load.c daemon/config_remote.c daemon/config_peer.c format/userfile.c \
		daemon/log.c format/errors.c $(DEPS_CFLAGS) $(CJSON_LIBS) -lpthread

fuzz: FUZZ_SECONDS ?= 60
fuzz: $(FUZZERS)
	@BUILD=$(BUILD) tests/run-fuzz $(FUZZ_SECONDS) $(FUZZERS)

# Upload throughput to moto on 127.0.0.1 beside a boto3 baseline, and the daemon's CPU per
# GB (tests/bench-remote); not part of make check.
bench-remote: all moto
	@BUILD=$(BUILD) tests/bench-remote $(BENCH_REMOTE_ARGS)

# The bounded run that make check includes.
check-fuzz: FUZZ_SECONDS ?= 20
check-fuzz: $(FUZZERS)
	@BUILD=$(BUILD) tests/run-fuzz $(FUZZ_SECONDS) $(FUZZERS)

# make check's builds compile on every core (its targets still run one after another).
NPROC := $(shell nproc 2>/dev/null || echo 1)

# Runs every check_* binary against the binaries of this build; prints Check's summaries.
check-plain: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all $(TESTS)
	@BUILD=$(BUILD) tests/run-checks $(TESTS)

check-san:
	$(MAKE) BUILD=build/san SAN=address,undefined check-plain

# ThreadSanitizer over the threaded modules' suites and the integration suites, whose
# harness starts the TSan-built dsckptd of this build (tests/tsan.supp: what, and why).
TSAN_CHECKS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/check_engine*.c \
	tests/check_cache*.c tests/check_source.c tests/check_daemon*.c tests/check_fair.c \
	tests/check_store_latest.c tests/check_seal.c tests/check_single.c tests/check_resident.c \
	tests/check_load.c tests/check_notify.c tests/check_metrics.c tests/check_plan.c \
	tests/check_restore_digest.c tests/check_hostile_recover.c tests/check_workq.c \
	tests/check_query.c tests/check_overwrite.c tests/check_lib_stage.c tests/check_lock.c \
	tests/check_waiter.c tests/check_commit.c tests/check_remote*.c tests/check_quota.c \
	tests/check_peer_ucx.c tests/check_peer_store.c tests/check_peer_replicate.c \
	tests/check_upload.c tests/check_peer_restore.c tests/check_upload_retain.c \
	tests/check_peer_level.c tests/check_peer_discover.c tests/check_peer_hostile.c \
	tests/check_peer_cap.c tests/check_rate_cap.c tests/check_peer_nodes.c))
# The multi-node suites: 64 TSan-built daemons on one root (the metadata shim preloaded too).
TSAN_CHECKS += $(BUILD)/tests/check_nodes $(BUILD)/tests/check_nodes_ops
.PHONY: check-tsan check-tsan-run
check-tsan:
	$(MAKE) BUILD=build/tsan SAN=thread check-tsan-run
# UCX's memory hooks (libucm, set up when it loads) crash beside TSan's interceptors: off for
# the peer suites and their daemons (TCP needs none).
check-tsan-run: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all $(TSAN_CHECKS)
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 \
		second_deadlock_stack=1 $(TSAN_OPTIONS)" BUILD=$(BUILD) \
		UCX_MEM_MALLOC_HOOKS=n UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=n \
		tests/run-checks $(TSAN_CHECKS)

# The man pages and the package version against the code (tests/check-docs says what).
.PHONY: check-docs check-install
check-docs:
	@tests/check-docs

# The daemon's files call one way: no cycle among them, nothing below the request layer
# calling up into it or including its header (tests/check-layers says what, from the objects'
# symbols; tests/layers.allow lists known edges that work in progress removes).
.PHONY: check-layers
check-layers: $(call obj,$(DAEMON_SRC))
	@tests/check-layers $(BUILD)/obj/daemon tests/layers.allow

# make install into $(BUILD)/destdir, then what its users rely on: the library's links,
# dsckpt.pc through pkg-config, a program built with its flags, the man pages, the units
# (systemd-analyze verify, where systemd is installed) and the set-up commands it printed.
INSTALL_ROOT := $(abspath $(BUILD)/destdir)
check-install: deps all
	@rm -rf $(INSTALL_ROOT)
	$(Q)$(MAKE) --no-print-directory install DESTDIR=$(INSTALL_ROOT) \
		>$(BUILD)/install.log 2>&1 || { cat $(BUILD)/install.log; exit 1; }
	@BUILD=$(BUILD) MAKE="$(MAKE)" tests/check-install $(INSTALL_ROOT) $(PREFIX) $(LIBDIR) \
		$(MANDIR) $(VERSION) \
		$(BUILD)/install.log

check: check-plain check-docs check-layers check-install check-san check-tsan check-python \
	check-pip check-python-modern check-fuzz

demo: deps all
	tests/demo.sh $(BUILD)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(LIBDIR) \
		$(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(SYSCONFDIR)/dsckptd \
		$(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/lib/tmpfiles.d \
		$(DESTDIR)$(PREFIX)/lib/systemd/user \
		$(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	install -m 0755 $(BUILD)/dsckptd $(DESTDIR)$(PREFIX)/sbin/dsckptd
	install -m 0755 $(BUILD)/dsckptctl $(DESTDIR)$(PREFIX)/bin/dsckptctl
	install -m 0755 $(BUILD)/libdsckpt.so $(DESTDIR)$(LIBDIR)/libdsckpt.so.$(VERSION)
	ln -sf libdsckpt.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libdsckpt.so.$(SOMAJOR)
	ln -sf libdsckpt.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libdsckpt.so
	install -m 0644 $(BUILD)/libdsckpt.a $(DESTDIR)$(LIBDIR)/libdsckpt.a
	install -m 0644 $(BUILD)/dsckpt.pc $(DESTDIR)$(LIBDIR)/pkgconfig/dsckpt.pc
	install -m 0644 client/dsckpt.h $(DESTDIR)$(INCLUDEDIR)/dsckpt.h
	for m in $(MANPAGES); do \
		install -m 0644 $$m $(DESTDIR)$(MANDIR)/man$${m##*.}/; \
	done
	test -e $(DESTDIR)$(SYSCONFDIR)/dsckptd/dsckptd.json || \
		sed 's#"socket": *"[^"]*"#"socket": "/run/dsckptd/dsckptd.sock"#' conf/dsckptd.json \
		> $(DESTDIR)$(SYSCONFDIR)/dsckptd/dsckptd.json
	sed -e 's#@SBINDIR@#$(PREFIX)/sbin#g' -e 's#@SYSCONFDIR@#$(SYSCONFDIR)#g' \
		systemd/dsckptd.service \
		> $(DESTDIR)$(PREFIX)/lib/systemd/system/dsckptd.service
	install -m 0644 systemd/dsckptd.socket $(DESTDIR)$(PREFIX)/lib/systemd/system/
	sed 's#@SBINDIR@#$(PREFIX)/sbin#g' systemd/dsckptd-user.service \
		> $(DESTDIR)$(PREFIX)/lib/systemd/user/dsckptd.service
	install -m 0644 systemd/dsckptd.tmpfiles $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/dsckptd.conf
	install -m 0644 systemd/dsckptd.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/dsckptd.conf
	@systemd/finish-install "$(PREFIX)" "$(DESTDIR)"

clean:
	rm -rf build

include tests/gpu/gpu.mk
include tests/python/python.mk
include tests/python/modern.mk
include tests/remote.mk
include tests/peer.mk

# Restores from a root's remote tier through the daemon beside boto3, curl and cp moving the
# same bytes, in one run: a table, not a test (tests/bench_remote_restore.py; moto's venv).
.PHONY: bench-remote-restore
bench-remote-restore: all $(MOTO_VENV)/.ready
	@BUILD=$(BUILD) $(MOTO_VENV)/bin/python tests/bench_remote_restore.py $(BENCH_REMOTE_RESTORE_ARGS)

-include $(shell find $(BUILD)/obj $(BUILD)/pic -name '*.d' 2>/dev/null)
