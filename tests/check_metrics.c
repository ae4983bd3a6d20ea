/*
 * check_metrics.c — dsckptctl metrics against a real daemon: saves that succeed, one refused
 * and one that fails on a full disk, a commit, a load that succeeds and one that fails its
 * checksum; then the Prometheus text is checked line by line (names, HELP and TYPE before
 * the samples, labels, histograms cumulative and ending in +Inf == _count) and every counter
 * against what the test did. Also: recovery's counters after a restart, the METRICS request
 * decoded strictly, and the same numbers for a user who is not root.
 */
#include "harness_hostile.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_SERIES 512

/* ---- the exposition format ---- */

/* Length of the metric or label name at s ([a-zA-Z_:][a-zA-Z0-9_:]*, no ':' in a label). */
static size_t name_len(const char *s, int label)
{
	const char *first = label ? "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
				  : "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:";
	if (!*s || !strchr(first, *s))
		return 0;
	size_t n = 1;
	while (s[n] && (strchr(first, s[n]) || (s[n] >= '0' && s[n] <= '9')))
		n++;
	return n;
}

/* What the checker knows of the family whose samples come now. */
struct family {
	char name[128];
	char type[16];
	int samples;
	double le;          /* histogram: the last bound seen */
	double cum;         /* histogram: the last bucket's count */
	int inf;            /* histogram: +Inf seen */
	double count;       /* histogram: _count, -1 until seen */
};

/* Ends family f: a histogram must have had +Inf and a _count equal to it. */
static void family_end(const struct family *f, const char *text)
{
	if (strcmp(f->type, "histogram") != 0)
		return;
	ck_assert_msg(f->inf, "histogram %s has no +Inf bucket:\n%.1500s", f->name, text);
	ck_assert_msg(f->count == f->cum, "histogram %s: _count %g, +Inf bucket %g", f->name,
		      f->count, f->cum);
}

/* Parses the labels at *p ("{k=\"v\",...}"); the value of le into *le (NAN if absent). */
static void parse_labels(const char **p, const char *line, double *le)
{
	const char *s = *p + 1;

	*le = NAN;
	while (*s != '}') {
		size_t n = name_len(s, 1);
		ck_assert_msg(n > 0 && s[n] == '=' && s[n + 1] == '"', "bad label in: %s", line);
		int is_le = n == 2 && strncmp(s, "le", 2) == 0;
		s += n + 2;
		char v[256];
		size_t k = 0;
		for (; *s && *s != '"' && *s != '\n' && k + 1 < sizeof(v); s++) {
			if (*s == '\\') {
				s++;
				ck_assert_msg(*s == '\\' || *s == '"' || *s == 'n',
					      "bad escape in: %s", line);
			}
			v[k++] = *s;
		}
		v[k] = '\0';
		ck_assert_msg(*s == '"', "unterminated label value in: %s", line);
		s++;
		if (is_le)
			*le = strcmp(v, "+Inf") == 0 ? INFINITY : strtod(v, NULL);
		ck_assert_msg(*s == ',' || *s == '}', "bad label list in: %s", line);
		if (*s == ',')
			s++;
	}
	*p = s + 1;
}

/* Checks one sample line of family f. */
static void check_sample(struct family *f, const char *line, const char *text)
{
	const char *p = line;
	size_t n = name_len(p, 0);
	char name[128];
	double le = NAN;

	ck_assert_msg(n > 0 && n < sizeof(name), "bad metric name: %s", line);
	snprintf(name, sizeof(name), "%.*s", (int)n, p);
	p += n;
	if (*p == '{')
		parse_labels(&p, line, &le);
	ck_assert_msg(*p == ' ', "no value in: %s", line);
	char *end;
	double v = strtod(p + 1, &end);
	ck_assert_msg(end != p + 1 && (*end == '\n' || *end == '\0') && isfinite(v) && v >= 0,
		      "bad value in: %s", line);
	ck_assert_msg(f->type[0], "sample before its HELP and TYPE: %s", line);
	f->samples++;
	if (strcmp(f->type, "histogram") != 0) {
		ck_assert_msg(strcmp(name, f->name) == 0, "sample %s in family %s", name, f->name);
		return;
	}
	size_t fl = strlen(f->name);
	ck_assert_msg(strncmp(name, f->name, fl) == 0, "sample %s in family %s", name, f->name);
	const char *suffix = name + fl;
	if (strcmp(suffix, "_bucket") == 0) {
		ck_assert_msg(!isnan(le) && !f->inf, "bucket without le, or after +Inf: %s", line);
		ck_assert_msg(le > f->le, "le not increasing: %s", line);
		ck_assert_msg(v >= f->cum, "buckets not cumulative: %s", line);
		f->le = le;
		f->cum = v;
		f->inf = isinf(le);
	} else if (strcmp(suffix, "_count") == 0) {
		f->count = v;
	} else {
		ck_assert_msg(strcmp(suffix, "_sum") == 0, "sample %s in histogram %s", name,
			      f->name);
	}
}

