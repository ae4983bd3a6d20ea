/*
 * metrics.c — the metrics command and the counters of status --json: the daemon's METRICS
 * reply decoded, then printed in Prometheus' text exposition format (for node_exporter's
 * textfile collector) or as JSON. The daemon sends numbers under its wire keys
 * (proto/PROTOCOL.md); every metric name, type and help text lives in the tables here.
 * Every key is optional: a daemon older than this dsckptctl, or one built or configured
 * without a feature, sends fewer, and a metric it did not send is left out of both outputs
 * (never shown as 0); keys this dsckptctl does not know are passed over. A key that is there
 * but malformed fails the whole reply.
 */
#include "ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/internal.h"

#define MAX_LE 64        /* histogram bounds one reply may carry */
#define MAX_REASONS 64   /* reasons of one counter */
#define REASON_MAX 32    /* longest reason name */

/* A number of the reply and how it is exposed. */
struct scalar_def {
	const char *key;   /* wire key */
	const char *name;  /* metric name */
	const char *type;  /* "counter" or "gauge" */
	int ms;            /* the wire has milliseconds; the metric is in seconds */
	const char *help;
};

static const struct scalar_def scalars[] = {
	{"start_time_ms", "dsckpt_start_time_seconds", "gauge", 1,
	 "When the daemon started, in seconds since the Unix epoch."},
	{"uptime_ms", "dsckpt_uptime_seconds", "gauge", 1,
	 "Seconds since the daemon started."},
	{"saves_started", "dsckpt_saves_started_total", "counter", 0,
	 "Saves accepted: SAVE_END handed them to the copy engine."},
	{"saves_snapshotted", "dsckpt_saves_snapshotted_total", "counter", 0,
	 "Saves that reached SNAPSHOT: every byte in the daemon's host cache."},
	{"saves_durable", "dsckpt_saves_durable_total", "counter", 0,
	 "Saves that reached DURABLE: written, fsynced and renamed into place."},
	{"saves_committed", "dsckpt_saves_committed_total", "counter", 0,
	 "Saves whose checkpoint directory was committed (MANIFEST.json, latest)."},
	{"copied_bytes", "dsckpt_copied_bytes_total", "counter", 0,
	 "Bytes copied from trainers' tensors into the host cache."},
	{"flushed_bytes", "dsckpt_flushed_bytes_total", "counter", 0,
	 "Bytes of tensor data written from the host cache into checkpoint files."},
	{"loads_started", "dsckpt_loads_started_total", "counter", 0,
	 "Loads (restores) accepted: LOAD_END started filling the destinations."},
	{"loads_done", "dsckpt_loads_done_total", "counter", 0,
	 "Loads that put every byte in place, checked."},
	{"restored_bytes", "dsckpt_restored_bytes_total", "counter", 0,
	 "Bytes put in place in loads' destinations."},
	{"uploaded_bytes", "dsckpt_uploaded_bytes_total", "counter", 0,
	 "Bytes of checkpoint files uploaded to remote tiers."},
	{"uploads_done", "dsckpt_uploads_done_total", "counter", 0,
	 "Tags that reached REMOTE: files, manifest and latest in the root's remote tier."},
	{"retention_held", "dsckpt_retention_held_total", "counter", 0,
	 "Times keep_last kept a tag because it was not yet in its root's remote tier."},
	{"pulled_bytes", "dsckpt_pulled_bytes_total", "counter", 0,
	 "Bytes of files read from remote tiers into the local tier, checked."},
	{"upload_backlog_tags", "dsckpt_upload_backlog_tags", "gauge", 0,
	 "Tags of this node not yet REMOTE (uploading, waiting or failing)."},
	{"upload_backlog_bytes", "dsckpt_upload_backlog_bytes", "gauge", 0,
	 "Bytes of this node's files still to upload to remote tiers."},
	{"saves_in_flight", "dsckpt_saves_in_flight", "gauge", 0,
	 "Saves accepted and not yet DURABLE or FAILED."},
	{"loads_in_flight", "dsckpt_loads_in_flight", "gauge", 0,
	 "Loads begun and not yet finished."},
	{"clients", "dsckpt_clients", "gauge", 0,
	 "Connected clients (trainers and dsckptctl), not counting this query."},
	{"cache_total", "dsckpt_cache_size_bytes", "gauge", 0,
	 "Size of the pinned host cache."},
	{"cache_used", "dsckpt_cache_used_bytes", "gauge", 0,
	 "Bytes of the host cache in use (saves in flight and resident files)."},
	{"cache_resident", "dsckpt_cache_resident_bytes", "gauge", 0,
	 "Bytes of the host cache holding files just saved, kept for fast restores."},
	/* Peer copies (issue 35). */
	{"peer_bytes_sent", "dsckpt_peer_sent_bytes_total", "counter", 0,
	 "Bytes of this node's committed files that peers kept as copies."},
	{"peer_bytes_received", "dsckpt_peer_received_bytes_total", "counter", 0,
	 "Bytes of other nodes' copies kept here, checked."},
	{"peer_copies_sent", "dsckpt_peer_copies_sent_total", "counter", 0,
	 "Copies of this node's committed files that peers kept."},
	{"peer_copies_received", "dsckpt_peer_copies_received_total", "counter", 0,
	 "Other nodes' copies kept here (and taken back from replica_root at start)."},
	{"peer_restored_bytes", "dsckpt_peer_restored_bytes_total", "counter", 0,
	 "Bytes of tags this node lacked, written into its local tier from peers' copies."},
	{"peer_copies_held", "dsckpt_peer_copies_held", "gauge", 0,
	 "Other nodes' copies the daemon holds (memory and replica_root)."},
	{"peer_replica_memory_bytes", "dsckpt_peer_replica_memory_bytes", "gauge", 0,
	 "Bytes of replica_cache_size other nodes' copies take."},
	{"peer_evictions", "dsckpt_peer_evictions_total", "counter", 0,
	 "Other nodes' copies dropped to make room for newer ones."},
};
#define NSCALARS (sizeof(scalars) / sizeof(scalars[0]))

