/*
 * metrics.c — node-wide counters and latency histograms since the daemon started, read by
 * METRICS (dsckptctl metrics, status --json). They are sums over every client and name no
 * path, job or user, so any client may read them (DESIGN.md §8).
 *
 * Counters are bumped where things happen: the copy and flush threads (bytes copied,
 * written), the restore threads (bytes restored), the loop thread (save levels through
 * save_observe, refusals, loads) and recovery at start-up. Every counter is a relaxed atomic
 * add: they order nothing, and a reader may see one counter a piece ahead of another. The
 * histograms are observed on the loop thread (metrics_save.c, upload.c's REMOTE) and on the
 * threads that pull from a remote tier (pull.c), each bucket a relaxed atomic too: a reader
 * may see a bucket counted before the sum. This module calls nothing of the daemon's: every
 * layer may call it (the engine's unit tests link it alone).
 */
#include "dsckptd.h"

/* Bucket bounds of every histogram, in microseconds: 1 ms to 10 min. */
static const uint64_t le_us[METRIC_BUCKETS] = {
	1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 30000000, 60000000, 120000000, 300000000,
	600000000,
};

/* The error codes a reason may be, in ERR_TABLE order (a reason's slot is its index). */
static const int codes[METRIC_CODES] = {
#define CODE_XX_(name, value, msg) ERR_##name,
	ERR_TABLE(CODE_XX_)
#undef CODE_XX_
};

/* Wire keys of the counters (enum metric order). */
static const char *const counter_keys[METRIC_N] = {
	"saves_started", "saves_snapshotted", "saves_durable", "saves_committed",
	"copied_bytes", "flushed_bytes", "loads_started", "loads_done", "restored_bytes",
	"uploaded_bytes", "uploads_done", "retention_held", "pulled_bytes",
};

/* Wire keys of the counters by reason (enum metric_reasoned order). */
static const char *const reasoned_keys[METRIC_REASONED_N] = {
	"saves_failed", "saves_refused", "loads_failed", "uploads_failed", "pulls_failed",
};

/* Wire keys of the recovery actions (enum metric_recovery order). */
static const char *const recovery_keys[RECOVERY_N] = {
	"partial_removed", "file_removed", "commit_finished", "seal_resumed", "file_left",
};

/* Wire keys of the histograms (enum metric_hist order). */
static const char *const hist_keys[METRIC_HIST_N] = {
	"snapshot_seconds", "flush_seconds", "commit_seconds", "upload_seconds", "pull_seconds",
};

/* Every counter and histogram since start. */
static struct {
	uint64_t counter[METRIC_N];                          /* atomic */
	uint64_t reasoned[METRIC_REASONED_N][METRIC_CODES];  /* atomic */
	uint64_t recovery[RECOVERY_N];                       /* atomic */
	struct metrics_hist hist[METRIC_HIST_N];             /* atomic (pulls: any thread) */
} metrics;

/* Adds n to counter m (any thread). */
void metrics_add(enum metric m, uint64_t n)
{
	__atomic_add_fetch(&metrics.counter[m], n, __ATOMIC_RELAXED);
}

/* Counts one of m with reason code (a negative ERR_E*; one outside the table is EFAILED). */
void metrics_fail(enum metric_reasoned m, int code)
{
	unsigned slot = 0;

	while (slot < METRIC_CODES && codes[slot] != code)
		slot++;
	if (slot == METRIC_CODES) {	/* not a code of the table: a failure without one */
		metrics_fail(m, ERR_EFAILED);
		return;
	}
	__atomic_add_fetch(&metrics.reasoned[m][slot], 1, __ATOMIC_RELAXED);
}

/* Counts n recovery actions of kind a. */
void metrics_recovered(enum metric_recovery a, uint64_t n)
{
	__atomic_add_fetch(&metrics.recovery[a], n, __ATOMIC_RELAXED);
}

/* Puts one observation of seconds into histogram h (any thread). */
void metrics_observe(enum metric_hist h, double seconds)
{
	uint64_t us = seconds > 0 ? (uint64_t)(seconds * 1e6) : 0;
	unsigned i = 0;

	while (i < METRIC_BUCKETS && us > le_us[i])
		i++;
	__atomic_add_fetch(&metrics.hist[h].bucket[i], 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&metrics.hist[h].sum_us, us, __ATOMIC_RELAXED);
}

