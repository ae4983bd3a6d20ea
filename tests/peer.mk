# tests/peer.mk — peer copies (issue 35): what the peer suites link beside the harness.
# tests/netns.c makes the network namespaces and veth links the multi-node suites run their
# "nodes" in (root and ip(8) needed; they say SKIP without).

$(BUILD)/tests/check_peer_ucx $(BUILD)/tests/check_peer_replicate: tests/netns.c tests/netns.h