/* A counter by reason and how it is exposed. */
struct reasoned_def {
	const char *key, *name, *help;
};

static const struct reasoned_def reasoned[] = {
	{"saves_failed", "dsckpt_saves_failed_total",
	 "Accepted saves that FAILED, by reason (a DSCKPT_E* name without DSCKPT_)."},
	{"saves_refused", "dsckpt_saves_refused_total",
	 "SAVE_BEGIN, SAVE_ADD or SAVE_END refused, by reason: the save never started."},
	{"loads_failed", "dsckpt_loads_failed_total",
	 "Accepted loads that failed, by reason (a DSCKPT_E* name without DSCKPT_)."},
	{"uploads_failed", "dsckpt_uploads_failed_total",
	 "Failed steps of uploads to remote tiers, by reason; each is tried again."},
	{"pulls_failed", "dsckpt_pulls_failed_total",
	 "Pulls of a tag from a remote tier that failed, by reason (nothing of it kept)."},
};
#define NREASONED (sizeof(reasoned) / sizeof(reasoned[0]))

/* The actions of start-up recovery, the wire's keys and the label's values. */
static const char *const actions[] = {
	"partial_removed", "file_removed", "commit_finished", "seal_resumed", "file_left",
};
#define NACTIONS (sizeof(actions) / sizeof(actions[0]))

/* A latency histogram and how it is exposed. */
struct hist_def {
	const char *key, *name, *help;
};

static const struct hist_def hists[] = {
	{"snapshot_seconds", "dsckpt_save_snapshot_seconds",
	 "Seconds from a save's ACCEPTED to SNAPSHOT (every byte in the host cache)."},
	{"flush_seconds", "dsckpt_save_flush_seconds",
	 "Seconds from a save's ACCEPTED to DURABLE (written, fsynced, renamed)."},
	{"commit_seconds", "dsckpt_save_commit_seconds",
	 "Seconds from a save's ACCEPTED to COMMITTED (every rank's files, the manifest)."},
	{"upload_seconds", "dsckpt_upload_seconds",
	 "Seconds from a tag's COMMITTED (or the daemon's start) to REMOTE."},
	{"pull_seconds", "dsckpt_pull_seconds",
	 "Seconds a pull of a tag from a remote tier took (its files, checked, and manifest)."},
	{"peer_replication_seconds", "dsckpt_peer_replication_seconds",
	 "Seconds from a save's COMMITTED to a peer keeping its copy (peer copies)."},
};
#define NHISTS (sizeof(hists) / sizeof(hists[0]))