/* Fills v with every counter and histogram as of now (loop thread). */
void metrics_view(struct metrics_view *v)
{
	for (unsigned i = 0; i < METRIC_N; i++)
		v->counter[i] = __atomic_load_n(&metrics.counter[i], __ATOMIC_RELAXED);
	for (unsigned m = 0; m < METRIC_REASONED_N; m++) {
		v->nreasons[m] = 0;
		for (unsigned i = 0; i < METRIC_CODES; i++) {
			uint64_t n = __atomic_load_n(&metrics.reasoned[m][i], __ATOMIC_RELAXED);
			if (n > 0)
				v->reasons[m][v->nreasons[m]++] = (struct metrics_reason){codes[i], n};
		}
	}
	for (unsigned i = 0; i < RECOVERY_N; i++)
		v->recovery[i] = __atomic_load_n(&metrics.recovery[i], __ATOMIC_RELAXED);
	for (unsigned i = 0; i < METRIC_BUCKETS; i++)
		v->le_us[i] = le_us[i];
	for (unsigned i = 0; i < METRIC_HIST_N; i++) {
		for (unsigned b = 0; b <= METRIC_BUCKETS; b++)
			v->hist[i].bucket[b] = __atomic_load_n(&metrics.hist[i].bucket[b],
							       __ATOMIC_RELAXED);
		v->hist[i].sum_us = __atomic_load_n(&metrics.hist[i].sum_us, __ATOMIC_RELAXED);
	}
}

/* The wire keys of counter m, reasoned counter m, recovery action a and histogram h. */
const char *metrics_counter_key(enum metric m) { return counter_keys[m]; }
const char *metrics_reasoned_key(enum metric_reasoned m) { return reasoned_keys[m]; }
const char *metrics_recovery_key(enum metric_recovery a) { return recovery_keys[a]; }
const char *metrics_hist_key(enum metric_hist h) { return hist_keys[h]; }

/* Peer copies' block (issue 35): its own counters and histogram, all relaxed atomics (the
 * sender, service and restore threads set them). */
static const char *const peer_keys[METRIC_PEER_N] = {
	"peer_bytes_sent", "peer_bytes_received", "peer_copies_sent", "peer_copies_received",
	"peer_restored_bytes", "peer_copies_held", "peer_replica_memory_bytes", "peer_evictions",
};
static struct {
	uint64_t v[METRIC_PEER_N];
	struct metrics_hist replication;
} peer_metrics;

/* Adds n to peer counter m (any thread). */
void metrics_peer_add(enum metric_peer m, uint64_t n)
{
	__atomic_add_fetch(&peer_metrics.v[m], n, __ATOMIC_RELAXED);
}

/* Sets peer value m to n (any thread). */
void metrics_peer_set(enum metric_peer m, uint64_t n)
{
	__atomic_store_n(&peer_metrics.v[m], n, __ATOMIC_RELAXED);
}

/* Puts one replication of seconds into the peer histogram (any thread). */
void metrics_peer_replicated(double seconds)
{
	uint64_t us = seconds > 0 ? (uint64_t)(seconds * 1e6) : 0;
	unsigned i = 0;

	while (i < METRIC_BUCKETS && us > le_us[i])
		i++;
	__atomic_add_fetch(&peer_metrics.replication.bucket[i], 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&peer_metrics.replication.sum_us, us, __ATOMIC_RELAXED);
}

/* Fills v with the peer block as of now (any thread). */
void metrics_peer_view(struct metrics_peer_view *v)
{
	for (unsigned i = 0; i < METRIC_PEER_N; i++)
		v->v[i] = __atomic_load_n(&peer_metrics.v[i], __ATOMIC_RELAXED);
	for (unsigned i = 0; i <= METRIC_BUCKETS; i++)
		v->replication.bucket[i] = __atomic_load_n(&peer_metrics.replication.bucket[i],
							   __ATOMIC_RELAXED);
	v->replication.sum_us = __atomic_load_n(&peer_metrics.replication.sum_us,
						__ATOMIC_RELAXED);
}

/* The wire key of peer value m. */
const char *metrics_peer_key(enum metric_peer m) { return peer_keys[m]; }
