# tests/peer.mk — peer copies (issue 35): what the peer suites link beside the harness.
# tests/netns.c makes the network namespaces and veth links the multi-node suites run their
# "nodes" in (root and ip(8) needed; they say SKIP without).

$(BUILD)/tests/check_peer_ucx $(BUILD)/tests/check_peer_replicate \
	$(BUILD)/tests/check_peer_restore: tests/netns.c tests/netns.h
$(BUILD)/tests/check_peer_level $(BUILD)/tests/check_peer_discover \
	$(BUILD)/tests/check_peer_hostile $(BUILD)/tests/check_peer_cap: tests/netns.c tests/netns.h

# make bench-peer: replication and fetch throughput over a veth link beside ucx_perftest's
# tag_bw on the same link (tests/bench_peer.c); PEER_BENCH_ARGS="SIZE_MIB RUNS" (512 3).
.PHONY: bench-peer
$(BUILD)/tests/bench_peer: tests/bench_peer.c tests/netns.c tests/netns.h \
		$(BUILD)/libtest-harness.a $(BUILD)/libdsckptd-core.a $(BUILD)/libdsckpt.a
	@mkdir -p $(dir $@)
	@[ -n "$(Q)" ] && echo "  LD      $@" || true
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ tests/bench_peer.c tests/netns.c \
		$(BUILD)/libtest-harness.a $(BUILD)/libdsckptd-core.a $(BUILD)/libdsckpt.a \
		$(LDSAN) $(UV_LIBS) $(CJSON_LIBS) $(XXHASH_LIBS) $(CURL_LIBS) $(UCX_LIBS) \
		$(CRYPTO_LIBS) $(LIBS_COMMON) $(CUDA_LIBS) $(CHECK_LIBS)
bench-peer: $(BUILD)/tests/bench_peer
	$(BUILD)/tests/bench_peer $(PEER_BENCH_ARGS)
