# tests/gpu/deepspeed.mk — real DeepSpeed checkpointed through dsckpt.deepspeed on the GPU node
# (included by tests/gpu/gpu.mk).
#
#   make gpu-wheels     (here, needs PyPI) build/gpu/wheels/: the DeepSpeed wheel, built from its
#                       sdist without ops (DS_BUILD_OPS=0), and the pinned wheels of the runtime
#                       dependencies the GPU node lacks (cp312, manylinux x86_64); a few MB that
#                       travel with build/gpu.
#   make gpu-deepspeed  (on the GPU node, no network) installs those wheels into DS_SITE
#                       (/tmp/site) and runs tests/gpu/run-ds build/gpu with it on PYTHONPATH:
#                       ZeRO stages 1 and 3, saved through dsckpt (installed explicitly, and
#                       by configuration alone through `import dsckpt.deepspeed.auto`) and
#                       through DeepSpeed's torch.save, reloaded into a fresh engine, losses
#                       compared with an uninterrupted run. DS_ARGS go to ds_train.py (e.g.
#                       DS_ARGS="--stages 3 --dtype fp32", DS_ARGS="--engines torch,auto";
#                       DS_ARGS=--fixed-tag saves tag "last" twice, the second before the
#                       first is committed; --cpu runs it without a GPU).
#   make bench-ds-load  (on the GPU node) the same set-up running tests/gpu/bench_ds_load.py:
#                       engine.load_checkpoint through dsckpt beside DeepSpeed's own loader,
#                       ZeRO-1 and ZeRO-3, models built as usual and on the meta device
#                       (dsckpt.deepspeed.resume), time and loss equality; a table last.
#                       A 16 GiB cache holds the tag (hot). BENCH_DS_ARGS go to the script
#                       (e.g. "--repeat 5", "--d-model 2048", "--cpu").
#
# The GPU node already has torch, numpy, einops, msgpack, ninja, packaging, psutil, py-cpuinfo,
# tqdm and nvidia-ml-py. typing-extensions is pinned here too: pydantic 2.14 wants ≥ 4.16.

DS_VERSION := 0.19.8
DS_DEPS := hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 typing-extensions==4.16.0
DS_WHEELS := $(GPU_DIR)/wheels
DS_SITE ?= /tmp/site
DS_PYTHON ?= python3
DS_ARGS ?=
BENCH_DS_ARGS ?=
DS_PLATFORM := --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

.PHONY: gpu-wheels gpu-deepspeed bench-ds-load

gpu-wheels: $(DS_WHEELS)/WHEELS

# Rebuilt from scratch when the pins change; WHEELS lists what was fetched.
$(DS_WHEELS)/WHEELS: tests/gpu/deepspeed.mk
	rm -rf $(DS_WHEELS) && mkdir -p $(DS_WHEELS)
	DS_BUILD_OPS=0 $(DS_PYTHON) -m pip wheel -q --no-deps -w $(DS_WHEELS) deepspeed==$(DS_VERSION)
	$(DS_PYTHON) -m pip download -q --no-deps $(DS_PLATFORM) -d $(DS_WHEELS) $(DS_DEPS)
	@n=$$(ls $(DS_WHEELS)/*.whl | wc -l); [ "$$n" -eq 7 ] || \
		{ echo "gpu-wheels: expected 7 wheels, got $$n" >&2; exit 1; }
	@cd $(DS_WHEELS) && ls *.whl > WHEELS
	@du -sh $(DS_WHEELS) | awk '{print "gpu-wheels: " $$2 " is " $$1}'

gpu-deepspeed: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	@[ -f $(DS_WHEELS)/WHEELS ] || { echo "gpu-deepspeed: no $(DS_WHEELS); run make gpu-wheels" \
		"where PyPI is reachable" >&2; exit 1; }
	$(DS_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
		--target $(DS_SITE) $(DS_WHEELS)/*.whl
	PYTHONPATH=$(DS_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHON=$(DS_PYTHON) tests/gpu/run-ds $(GPU_DIR) \
		$(DS_ARGS)

bench-ds-load: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	@[ -f $(DS_WHEELS)/WHEELS ] || { echo "bench-ds-load: no $(DS_WHEELS); run make gpu-wheels" \
		"where PyPI is reachable" >&2; exit 1; }
	$(DS_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
		--target $(DS_SITE) $(DS_WHEELS)/*.whl
	PYTHONPATH=$(DS_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHON=$(DS_PYTHON) DS_CACHE_GIB=16 \
		DS_TIMEOUT=560 DS_SCRIPT=tests/gpu/bench_ds_load.py tests/gpu/run-ds $(GPU_DIR) \
		$(BENCH_DS_ARGS)