/*
 * Checks text against Prometheus' text exposition format as dsckptctl writes it: each family
 * once, "# HELP" then "# TYPE" before its samples, names and labels well formed, counters
 * named *_total, histograms cumulative up to +Inf == _count, no series twice.
 */
static void prom_check(const char *text)
{
	struct family f = {.count = -1};
	char seen[MAX_SERIES][160];
	size_t nseen = 0;
	char families[MAX_SERIES][128];
	size_t nfam = 0;

	ck_assert_msg(*text && text[strlen(text) - 1] == '\n', "no final newline:\n%.1500s", text);
	for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
		size_t len = strcspn(line, "\n");
		char l[512];
		ck_assert_msg(len > 0 && len < sizeof(l), "empty or long line in:\n%.1500s", text);
		snprintf(l, sizeof(l), "%.*s", (int)len, line);
		if (strncmp(l, "# HELP ", 7) == 0) {
			size_t n = name_len(l + 7, 0);
			ck_assert_msg(n > 0 && l[7 + n] == ' ' && l[8 + n], "bad HELP: %s", l);
			if (f.name[0])
				family_end(&f, text);
			f = (struct family){.le = -INFINITY, .count = -1};
			snprintf(f.name, sizeof(f.name), "%.*s", (int)n, l + 7);
			for (size_t i = 0; i < nfam; i++)
				ck_assert_msg(strcmp(families[i], f.name) != 0, "%s twice", f.name);
			ck_assert_uint_lt(nfam, MAX_SERIES);
			snprintf(families[nfam++], sizeof(families[0]), "%s", f.name);
			continue;
		}
		if (strncmp(l, "# TYPE ", 7) == 0) {
			size_t n = strlen(f.name);
			ck_assert_msg(n && strncmp(l + 7, f.name, n) == 0 && l[7 + n] == ' ' &&
				      !f.type[0] && !f.samples, "TYPE not right after HELP: %s", l);
			const char *t = l + 8 + n;
			ck_assert_msg(strcmp(t, "counter") == 0 || strcmp(t, "gauge") == 0 ||
				      strcmp(t, "histogram") == 0, "bad type: %s", l);
			snprintf(f.type, sizeof(f.type), "%s", t);
			if (strcmp(t, "counter") == 0)
				ck_assert_msg(n > 6 && strcmp(f.name + n - 6, "_total") == 0,
					      "counter %s not named *_total", f.name);
			continue;
		}
		ck_assert_msg(l[0] != '#', "unknown comment: %s", l);
		check_sample(&f, l, text);
		size_t key = strcspn(l, " ");
		for (size_t i = 0; i < nseen; i++)
			ck_assert_msg(strncmp(seen[i], l, key) != 0 || seen[i][key],
				      "series twice: %s", l);
		ck_assert_uint_lt(nseen, MAX_SERIES);
		snprintf(seen[nseen++], sizeof(seen[0]), "%.*s", (int)key, l);
	}
	family_end(&f, text);
}

/* The value of the series (a name and its labels, as printed) in text; -1 when absent. */
static double prom_value(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *line = text; line && *line; line = strchr(line, '\n')) {
		if (*line == '\n')
			line++;
		if (strncmp(line, series, n) == 0 && line[n] == ' ')
			return strtod(line + n + 1, NULL);
	}
	return -1;
}

/* Asserts that series has value want in text (shown on stderr when it has not). */
#define ck_prom(text, series, want)                                                     \
	do {                                                                            \
		double v_ = prom_value((text), (series));                               \
		if (v_ != (double)(want))                                               \
			fprintf(stderr, "%s", (text));                                  \
		ck_assert_msg(v_ == (double)(want), "%s is %g, not %g", (series), v_,   \
			      (double)(want));                                          \
	} while (0)

