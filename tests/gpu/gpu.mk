# tests/gpu/gpu.mk — the GPU bundle, GPU checks and GPU benchmark (included by the Makefile,
# after its source lists).
#
#   make gpu-bundle   (here: Debian, CUDA toolkit, no GPU needed) builds build/gpu/: dsckptd,
#                     dsckptctl, lib/libdsckpt.so.0, lib/_match.abi3.so (the Python package's
#                     C matcher, found beside DSCKPT_LIB=build/gpu/lib/libdsckpt.so.0: any
#                     CPython >= 3.11) and the GPU test programs, with libuv,
#                     msgpack-c and the CUDA runtime linked statically and libcjson.so.1 and
#                     libxxhash.so.0 (whose XXH3 picks AVX2/AVX-512 at run time) copied into
#                     build/gpu/lib (found through RUNPATH $ORIGIN/lib), so the folder
#                     runs on a GPU node that has none of the build dependencies (dsckptd
#                     takes libcurl.so.4 from the node: Debian's libcurl4, curl's library;
#                     UCX's libucp, libuct, libucs, libucm and libucs's libnuma travel in
#                     build/gpu/lib, with UCX's built-in transports: TCP, shared memory).
#   make gpu-check    (on the GPU node) tests/gpu/run-gpu-checks build/gpu (gpu-trainer: saves;
#                     gpu-restore: loads from the cache and, after a restart, from files)
#   make bench-gpu    (on the GPU node) tests/gpu/run-bench build/gpu
#   make bench-train  (on the GPU node) tests/gpu/run-train build/gpu
#   make bench-train-tiers (on the GPU node) tests/gpu/run-train-tiers build/gpu $(TIERS_ARGS):
#                     the training slowdown of a remote tier (file:// on the node's disk) and
#                     of peer copies to a second daemon (its own network namespace, a veth,
#                     UCX on TCP; build/gpu/tools/ip where the node has no iproute2) beside
#                     the baseline and the local-only dsckpt mode, one table (~5 minutes)
#   make bench-load   (on the GPU node) tests/gpu/run-bench-load build/gpu: loading onto a GPU
#   make bench-restore (on the GPU node) tests/gpu/run-bench-restore build/gpu $(RESTORE_ARGS):
#                     restores from the daemon's cache and from files beside the baselines,
#                     and a restarted bench-train to its first step (RESTORE_ARGS="--sizes 8
#                     --no-train" and RESTORE_ARGS="--sizes ''" fit one 10-minute call each;
#                     --sizes 20 in two: --no-copies, then --copies-only)
#
# gpu-check and bench-gpu compile nothing once build/gpu/BUNDLE exists. The objects are built
# by a recursive make with BUILD=build/gpu-obj (the Makefile's own compile rules and flags) and
# stay out of build/gpu, which is what travels.

GPU_DIR := build/gpu
GPU_OBJ := build/gpu-obj
GPU_ARCH := -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
GPU_NVCCFLAGS := -std=c++17 -O2 -g -lineinfo $(GPU_ARCH) -Iclient -Xcompiler -Wall,-Wextra,-Werror
# Static archives of the build dependencies (Debian names; libuv's static archive is libuv_a.a),
# looked up only when a bundle is linked.
GPU_STATIC = $(shell $(CC) -print-file-name=libuv_a.a) \
	$(shell $(CC) -print-file-name=libxxhash.a) $(shell $(CC) -print-file-name=libmsgpackc.a)
GPU_RPATH := -Wl,-rpath,'$$ORIGIN/lib' -Wl,--as-needed
GPU_SYSLIBS := -lpthread -ldl -lrt -lm
GPU_BINS := $(GPU_DIR)/dsckptd $(GPU_DIR)/dsckptctl $(GPU_DIR)/lib/libdsckpt.so.0 \
	$(GPU_DIR)/gpu-trainer $(GPU_DIR)/gpu-bench $(GPU_DIR)/gpu-restore

.PHONY: gpu-bundle gpu-bundle-files gpu-check bench-gpu bench-load bench-restore

gpu-bundle:
	@$(MAKE) --no-print-directory BUILD=$(GPU_OBJ) SAN= gpu-bundle-files

