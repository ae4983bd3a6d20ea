# tests/gpu/node.mk — the whole-node benchmark (included by tests/gpu/gpu.mk).
#
#   make bench-node   (on the GPU node) tests/gpu/run-bench build/gpu --node: only the node
#                     section of bench-gpu. Each GPU's in-process D2H copy alone and all at
#                     once, then N rank processes saving at once through one daemon: per-rank,
#                     per-GPU and aggregate snapshot GB/s, time to the last SNAPSHOT, aggregate
#                     flush, and `dsckptctl pending` taken mid-save. BENCH_NODE_RANKS (default one
#                     per GPU; e.g. 4 on a 1-GPU machine), BENCH_NODE_GIB (per rank, 4),
#                     BENCH_NODE_GPUS, BENCH_NODE_REPS (2); see tests/gpu/run-bench.
#
# `make bench-gpu` runs the same section after the others when the machine has more than one
# GPU or BENCH_NODE_RANKS is set (BENCH_NODE=0 leaves it out, BENCH_NODE=1 forces it).

.PHONY: bench-node
bench-node: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-bench $(GPU_DIR) --node

# A data-parallel PyTorch training loop on the node's GPUs (one rank per GPU, one dsckptd for
# the node), checkpointed with nothing, dsckpt and DCP async_save (tests/gpu/bench_node.py).
# NODE_TRAIN_ARGS go to it, e.g. "--ranks 2" (ranks beyond the GPU count share GPUs over gloo).
.PHONY: bench-node-train
bench-node-train: $(if $(wildcard $(GPU_DIR)/BUNDLE),,gpu-bundle)
	tests/gpu/run-node-train $(GPU_DIR) $(NODE_TRAIN_ARGS)