/* Runs dsckptctl metrics on the test's daemon: its output, checked against the format. */
static char *metrics(void)
{
	char *out = NULL;
	int rc = ctl(&out, "metrics");
	ck_assert_msg(rc == 0 && out, "dsckptctl metrics exited %d:\n%.1500s", rc, out ? out : "");
	prom_check(out);
	return out;
}

/* ---- the trainer's side ---- */

/* Loads U8 tensor "t" of dir/rank0 (n bytes) into host memory: the load's final level, and
 * whether the bytes are seed's pattern. */
static int load_pattern(dsckpt_conn_t *c, const char *dir, size_t n, uint64_t seed, int *same)
{
	int64_t shape[1] = {(int64_t)n};
	void *mem = dsckpt_host_alloc(n);
	dsckpt_tensor_t t = {"t", "U8", shape, 1, mem, n};
	dsckpt_load_t *l;

	ck_assert_ptr_nonnull(mem);
	CK_DS(c, dsckpt_load_begin(c, dir, "rank0", &l));
	CK_DS(c, dsckpt_load_add_tensors(l, &t, 1, NULL));
	CK_DS(c, dsckpt_load_end(l));
	int rc = dsckpt_load_wait(l, 30000);
	*same = h_pattern_diff(mem, n, seed) == n;
	dsckpt_load_free(l);
	dsckpt_host_free(mem);
	return rc;
}

/* Flips the first data byte of dir/rank0.safetensors (its checksum no longer matches). */
static void corrupt(const char *dir)
{
	int fd = open(h_path("%s/rank0.safetensors", dir), O_RDWR);
	uint64_t hlen = 0;
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &hlen, 8, 0), 8);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)(8 + hlen)), 1);
	b ^= 0xff;
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(8 + hlen)), 1);
	close(fd);
}

/* ---- tests ---- */

/* Two saves (one committed), one refused, a load and a load that fails its checksum: every
 * counter, histogram count and gauge says exactly that. */
START_TEST(test_counts)
{
	d_start(CACHE_8M, CHUNK_1M "\"keep_resident\": false,");
	time_t t0 = time(NULL);
	dsckpt_conn_t *c = conn_open("mx", 0, 1);
	const char *t1 = h_path("%s/mx/t1", D->root), *t2 = h_path("%s/mx/t2", D->root);
	char *out = metrics();
	ck_prom(out, "dsckpt_saves_started_total", 0);
	ck_prom(out, "dsckpt_clients", 1);
	free(out);

	save_durable(c, t1, "rank0", 3 * MIB, 1);
	CK_DS(c, dsckpt_commit(c, t1, 30000));
	save_durable(c, t2, "rank0", MIB, 2);
	dsckpt_save_t *s = NULL;
	int refused = dsckpt_save_begin(c, h_path("%s/outside/t1", D->dir), "rank0", &s);
	ck_assert_msg(refused < 0, "a save outside the roots was begun");
	int same = 0;
	ck_assert_int_eq(load_pattern(c, t1, 3 * MIB, 1, &same), DSCKPT_LOADED);
	ck_assert(same);
	corrupt(t2);
	int rc = load_pattern(c, t2, MIB, 2, &same);
	ck_assert_msg(rc == DSCKPT_EFAILED, "the corrupt load gave %s", dsckpt_err_name(rc));
	ck_assert_int_eq(dsckpt_last_cause(c), DSCKPT_ECHECKSUM);

	out = metrics();
	ck_prom(out, "dsckpt_saves_started_total", 2);
	ck_prom(out, "dsckpt_saves_snapshotted_total", 2);
	ck_prom(out, "dsckpt_saves_durable_total", 2);
	ck_prom(out, "dsckpt_saves_committed_total", 1);
	ck_assert_msg(!strstr(out, "\ndsckpt_saves_failed_total{"), "a failure:\n%.1500s", out);
	ck_prom(out, h_path("dsckpt_saves_refused_total{reason=\"%s\"}",
			    dsckpt_err_name(refused)), 1);
	ck_prom(out, "dsckpt_copied_bytes_total", 4 * MIB);
	ck_prom(out, "dsckpt_flushed_bytes_total", 4 * MIB);
	ck_prom(out, "dsckpt_loads_started_total", 2);
	ck_prom(out, "dsckpt_loads_done_total", 1);
	ck_prom(out, "dsckpt_loads_failed_total{reason=\"ECHECKSUM\"}", 1);
	/* The corrupt tensor's bytes were written too: the check fails as they land. */
	ck_prom(out, "dsckpt_restored_bytes_total", 4 * MIB);
	ck_prom(out, "dsckpt_save_snapshot_seconds_count", 2);
	ck_prom(out, "dsckpt_save_flush_seconds_count", 2);
	ck_prom(out, "dsckpt_save_commit_seconds_count", 1);
	ck_prom(out, "dsckpt_save_commit_seconds_bucket{le=\"600\"}", 1);
	ck_assert(prom_value(out, "dsckpt_save_flush_seconds_sum") > 0);
	ck_prom(out, "dsckpt_saves_in_flight", 0);
	ck_prom(out, "dsckpt_loads_in_flight", 0);
	ck_prom(out, "dsckpt_clients", 1);
	ck_prom(out, "dsckpt_cache_size_bytes", 8 * MIB);
	ck_prom(out, "dsckpt_cache_used_bytes", 0);
	ck_prom(out, "dsckpt_cache_resident_bytes", 0);
	ck_prom(out, h_path("dsckpt_build_info{version=\"%s\"}", dsckpt_version()), 1);
	double start = prom_value(out, "dsckpt_start_time_seconds");
	ck_assert_msg(start >= (double)t0 - 60 && start <= (double)time(NULL) + 1, "start %f", start);
	ck_assert(prom_value(out, "dsckpt_uptime_seconds") >= 0);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"partial_removed\"}", 0);
	ck_assert_msg(!strstr(out, D->root), "a path in the metrics:\n%.1500s", out);
	free(out);

	/* status --json carries the same counters. */
	ck_assert_int_eq(ctl(&out, "--json status"), 0);
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	const cJSON *m = cJSON_GetObjectItem(doc, "metrics");
	ck_assert_int_eq(cJSON_GetObjectItem(m, "saves_durable")->valueint, 2);
	ck_assert_int_eq(cJSON_GetObjectItem(m, "flushed_bytes")->valuedouble, 4.0 * MIB);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "loads_failed"),
					     "ECHECKSUM")->valueint, 1);
	ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "flush_seconds"),
					     "count")->valueint, 2);
	cJSON_Delete(doc);
	free(out);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* A save into a full disk (a 4 MiB tmpfs) counts as failed with reason ENOSPC; the next
 * save is counted durable. Needs root to mount. */