# Runs inside the recursive make (BUILD=$(GPU_OBJ)); checks what each binary needs at run time.
# dsckptd's libcurl (the remote tier) is the node's own: libcurl.so.4 and what it needs come
# from Debian's libcurl4, which the curl command needs too; the bundle does not carry them.
gpu-bundle-files: $(GPU_BINS) $(GPU_DIR)/lib/_match.abi3.so $(GPU_DIR)/tools/ip
	@curl_deps=" libcurl.so.4 $$(LD_LIBRARY_PATH= ldd $$($(CC) -print-file-name=libcurl.so.4) | \
		awk '{print $$1}' | tr '\n' ' ')"; \
	bad=0; for f in $(GPU_BINS); do \
		if readelf -d $$f | grep -q 'NEEDED.*libcuda\.so'; then echo "$$f needs libcuda.so" >&2; bad=1; fi; \
		for lib in $$(LD_LIBRARY_PATH= ldd $$f | awk '{print $$1}'); do \
			case "$$f $$curl_deps" in $(GPU_DIR)/dsckptd*" $$lib "*) continue ;; esac; \
			case "$$lib" in linux-vdso.so.*|libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|\
			librt.so.1|libgcc_s.so.1|libstdc++.so.6|/lib64/ld-linux-x86-64.so.2|\
			ld-linux-x86-64.so.2|libdsckpt.so.0|libcjson.so.1|libxxhash.so.0|\
			libucp.so.0|libuct.so.0|libucs.so.0|libucm.so.0|libnuma.so.1) ;; \
			*) echo "$$f needs $$lib, which the bundle does not carry" >&2; bad=1 ;; esac; \
		done; \
		if LD_LIBRARY_PATH= ldd $$f | grep -q 'not found'; then ldd $$f >&2; bad=1; fi; \
		if LD_LIBRARY_PATH= ldd $$f | grep -E 'lib(dsckpt|cjson|xxhash|uc[ptsm]|numa)\.so' | grep -vq '$(GPU_DIR)/lib/'; then \
			echo "$$f does not find the bundled libraries" >&2; bad=1; fi; \
	done; [ $$bad -eq 0 ]
	@{ echo "dsckpt GPU bundle"; echo "built: $$(date -u +%FT%TZ) on $$(hostname)"; \
		echo "commit: $$(git describe --always --dirty 2>/dev/null || echo unknown)"; \
		echo "nvcc: $$($(NVCC) --version | tail -n 1)"; } > $(GPU_DIR)/BUNDLE
	@du -sh $(GPU_DIR) | awk '{print "gpu-bundle: " $$2 " is " $$1 "; carry it with the tree (carry: [\"$(GPU_DIR)\"])"}'

$(GPU_DIR)/lib/_match.abi3.so: $(BUILD)/_match.abi3.so
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CP      $@" || true
	$(Q)cp $< $@

# libcJSON has no static archive on Debian: the shared library travels in the bundle.
$(GPU_DIR)/lib/libcjson.so.1:
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CP      $@" || true
	$(Q)cp -L "$$($(CC) -print-file-name=libcjson.so.1)" $@

# Debian's static libxxhash lacks the dispatching XXH3 (xxh_x86dispatch.h): the shared one
# travels, so that restores and flushes hash with the node's widest vectors.
$(GPU_DIR)/lib/libxxhash.so.0:
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CP      $@" || true
	$(Q)cp -L "$$($(CC) -print-file-name=libxxhash.so.0)" $@

# UCX (peer copies) travels as its four libraries and libucs's libnuma, each named by
# dsckptd itself (so that the libraries' own needs are met by those already loaded from
# $$ORIGIN/lib).
GPU_UCX := libucp.so.0 libuct.so.0 libucs.so.0 libucm.so.0 libnuma.so.1
$(addprefix $(GPU_DIR)/lib/,$(GPU_UCX)):
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  CP      $@" || true
	$(Q)cp -L "$$($(CC) -print-file-name=$(notdir $@))" $@

# ip(8) (iproute2) for tests/gpu/run-train-tiers, which puts a second daemon in a network
# namespace of its own behind a veth (the GPU node has no iproute2): the binary in
# build/gpu/tools, the libraries it needs but glibc's in build/gpu/tools/lib (the script runs
# it with LD_LIBRARY_PATH there; about 1.5 MB).
$(GPU_DIR)/tools/ip:
	@mkdir -p $(dir $@)lib
	@[ -n "$(Q)" ] && echo "  CP      $@" || true
	$(Q)ip=$$(command -v ip || echo /usr/sbin/ip); cp -L "$$ip" $@ && \
	for lib in $$(LD_LIBRARY_PATH= ldd "$$ip" | awk '$$3 ~ /^\// { print $$3 }'); do \
		case "$${lib##*/}" in libc.so.*|ld-linux*) ;; *) cp -L "$$lib" $(dir $@)lib/ ;; esac; \
	done

