/*
 * harness_daemon.c — the running test's daemon, dsckptctl against it, a trainer's saves
 * through libdsckpt, and a safetensors reader that checks what the daemon wrote.
 */
#include "harness_daemon.h"

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mount.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <xxhash.h>

/* The daemon of the running test. */
static struct hdaemon daemon_;
struct hdaemon *const D = &daemon_;

/* Starts this test's daemon. */
void d_start(double cache_gib, const char *extra_json)
{
	h_daemon_start(D, cache_gib, extra_json);
}

/* Restarts the daemon, with a stale socket file in its way if asked. */
void d_restart(int stale)
{
	if (stale)
		h_daemon_restart_stale(D);
	else
		h_daemon_restart(D);
}

/* Signals the daemon and reaps it. */
int d_kill(int sig)
{
	return h_daemon_kill(D, sig);
}

/* Stops the daemon and removes its scratch directory. */
void d_stop(void)
{
	h_daemon_stop(D);
}

/* ---- reading results back ---- */

/* Orders [begin, end) pairs by begin, then end. */
static int range_cmp(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;
	if (x[0] != y[0])
		return x[0] < y[0] ? -1 : 1;
	return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Parses a 16-hex-digit checksum string; fails the test if it is not one. */
static uint64_t hex16(const char *s, const char *what)
{
	ck_assert_msg(s && strlen(s) == 16 && strspn(s, "0123456789abcdefABCDEF") == 16,
		      "%s is not 16 hex digits: '%s'", what, s ? s : "(missing)");
	return strtoull(s, NULL, 16);
}

/* Value of a __metadata__ key, or NULL. */
const char *stf_meta(const struct stf *f, const char *key)
{
	cJSON *m = cJSON_GetObjectItemCaseSensitive(f->hdr, "__metadata__");
	cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/*
 * Reads path and checks its framing: header length, a JSON object, tensors packed without
 * gaps over exactly the data section, string-only __metadata__, dsckpt.data_xxh3.
 */
void stf_load(struct stf *f, const char *path)
{
	uint64_t hlen;

	memset(f, 0, sizeof(*f));
	f->buf = (uint8_t *)h_read_file(path, &f->len);
	ck_assert_msg(f->buf != NULL, "missing %s", path);
	ck_assert_msg(f->len >= 8, "%s: %zu bytes", path, f->len);
	memcpy(&hlen, f->buf, 8);
	ck_assert_msg(hlen <= f->len - 8, "%s: header length %llu > file", path,
		      (unsigned long long)hlen);
	f->data = 8 + hlen;
	f->hdr = cJSON_ParseWithLength((const char *)f->buf + 8, hlen);
	ck_assert_msg(cJSON_IsObject(f->hdr), "%s: header is not a JSON object", path);

	size_t n = 0, datalen = f->len - f->data;
	uint64_t(*r)[2] = calloc((size_t)cJSON_GetArraySize(f->hdr) + 1, sizeof(*r));
	cJSON *t;
	cJSON_ArrayForEach(t, f->hdr) {
		if (strcmp(t->string, "__metadata__") == 0) {
			cJSON *kv;
			cJSON_ArrayForEach(kv, t)
				ck_assert_msg(cJSON_IsString(kv), "metadata %s not a string",
					      kv->string);
			continue;
		}
		cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
		ck_assert_msg(cJSON_GetArraySize(off) == 2, "%s: data_offsets", t->string);
		r[n][0] = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
		r[n][1] = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
		ck_assert_msg(r[n][0] <= r[n][1] && r[n][1] <= datalen,
			      "%s: offsets [%llu, %llu) outside %zu data bytes", t->string,
			      (unsigned long long)r[n][0], (unsigned long long)r[n][1], datalen);
		n++;
	}
	qsort(r, n, sizeof(*r), range_cmp);
	uint64_t end = 0;
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(r[i][0] == end, "%s: gap or overlap at data offset %llu", path,
			      (unsigned long long)end);
		end = r[i][1];
	}
	free(r);
	ck_assert_msg(end == datalen, "%s: tensors cover %llu of %zu data bytes", path,
		      (unsigned long long)end, datalen);
	ck_assert_msg(hex16(stf_meta(f, "dsckpt.data_xxh3"), "dsckpt.data_xxh3") ==
			      XXH3_64bits(f->buf + f->data, datalen),
		      "%s: dsckpt.data_xxh3 does not match the data", path);
}

/* Frees what stf_load read. */
void stf_free(struct stf *f)
{
	cJSON_Delete(f->hdr);
	free(f->buf);
}

/* Finds tensor name, checks dtype, shape, size and checksum; returns its bytes in the file. */
const uint8_t *stf_tensor(const struct stf *f, const char *name, const char *dtype,
			  const int64_t *shape, int ndim, size_t nbytes)
{
	cJSON *t = cJSON_GetObjectItemCaseSensitive(f->hdr, name);
	ck_assert_msg(cJSON_IsObject(t), "tensor %s missing from the header", name);
	cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
	ck_assert_msg(cJSON_IsString(dt) && strcmp(dt->valuestring, dtype) == 0,
		      "%s: dtype %s, want %s", name, cJSON_IsString(dt) ? dt->valuestring : "?",
		      dtype);
	cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
	ck_assert_msg(cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == ndim, "%s: rank", name);
	for (int i = 0; i < ndim; i++)
		ck_assert_msg((int64_t)cJSON_GetArrayItem(sh, i)->valuedouble == shape[i],
			      "%s: dim %d", name, i);
	cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
	uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
	uint64_t e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
	ck_assert_msg(e - b == nbytes, "%s: %llu bytes, want %zu", name,
		      (unsigned long long)(e - b), nbytes);
	const uint8_t *p = f->buf + f->data + b;
	char key[600];
	snprintf(key, sizeof(key), "dsckpt.xxh3.%s", name);
	ck_assert_msg(hex16(stf_meta(f, key), key) == XXH3_64bits(p, nbytes),
		      "%s does not match the bytes", key);
	return p;
}

/* Checks that dir/file.safetensors holds U8 tensor "t" of n bytes of seed's pattern. */
void check_pattern_file(const char *dir, const char *file, size_t n, uint64_t seed)
{
	struct stf f;
	int64_t shape[1] = {(int64_t)n};

	stf_load(&f, h_path("%s/%s.safetensors", dir, file));
	const uint8_t *p = stf_tensor(&f, "t", "U8", shape, 1, n);
	size_t d = h_pattern_diff(p, n, seed);
	ck_assert_msg(d == n, "%s/%s: byte %zu of %zu differs from what was saved", dir, file, d,
		      n);
	stf_free(&f);
}


/* Whether any *.partial file lies under dir. */
int has_partial(const char *dir)
{
	return h_system("find '%s' -name '*.partial' | grep -q .", dir) == 0;
}

/* Contents of a small file, exactly ("" if missing); static buffer. */
const char *file_text(const char *path)
{
	static char buf[512];
	char *s = h_read_file(path, NULL);
	snprintf(buf, sizeof(buf), "%s", s ? s : "");
	free(s);
	return buf;
}

/* Runs dsckptctl -s <socket> with args; its output is kept in *out (may be NULL). */
int ctl(char **out, const char *fmt, ...)
{
	char args[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	const char *o = h_path("%s/ctl.out", D->dir);
	int rc = h_system("%s -s '%s' %s >'%s' 2>&1", h_bin("dsckptctl"), D->socket, args, o);
	if (out)
		*out = h_read_file(o, NULL);
	return rc;
}

/* Runs dsckptctl verify on dir and fails the test (with its output) unless it exits 0. */
void ctl_verify(const char *dir)
{
	char *out;
	int rc = ctl(&out, "verify '%s'", dir);
	ck_assert_msg(rc == 0, "dsckptctl verify %s exited %d:\n%s", dir, rc, out ? out : "");
	free(out);
}

/* Connects to the test daemon and identifies as rank of a job of world ranks. */
dsckpt_conn_t *conn_open(const char *job, int rank, int world)
{
	dsckpt_conn_t *c = NULL;
	int rc = dsckpt_connect(D->socket, &c);
	ck_assert_msg(rc == 0, "dsckpt_connect: %s", dsckpt_err_name(rc));
	CK_DS(c, dsckpt_identify(c, job, rank, world));
	return c;
}

/* Waits for s to reach level (within timeout_ms) and fails the test otherwise. */
void wait_level(dsckpt_conn_t *c, dsckpt_save_t *s, int level, int timeout_ms)
{
	int rc = dsckpt_wait(s, level, timeout_ms);
	ck_assert_msg(rc >= level, "dsckpt_wait(%s): %s: %s", dsckpt_level_name(level),
		      rc < 0 ? dsckpt_err_name(rc) : dsckpt_level_name(rc), dsckpt_last_error(c));
}

/* n U8 tensors "p.<i>" of *shape bytes in mem, for plans. */
void plan_specs(dsckpt_tensor_t *t, char (*names)[16], int n, const int64_t *shape,
		uint8_t *mem)
{
	for (int i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "p.%d", i);
		t[i] = (dsckpt_tensor_t){names[i], "U8", shape, 1, mem + (size_t)i * (size_t)*shape,
					 (size_t)*shape};
	}
}

/*
 * Saves U8 tensor "t" of n bytes of seed's pattern into dir/file and returns the save
 * (ACCEPTED). The bytes live in *mem (dsckpt_host_alloc'd), which the caller frees after
 * SNAPSHOT.
 */
dsckpt_save_t *save_pattern(dsckpt_conn_t *c, const char *dir, const char *file, size_t n,
			    uint64_t seed, void **mem)
{
	dsckpt_save_t *s = NULL;
	int64_t shape[1] = {(int64_t)n};

	*mem = dsckpt_host_alloc(n);
	ck_assert_ptr_nonnull(*mem);
	h_pattern_fill(*mem, n, seed);
	CK_DS(c, dsckpt_save_begin(c, dir, file, &s));
	CK_DS(c, dsckpt_add_tensor(s, "t", "U8", shape, 1, *mem, n));
	CK_DS(c, dsckpt_save_end(s));
	return s;
}

/* Saves a pattern file and waits until it is durable. */
void save_durable(dsckpt_conn_t *c, const char *dir, const char *file, size_t n,
		  uint64_t seed)
{
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, file, n, seed, &mem);

	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
}