START_TEST(test_disk_full)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *small = d_small_disk();
	if (!small)
		return;
	dsckpt_conn_t *c = conn_open("full", 0, 1);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, h_path("%s/job/t1", small), "rank0", 16 * MIB, 3,
					&mem);
	int rc = dsckpt_wait(s, DSCKPT_DURABLE, 60000);
	int cause = dsckpt_last_cause(c);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	save_durable(c, h_path("%s/ok/t1", D->root), "rank0", MIB, 4);
	char *out = metrics();
	dsckpt_close(c);
	int umounted = umount(small);

	ck_assert_msg(rc == DSCKPT_EFAILED && cause == DSCKPT_ENOSPC, "wait gave %s, cause %s",
		      dsckpt_err_name(rc), dsckpt_err_name(cause));
	ck_prom(out, "dsckpt_saves_failed_total{reason=\"ENOSPC\"}", 1);
	ck_prom(out, "dsckpt_saves_started_total", 2);
	ck_prom(out, "dsckpt_saves_durable_total", 1);
	ck_prom(out, "dsckpt_saves_in_flight", 0);
	ck_prom(out, "dsckpt_save_flush_seconds_count", 1);
	double snap = prom_value(out, "dsckpt_saves_snapshotted_total");
	ck_assert_msg(snap == 1 || snap == 2, "snapshotted %g", snap);
	ck_assert(prom_value(out, "dsckpt_flushed_bytes_total") >= MIB);
	ck_assert(prom_value(out, "dsckpt_flushed_bytes_total") < 17 * MIB);
	ck_assert_int_eq(umounted, 0);
	free(out);
	d_stop();
}
END_TEST

/* After a restart the counters start again, and recovery's actions are counted: a stale
 * partial file and the file of an uncommitted tag removed. */