/* A reason and its count. */
struct reason {
	char name[REASON_MAX + 1];
	uint64_t n;
};

/* One METRICS reply, decoded; the has_* flags say which keys it held. */
struct ctl_metrics {
	char version[PROTO_MAX_NAME + 1];
	uint64_t scalar[NSCALARS];
	struct reason reasons[NREASONED][MAX_REASONS];
	size_t nreasons[NREASONED];
	uint64_t recovery[NACTIONS];
	uint64_t le_us[MAX_LE];
	size_t nle;
	struct {
		uint64_t bucket[MAX_LE + 1];  /* per bucket; the last above every bound */
		uint64_t sum_us;
	} hist[NHISTS];
	int has_version, has_recovery;
	uint8_t has_scalar[NSCALARS], has_reasons[NREASONED], has_action[NACTIONS];
	uint8_t has_hist[NHISTS];
};

/* Whether s is a reason name: 1-REASON_MAX of [A-Z0-9_] (safe in a label as it is). */
static int reason_ok(const char *s)
{
	size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
	return n > 0 && s[n] == '\0';
}

/* Reads the counter by reason i: [{reason: s, count: u}…], each reason once. */
static void reasons_decode(struct proto_map *pm, struct ctl_metrics *m, size_t i)
{
	const msgpack_object_array *a = NULL;

	if (proto_get_array(pm, reasoned[i].key, &a, MAX_REASONS, 0) <= 0)
		return;
	m->has_reasons[i] = 1;
	for (uint32_t k = 0; k < a->size && !pm->err; k++) {
		struct reason *r = &m->reasons[i][k];
		struct proto_map sub;
		proto_map_init(&sub, &a->ptr[k]);
		proto_get_str(&sub, "reason", r->name, REASON_MAX, 1);
		proto_get_u64(&sub, "count", UINT64_MAX, &r->n, 1);
		if (proto_map_end(&sub) < 0)
			proto_map_fail(pm, "%s[%u]: %s", reasoned[i].key, k, sub.why);
		else if (!reason_ok(r->name))
			proto_map_fail(pm, "%s[%u]: reason '%s' is not a code name",
				       reasoned[i].key, k, r->name);
		for (uint32_t j = 0; j < k && !pm->err; j++)
			if (strcmp(m->reasons[i][j].name, r->name) == 0)
				proto_map_fail(pm, "%s: reason %s twice", reasoned[i].key, r->name);
	}
	m->nreasons[i] = pm->err ? 0 : a->size;
}

/* Reads an array of unsigned integers of exactly n elements (n 0: 1 to max) into out, the
 * key required or not; the number read (0 also when it is absent). */