/* Saves a small pattern file into dir, waits DURABLE and commits dir (world 1). */
void save_and_commit(dsckpt_conn_t *c, const char *dir, uint64_t seed)
{
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir, "rank0", 64 * 1024, seed, &mem);
	wait_level(c, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
}

/* The running daemon's root gets "small", a 4 MiB tmpfs (a full disk): its path, or NULL
 * after printing SKIP and stopping the daemon when mounting needs root this process lacks. */
const char *d_small_disk(void)
{
	const char *small = h_path("%s/small", D->root);

	if (geteuid() != 0) {
		d_stop();
		printf("SKIP: a full disk needs root (to mount a tmpfs)\n");
		fflush(stdout);
		return NULL;
	}
	ck_assert_int_eq(mkdir(small, 0755), 0);
	if (mount("tmpfs", small, "tmpfs", 0, "size=4m") != 0) {
		int e = errno;
		d_stop();
		ck_assert_msg(e == EPERM, "mount tmpfs: %s", strerror(e));
		printf("SKIP: a full disk needs root (mount tmpfs: %s)\n", strerror(e));
		fflush(stdout);
		return NULL;
	}
	return small;
}

/* Unmounts the tmpfs d_small_disk mounted under d's root. */
void d_unmount_small(const struct hdaemon *d)
{
	umount2(h_path("%s/small", d->root), MNT_DETACH);
}

/* Plants a stale partial file below root (see harness_daemon.h): its path. */
const char *d_plant_bait(const char *root)
{
	static char bait[512];
	struct timeval old[2];
	const char *tag = h_path("%s/job/t1", root);

	mkdir(h_path("%s/job", root), 0755);
	mkdir(tag, 0755);
	snprintf(bait, sizeof(bait), "%s/rank9.safetensors.partial", tag);
	int fd = open(bait, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "half a file", 11), 11);
	close(fd);
	gettimeofday(&old[0], NULL);
	old[0].tv_sec -= 3600;
	old[1] = old[0];
	ck_assert_int_eq(utimes(bait, old), 0);
	return bait;
}