START_TEST(test_recovery)
{
	d_start(CACHE_8M, CHUNK_1M);
	dsckpt_conn_t *c = conn_open("rec", 0, 1);
	save_durable(c, h_path("%s/rec/t1", D->root), "rank0", MIB, 5);	/* never committed */
	dsckpt_close(c);
	const char *partial = h_path("%s/rec/t0/rank0.safetensors.partial", D->root);
	ck_assert_int_eq(h_system("mkdir -p '%s/rec/t0' && echo junk > '%s'", D->root, partial),
			 0);
	struct timeval old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
	ck_assert_int_eq(utimes(partial, old), 0);
	ck_assert_int_eq(d_kill(SIGTERM), 0);
	d_restart(0);
	char *out = metrics();
	ck_prom(out, "dsckpt_saves_started_total", 0);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"partial_removed\"}", 1);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"file_removed\"}", 1);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"commit_finished\"}", 0);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"seal_resumed\"}", 0);
	ck_prom(out, "dsckpt_recovery_actions_total{action=\"file_left\"}", 0);
	ck_assert(!h_exists(partial));
	free(out);
	d_stop();
}
END_TEST

/* METRICS is decoded as strictly as any request: a key in its body is malformed (EPROTO,
 * the connection closes); a well-formed one is answered, before HELLO it is refused. */
START_TEST(test_request_strict)
{
	struct proto_out o;
	d_start(CACHE_8M, NULL);
	int fd = raw_connect();
	raw_hello(fd);
	out_map(&o, PROTO_METRICS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_eq(raw_expect_reply(fd, "saves_started"), 0);
	out_map(&o, PROTO_METRICS, 1);
	proto_kv_str(&o.pk, "job", "x");
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_int_eq(raw_expect_error(fd), DSCKPT_EPROTO);
	struct reply r;
	ck_assert_int_eq(raw_recv(fd, &r, 5000), -EPIPE);
	close(fd);
	fd = raw_connect();
	out_map(&o, PROTO_METRICS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_int_lt(raw_expect_error(fd), 0);
	close(fd);
	check_alive();
	d_stop();
}
END_TEST

/* Child of test_any_user: execs dsckptctl metrics on the test daemon's socket, its output
 * and errors into the pipe *arg. */
static int exec_metrics(void *arg)
{
	dup2(*(const int *)arg, 1);
	dup2(*(const int *)arg, 2);
	execl(h_bin("dsckptctl"), "dsckptctl", "-s", D->socket, "metrics", (char *)NULL);
	return 126;
}

/* A user who is not root reads the node's metrics: the victim's committed save is counted,
 * and no path of it shows. */
START_TEST(test_any_user)
{
	HOSTILE_BEGIN("metrics for any user");
	struct vic v = {.n = MIB, .seed = 9, .commit = 1, .wait_ms = 10000};
	hd_start(CACHE_8M, NULL);
	v.dir = h_path("%s/jobV/t1", D->root);
	victim_check(as_user(VIC, victim_main, &v), &v, "");

	int p[2];
	ck_assert_int_eq(pipe(p), 0);
	fflush(stdout);
	pid_t pid = as_user_spawn(ATK, exec_metrics, &p[1], 20);
	close(p[1]);
	char *out = NULL, buf[4096];
	size_t len = 0;
	ssize_t k;
	while ((k = read(p[0], buf, sizeof(buf))) > 0) {
		out = realloc(out, len + (size_t)k + 1);
		memcpy(out + len, buf, (size_t)k);
		len += (size_t)k;
		out[len] = '\0';
	}
	close(p[0]);
	int rc = as_user_wait(pid);
	ck_assert_msg(rc == 0 && out, "dsckptctl metrics as %s: %s: %s", ATK, status_str(rc),
		      out ? out : "");
	prom_check(out);
	ck_prom(out, "dsckpt_saves_started_total", 1);
	ck_prom(out, "dsckpt_saves_committed_total", 1);
	ck_prom(out, "dsckpt_flushed_bytes_total", MIB);
	ck_assert_msg(!strstr(out, "jobV") && !strstr(out, D->root), "a path shows:\n%.1500s", out);
	free(out);
	hd_stop();
}
END_TEST

/* Builds the suite. */
static Suite *metrics_suite(void)
{
	Suite *s = suite_create("metrics");
	h_add_case(s, "counts", test_counts, 60, 1);
	h_add_case(s, "disk full", test_disk_full, 60, 1);
	h_add_case(s, "recovery", test_recovery, 60, 1);
	h_add_case(s, "strict request", test_request_strict, 30, 1);
	h_add_case(s, "any user", test_any_user, 60, 1);
	return s;
}

CHECK_MAIN_BEFORE_RM(metrics_suite, d_unmount_small)