static size_t uints_decode(struct proto_map *pm, const char *key, const char *what,
			   uint64_t *out, size_t n, size_t max, int required)
{
	const msgpack_object_array *a = NULL;

	if (proto_get_array(pm, key, &a, max, required) <= 0)
		return 0;
	if (n ? a->size != n : a->size == 0) {
		proto_map_fail(pm, "%s has a wrong number of entries (%u)", what, a->size);
		return 0;
	}
	for (uint32_t i = 0; i < a->size && !pm->err; i++) {
		if (a->ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			proto_map_fail(pm, "%s entries must be unsigned integers", what);
		else
			out[i] = a->ptr[i].via.u64;
	}
	return pm->err ? 0 : a->size;
}

/* Reads the bounds (le_us: increasing) and the histograms there ({buckets, sum_us}, keys
 * added later passed over). */
static void hists_decode(struct proto_map *pm, struct ctl_metrics *m)
{
	m->nle = uints_decode(pm, "le_us", "le_us", m->le_us, 0, MAX_LE, 0);
	for (size_t i = 1; i < m->nle && !pm->err; i++)
		if (m->le_us[i] <= m->le_us[i - 1])
			proto_map_fail(pm, "le_us must increase");
	for (size_t i = 0; i < NHISTS && !pm->err; i++) {
		struct proto_map sub;
		if (proto_get_map(pm, hists[i].key, &sub, 0) <= 0)
			continue;
		uints_decode(&sub, "buckets", hists[i].key, m->hist[i].bucket, m->nle + 1,
			     MAX_LE + 1, 1);
		proto_get_u64(&sub, "sum_us", UINT64_MAX, &m->hist[i].sum_us, 1);
		if (sub.err)
			proto_map_fail(pm, "%s: %s", hists[i].key, sub.why);
		m->has_hist[i] = 1;
	}
}

/* Asks an open connection for METRICS; NULL once why is printed. */
struct ctl_metrics *metrics_query(dsckpt_conn_t *c)
{
	struct lib_reply r;
	struct proto_map *pm = &r.m, sub;
	struct ctl_metrics *m = calloc(1, sizeof(*m));

	if (!m) {
		out_err("out of memory");
		return NULL;
	}
	if (query_send(c, PROTO_METRICS, &r) != 0) {
		free(m);
		return NULL;
	}
	m->has_version = proto_get_str(pm, "version", m->version, PROTO_MAX_NAME, 0) > 0;
	for (size_t i = 0; i < NSCALARS; i++)
		m->has_scalar[i] = proto_get_u64(pm, scalars[i].key, UINT64_MAX, &m->scalar[i],
						 0) > 0;
	for (size_t i = 0; i < NREASONED; i++)
		reasons_decode(pm, m, i);
	if ((m->has_recovery = proto_get_map(pm, "recovery", &sub, 0) > 0)) {
		for (size_t i = 0; i < NACTIONS; i++)
			m->has_action[i] = proto_get_u64(&sub, actions[i], UINT64_MAX,
							 &m->recovery[i], 0) > 0;
		if (sub.err)
			proto_map_fail(pm, "recovery: %s", sub.why);
	}
	hists_decode(pm, m);
	if (query_end(c, &r) != 0) {
		free(m);
		return NULL;
	}
	return m;
}

/* Frees what metrics_query returned. */
void metrics_free(struct ctl_metrics *m)
{
	free(m);
}

/* Observations of histogram i: the sum of its buckets. */
static uint64_t hist_count(const struct ctl_metrics *m, size_t i)
{
	uint64_t n = 0;
	for (size_t b = 0; b <= m->nle; b++)
		n += m->hist[i].bucket[b];
	return n;
}

/* The metrics as a JSON object: the wire's keys, only those the reply held; reasons and
 * actions as objects of counts; each histogram as {le (s), buckets (cumulative, one per le),
 * sum (s), count}. */
cJSON *metrics_json(const struct ctl_metrics *m)
{
	cJSON *o = cJSON_CreateObject();

	if (m->has_version)
		cJSON_AddStringToObject(o, "version", m->version);
	for (size_t i = 0; i < NSCALARS; i++)
		if (m->has_scalar[i])
			cJSON_AddNumberToObject(o, scalars[i].key, (double)m->scalar[i]);
	for (size_t i = 0; i < NREASONED; i++) {
		cJSON *r = m->has_reasons[i] ? cJSON_AddObjectToObject(o, reasoned[i].key) : NULL;
		for (size_t k = 0; r && k < m->nreasons[i]; k++)
			cJSON_AddNumberToObject(r, m->reasons[i][k].name, (double)m->reasons[i][k].n);
	}
	cJSON *rec = m->has_recovery ? cJSON_AddObjectToObject(o, "recovery") : NULL;
	for (size_t i = 0; rec && i < NACTIONS; i++)
		if (m->has_action[i])
			cJSON_AddNumberToObject(rec, actions[i], (double)m->recovery[i]);
	for (size_t i = 0; i < NHISTS; i++) {
		if (!m->has_hist[i])
			continue;
		cJSON *h = cJSON_AddObjectToObject(o, hists[i].key);
		cJSON *le = cJSON_AddArrayToObject(h, "le");
		cJSON *b = cJSON_AddArrayToObject(h, "buckets");
		uint64_t cum = 0;
		for (size_t k = 0; k < m->nle; k++) {
			cum += m->hist[i].bucket[k];
			cJSON_AddItemToArray(le, cJSON_CreateNumber((double)m->le_us[k] / 1e6));
			cJSON_AddItemToArray(b, cJSON_CreateNumber((double)cum));
		}
		cJSON_AddNumberToObject(h, "sum", (double)m->hist[i].sum_us / 1e6);
		cJSON_AddNumberToObject(h, "count", (double)hist_count(m, i));
	}
	return o;
}

/* Prints a metric's HELP and TYPE lines. */
static void print_meta(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Prints s as a label value: backslash, double quote and newline escaped. */
static void print_label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

/* Prints histogram i: cumulative buckets, +Inf, sum and count. */
static void print_hist(FILE *f, const struct ctl_metrics *m, size_t i)
{
	const char *name = hists[i].name;
	uint64_t cum = 0;

	print_meta(f, name, "histogram", hists[i].help);
	for (size_t k = 0; k < m->nle; k++) {
		cum += m->hist[i].bucket[k];
		fprintf(f, "%s_bucket{le=\"%.9g\"} %" PRIu64 "\n", name, (double)m->le_us[k] / 1e6,
			cum);
	}
	fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, hist_count(m, i));
	fprintf(f, "%s_sum %.6f\n", name, (double)m->hist[i].sum_us / 1e6);
	fprintf(f, "%s_count %" PRIu64 "\n", name, hist_count(m, i));
}

/* Prints the metrics the reply held in Prometheus' text exposition format. */
static void metrics_print(FILE *f, const struct ctl_metrics *m)
{
	if (m->has_version) {
		print_meta(f, "dsckpt_build_info", "gauge",
			   "The daemon's version, in its label; always 1.");
		fputs("dsckpt_build_info{version=\"", f);
		print_label(f, m->version);
		fputs("\"} 1\n", f);
	}
	for (size_t i = 0; i < NSCALARS; i++) {
		if (!m->has_scalar[i])
			continue;
		print_meta(f, scalars[i].name, scalars[i].type, scalars[i].help);
		if (scalars[i].ms)
			fprintf(f, "%s %.3f\n", scalars[i].name, (double)m->scalar[i] / 1e3);
		else
			fprintf(f, "%s %" PRIu64 "\n", scalars[i].name, m->scalar[i]);
	}
	for (size_t i = 0; i < NREASONED; i++) {
		if (!m->has_reasons[i])
			continue;
		print_meta(f, reasoned[i].name, "counter", reasoned[i].help);
		for (size_t k = 0; k < m->nreasons[i]; k++)
			fprintf(f, "%s{reason=\"%s\"} %" PRIu64 "\n", reasoned[i].name,
				m->reasons[i][k].name, m->reasons[i][k].n);
	}
	for (size_t i = 0; i < NHISTS; i++)
		if (m->has_hist[i])
			print_hist(f, m, i);
	if (!m->has_recovery)
		return;
	print_meta(f, "dsckpt_recovery_actions_total", "counter",
		   "What recovery did when the daemon started, by action.");
	for (size_t i = 0; i < NACTIONS; i++)
		if (m->has_action[i])
			fprintf(f, "dsckpt_recovery_actions_total{action=\"%s\"} %" PRIu64 "\n",
				actions[i], m->recovery[i]);
}

/* Prints the daemon's metrics (METRICS): Prometheus text, or JSON with --json. */
int metrics_run(struct ctl *ctl)
{
	dsckpt_conn_t *c = query_open(ctl);
	struct ctl_metrics *m;

	if (!c)
		return CTL_FAIL;
	m = metrics_query(c);
	dsckpt_close(c);
	if (!m)
		return CTL_FAIL;
	if (ctl->json) {
		int rc = out_json(metrics_json(m));
		metrics_free(m);
		return rc;
	}
	metrics_print(stdout, m);
	metrics_free(m);
	/* A scrape file must never be half written: the caller renames it only on success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		out_err("cannot write the metrics: %s", strerror(errno));
		return CTL_FAIL;
	}
	return CTL_OK;
}