$(GPU_DIR)/dsckptd: $(call obj,$(DAEMON_SRC) $(DAEMON_CU) $(PROTO_SRC) $(FORMAT_SRC)) \
		$(GPU_DIR)/lib/libcjson.so.1 $(GPU_DIR)/lib/libxxhash.so.0 \
		$(addprefix $(GPU_DIR)/lib/,$(GPU_UCX))
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) -o $@ $(filter %.o,$^) $(GPU_RPATH) $(GPU_DIR)/lib/libcjson.so.1 \
		$(GPU_DIR)/lib/libxxhash.so.0 $(GPU_STATIC) \
		$(CUDA_LIBS) $(CURL_LIBS) $(CRYPTO_LIBS) -Wl,--no-as-needed \
		$(addprefix $(GPU_DIR)/lib/,$(GPU_UCX)) -Wl,--as-needed $(GPU_SYSLIBS)

$(GPU_DIR)/lib/libdsckpt.so.0: $(call pic,$(LIB_SRC) $(PROTO_SRC) $(FORMAT_LIB_SRC))
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) -shared -Wl,-soname,libdsckpt.so.0 -Wl,--exclude-libs,ALL -Wl,--no-undefined -o $@ \
		$^ -Wl,--as-needed $(GPU_STATIC) $(CUDA_LIBS) $(GPU_SYSLIBS)

$(GPU_DIR)/dsckptctl: $(call obj,$(CTL_SRC) $(FORMAT_CTL_SRC)) $(BUILD)/libdsckpt.a \
		$(GPU_DIR)/lib/libcjson.so.1 $(GPU_DIR)/lib/libxxhash.so.0
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) -o $@ $(call obj,$(CTL_SRC) $(FORMAT_CTL_SRC)) $(BUILD)/libdsckpt.a $(GPU_RPATH) \
		$(GPU_DIR)/lib/libcjson.so.1 $(GPU_DIR)/lib/libxxhash.so.0 $(GPU_STATIC) $(CUDA_LIBS) \
		$(GPU_SYSLIBS)

# The test programs: CUDA runtime static (nvcc's default), driver API through
# cudaGetDriverEntryPointByVersion (no -lcuda), libdsckpt and libcjson from the bundle.
$(GPU_DIR)/gpu-%: tests/gpu/gpu_%.cu tests/gpu/gpu_common.h client/dsckpt.h \
		$(GPU_DIR)/lib/libdsckpt.so.0 $(GPU_DIR)/lib/libcjson.so.1
	@[ -n "$(Q)" ] && echo "  NVCC    $<" || true
	$(Q)$(NVCC) $(GPU_NVCCFLAGS) -o $@ $< -L$(GPU_DIR)/lib -l:libdsckpt.so.0 -l:libcjson.so.1 \
		-Xlinker -rpath,'$$ORIGIN/lib' -Xlinker --as-needed -lrt -ldl

gpu-check: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-gpu-checks $(GPU_DIR)

bench-gpu: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-bench $(GPU_DIR)

# A PyTorch training loop checkpointed with nothing, dsckpt, DCP async_save through dsckpt.dcp,
# DCP async_save with its own DefaultStager and with its defaults, and torch.save
# (tests/gpu/bench_train.py; python3 with torch on the GPU node). TRAIN_ARGS go to the
# script, e.g. TRAIN_ARGS="--preset steady" or TRAIN_ARGS="--modes baseline,dsckpt-dcp".
.PHONY: bench-train
bench-train: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-train $(GPU_DIR) $(TRAIN_ARGS)

# Issues 33 and 35 on the GPU: bench_train.py --preset tiers (baseline, dsckpt, dsckpt-remote,
# dsckpt-peer) against two daemons (tests/gpu/run-train-tiers). TIERS_ARGS go to the script,
# e.g. TIERS_ARGS="--smoke" (the CPU, with BUNDLE=build) or "--iters 96".
.PHONY: bench-train-tiers
bench-train-tiers: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-train-tiers $(GPU_DIR) $(TIERS_ARGS)

include tests/gpu/node.mk
include tests/gpu/deepspeed.mk

bench-load: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-bench-load $(GPU_DIR) $(LOAD_GIB)

bench-restore: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-bench-restore $(GPU_DIR) $(RESTORE_ARGS)

# Time to resume (issue 34): a trainer SIGKILLed, fresh processes restoring its checkpoint
# hot, warm, cold and with prefetch, beside torch.load, DCP and the floor of any restart
# (tests/gpu/bench_resume.py). RESUME_ARGS go to the script, e.g. "--preset smoke" (the CPU)
# or "--repeat 3"; RESUME_SCRIPT=tests/gpu/probe_load.py runs the per-phase probe instead, and
# RESUME_LOG_LEVEL=debug prints the daemon's line per restore after it.
.PHONY: bench-resume
bench-resume: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-resume $(GPU_DIR) $(RESUME_ARGS)
