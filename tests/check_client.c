/*
 * check_client.c — libdsckpt without a daemon: error and level names, the host allocator,
 * argument validation, and the library's requests against a scripted fake peer (a forked
 * process speaking proto/ on a temporary socket, checking every frame strictly and logging
 * what it saw).
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../client/lib/internal.h"
#include "harness.h"

/* Every code has its own message and name. */
START_TEST(test_errors)
{
#define XX(name, value, msg)                                                   \
	ck_assert_str_eq(dsckpt_strerror(DSCKPT_##name), msg);                 \
	ck_assert_str_eq(dsckpt_err_name(value), #name);
	DSCKPT_ERRNO_MAP(XX)
#undef XX
	ck_assert_str_eq(dsckpt_strerror(0), "success");
	ck_assert_str_eq(dsckpt_err_name(0), "OK");
	ck_assert_str_eq(dsckpt_strerror(-9999), "unknown error");
	ck_assert_str_eq(dsckpt_err_name(-9999), "UNKNOWN");
	ck_assert_str_eq(dsckpt_err_name(5), "UNKNOWN");
	ck_assert_str_eq(dsckpt_version(), DSCKPT_VERSION_STRING);
	ck_assert_int_eq(lib_errno(ENOSPC), DSCKPT_ENOSPC);
	ck_assert_int_eq(lib_errno(ECONNRESET), DSCKPT_EPIPE);
	ck_assert_int_eq(lib_errno(ELOOP), DSCKPT_EIO);
}
END_TEST

/* Level names, and unknown levels. */
START_TEST(test_levels)
{
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_FAILED), "FAILED");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_NONE), "NONE");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_ACCEPTED), "ACCEPTED");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_SNAPSHOT), "SNAPSHOT");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_DURABLE), "DURABLE");
	ck_assert_str_eq(dsckpt_level_name(DSCKPT_COMMITTED), "COMMITTED");
	ck_assert_str_eq(dsckpt_level_name(5), "UNKNOWN");
	ck_assert_str_eq(dsckpt_level_name(-2), "UNKNOWN");
}
END_TEST

/* Many blocks: lookups inside, across the end, outside; frees, reuse, unique ids. */
START_TEST(test_host_alloc)
{
	enum { N = 300 };
	uint8_t *p[N];
	struct lib_hostref h, seen[N];
	uint64_t gen = lib_host_generation();

	for (int i = 0; i < N; i++) {
		size_t size = 1 + (size_t)i * 1237;
		p[i] = dsckpt_host_alloc(size);
		ck_assert_ptr_nonnull(p[i]);
		memset(p[i], i & 0xff, size);
		ck_assert_int_eq(lib_host_find(p[i], size, &seen[i]), 1);
		ck_assert(seen[i].base == (uintptr_t)p[i]);
		ck_assert_uint_ge(seen[i].size, size);
		ck_assert_uint_eq(seen[i].size % 4096, 0);
		for (int j = 0; j < i; j++)
			ck_assert(seen[j].region != seen[i].region);
	}
	for (int i = 0; i < N; i++) {
		size_t size = 1 + (size_t)i * 1237;
		ck_assert_int_eq(lib_host_find(p[i] + size / 2, size - size / 2, &h), 1);
		ck_assert(h.region == seen[i].region);
		ck_assert_int_eq(lib_host_find(p[i] + 1, seen[i].size, &h), DSCKPT_EINVAL);
		ck_assert_int_eq(p[i][size - 1], i & 0xff);
	}
	int on_stack = 0;
	ck_assert_int_eq(lib_host_find(&on_stack, sizeof(on_stack), &h), 0);
	ck_assert_int_eq(lib_host_find(NULL, 0, &h), 0);

	for (int i = 0; i < N; i += 2) {
		dsckpt_host_free(p[i]);
		ck_assert_int_eq(lib_host_find(p[i], 1, &h), 0);
		ck_assert(!lib_host_alive(&seen[i]));
		ck_assert_int_eq(lib_host_dup(&seen[i]), DSCKPT_ENOENT);
	}
	ck_assert_uint_eq(lib_host_generation(), gen + N / 2);
	for (int i = 1; i < N; i += 2) {
		ck_assert(lib_host_alive(&seen[i]));
		int fd = lib_host_dup(&seen[i]);
		ck_assert_int_ge(fd, 0);
		struct stat st;
		ck_assert_int_eq(fstat(fd, &st), 0);
		ck_assert_uint_eq((uint64_t)st.st_size, seen[i].size);
		close(fd);
	}
	/* Reuse: a new block gets a fresh region id even at a recycled address. */
	for (int i = 0; i < N; i += 2) {
		p[i] = dsckpt_host_alloc(4096);
		ck_assert_ptr_nonnull(p[i]);
		ck_assert_int_eq(lib_host_find(p[i], 4096, &h), 1);
		for (int j = 0; j < N; j++)
			ck_assert(h.region != seen[j].region);
	}
	dsckpt_host_free(NULL);
	dsckpt_host_free(&on_stack);           /* not ours: ignored */
	dsckpt_host_free(p[1] + 1);            /* not a base: ignored */
	ck_assert_int_eq(lib_host_find(p[1], 1, &h), 1);
	for (int i = 0; i < N; i++)
		dsckpt_host_free(p[i]);
	ck_assert_ptr_null(dsckpt_host_alloc(0));
	ck_assert_ptr_null(dsckpt_host_alloc(SIZE_MAX));
}
END_TEST

/* A missing socket, a path that is not a socket, an over-long path, $DSCKPT_SOCKET. */
START_TEST(test_connect_errors)
{
	char dir[256], path[400], big[200];
	dsckpt_conn_t *c = (dsckpt_conn_t *)&c;

	h_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/none.sock", dir);
	ck_assert_int_eq(dsckpt_connect(path, &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), path));

	setenv("DSCKPT_SOCKET", path, 1);
	ck_assert_int_eq(dsckpt_connect(NULL, &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), path));
	ck_assert_int_eq(dsckpt_connect("", &c), DSCKPT_ECONNREFUSED);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(NULL), path));
	unsetenv("DSCKPT_SOCKET");

	ck_assert_int_eq(h_system("touch '%s'", path), 0);
	ck_assert_int_eq(dsckpt_connect(path, &c), DSCKPT_ECONNREFUSED);

	memset(big, 'a', sizeof(big) - 1);
	big[0] = '/';
	big[sizeof(big) - 1] = 0;
	ck_assert_int_eq(dsckpt_connect(big, &c), DSCKPT_ENAMETOOLONG);
	ck_assert_int_eq(dsckpt_connect(path, NULL), DSCKPT_EINVAL);
	h_rm_rf(dir);
}
END_TEST

/* Tensor and blob validation before anything goes to the daemon. */
START_TEST(test_tensor_check)
{
	char why[LIB_ERRLEN], name[600];
	int64_t s2[2] = {3, 5}, neg[2] = {3, -1}, huge[2] = {INT64_MAX, 4};
	int64_t big[17];
	uint8_t buf[64];

	ck_assert_uint_eq(lib_check_dtype("F64"), 8);
	ck_assert_uint_eq(lib_check_dtype("F32"), 4);
	ck_assert_uint_eq(lib_check_dtype("BF16"), 2);
	ck_assert_uint_eq(lib_check_dtype("F16"), 2);
	ck_assert_uint_eq(lib_check_dtype("I64"), 8);
	ck_assert_uint_eq(lib_check_dtype("U32"), 4);
	ck_assert_uint_eq(lib_check_dtype("I16"), 2);
	ck_assert_uint_eq(lib_check_dtype("U8"), 1);
	ck_assert_uint_eq(lib_check_dtype("BOOL"), 1);
	ck_assert_uint_eq(lib_check_dtype("F8_E4M3"), 1);
	ck_assert_uint_eq(lib_check_dtype("F8_E5M2"), 1);
	ck_assert_uint_eq(lib_check_dtype("f32"), 0);
	ck_assert_uint_eq(lib_check_dtype(""), 0);
	ck_assert_uint_eq(lib_check_dtype("F32 "), 0);

	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, buf, 60, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", NULL, 0, buf, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", s2, 0, buf, 1, why, sizeof(why)), 0);
	int64_t zero[1] = {0};
	ck_assert_int_eq(lib_check_tensor("w", "F32", zero, 1, NULL, 0, why, sizeof(why)), 0);

	ck_assert_int_eq(lib_check_tensor(NULL, "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("", "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	memset(name, 'n', sizeof(name));
	name[PROTO_MAX_NAME] = 0;
	ck_assert_int_eq(lib_check_tensor(name, "F32", s2, 2, buf, 60, why, sizeof(why)), 0);
	name[PROTO_MAX_NAME] = 'n';
	name[PROTO_MAX_NAME + 1] = 0;
	ck_assert_int_eq(lib_check_tensor(name, "F32", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_ENAMETOOLONG);
	ck_assert_int_eq(lib_check_tensor("__metadata__", "F32", s2, 2, buf, 60, why,
					  sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F31", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "F31"));
	ck_assert_int_eq(lib_check_tensor("w", NULL, s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, -1, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	for (int i = 0; i < 17; i++)
		big[i] = 1;
	ck_assert_int_eq(lib_check_tensor("w", "U8", big, 16, buf, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_tensor("w", "U8", big, 17, buf, 1, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", NULL, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", neg, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "U8", huge, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_ERANGE);
	int64_t h1[1] = {INT64_MAX / 2 + 1};   /* 2^62 elements of 4 bytes */
	ck_assert_int_eq(lib_check_tensor("w", "F32", h1, 1, buf, 60, why, sizeof(why)),
			 DSCKPT_ERANGE);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, buf, 59, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "60"));
	ck_assert_int_eq(lib_check_tensor("w", "BF16", s2, 2, buf, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_tensor("w", "F32", s2, 2, NULL, 60, why, sizeof(why)),
			 DSCKPT_EINVAL);

	ck_assert_int_eq(lib_check_blob("meta", buf, 3, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_blob("meta", NULL, 0, why, sizeof(why)), 0);
	ck_assert_int_eq(lib_check_blob("meta", NULL, 3, why, sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_blob("", buf, 3, why, sizeof(why)), DSCKPT_EINVAL);
	ck_assert_int_eq(lib_check_blob(name, buf, 3, why, sizeof(why)), DSCKPT_ENAMETOOLONG);
}
END_TEST

/* NULL handles are refused, not dereferenced. */
START_TEST(test_null_handles)
{
	dsckpt_save_t *s = (dsckpt_save_t *)&s;
	dsckpt_progress_t p;
	int64_t shape[1] = {1};

	ck_assert_int_eq(dsckpt_identify(NULL, "j", 0, 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(NULL, "/x", "f", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_add_tensor(NULL, "t", "U8", shape, 1, "", 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_add_blob(NULL, "b", "", 0), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_end(NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_set_stream(NULL, NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_wait(NULL, DSCKPT_SNAPSHOT, 0), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_progress(NULL, &p), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_commit(NULL, "/x", 0), DSCKPT_EINVAL);
	dsckpt_save_free(NULL);
	dsckpt_close(NULL);
}
END_TEST

/* ---- a scripted fake peer ---- */

/* How the fake peer misbehaves. */
static struct fake_opts {
	int begin_error;      /* answer SAVE_BEGIN with ERROR EACCES */
	int close_on_end;     /* hang up on SAVE_END */
	int bad_id;           /* answer with a wrong request id */
	int wait_level;       /* WAIT answers this level (0: the level asked for) */
	int hello_version;    /* answer HELLO with ERROR EVERSION */
} fo;

/* A fake peer: its socket, its log and its process. */
struct fake {
	char dir[256];
	char path[300];
	char log[300];
	pid_t pid;
};

/* FNV-1a over bytes (the fake logs it for each tensor). */
static uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* One region the fake peer mapped. */
struct fake_region {
	uint64_t id, size;
	const uint8_t *p;
};

/* Reads one SAVE_ADD tensor entry, logs it with the checksum of its bytes. */
static void fake_tensor(const msgpack_object *obj, struct fake_region *regs, int nregs,
			FILE *log)
{
	struct proto_map m;
	const msgpack_object_array *shape;
	char name[PROTO_MAX_NAME + 1], dtype[16];
	uint64_t region, offset, nbytes;

	proto_map_init(&m, obj);
	proto_get_str(&m, "name", name, PROTO_MAX_NAME, 1);
	proto_get_str(&m, "dtype", dtype, 15, 1);
	proto_get_array(&m, "shape", &shape, PROTO_MAX_DIMS, 1);
	proto_get_u64(&m, "region", UINT64_MAX, &region, 1);
	proto_get_u64(&m, "offset", UINT64_MAX, &offset, 1);
	proto_get_u64(&m, "nbytes", UINT64_MAX, &nbytes, 1);
	if (proto_map_end(&m) < 0) {
		fprintf(log, "BAD tensor: %s\n", m.why);
		return;
	}
	for (int i = 0; i < nregs; i++) {
		if (regs[i].id != region)
			continue;
		if (offset > regs[i].size || nbytes > regs[i].size - offset)
			break;
		fprintf(log, "tensor %s %s ndim=%u region=%" PRIu64 " offset=%" PRIu64
			" nbytes=%" PRIu64 " fnv=%016" PRIx64 "\n", name, dtype, shape->size,
			region, offset, nbytes, fnv(regs[i].p + offset, nbytes));
		return;
	}
	fprintf(log, "BAD tensor %s: region %" PRIu64 " unknown or too small\n", name, region);
}

/* Handles one request; returns 0 to go on, -1 to hang up. */
static int fake_request(int fd, const struct proto_hdr *h, struct proto_map *m, int *fds,
			unsigned nfds, struct fake_region *regs, int *nregs, FILE *log)
{
	static uint64_t ntensors;
	struct proto_out o;
	char s1[PROTO_MAX_STR + 1], s2[PROTO_MAX_STR + 1];
	uint64_t u1 = 0, u2 = 0, u3 = 0;
	int64_t i1 = 0, i2 = 0;
	const msgpack_object_array *arr = NULL, *blobs = NULL;
	uint64_t id = fo.bad_id ? h->id + 1 : h->id;

	proto_out_init(&o, PROTO_REPLY, id);
	switch (h->type) {
	case PROTO_HELLO:
		proto_get_str(m, "role", s1, 16, 1);
		proto_get_str(m, "job", s2, PROTO_MAX_NAME, 1);
		proto_get_u64(m, "rank", UINT64_MAX, &u1, 1);
		proto_get_u64(m, "world", UINT64_MAX, &u2, 1);
		proto_get_u64(m, "pid", UINT64_MAX, &u3, 1);
		fprintf(log, "hello %s %s %" PRIu64 "/%" PRIu64 "\n", s1, s2, u1, u2);
		if (fo.hello_version) {
			proto_out_free(&o);
			proto_out_init(&o, PROTO_ERROR, id);
			msgpack_pack_map(&o.pk, 4);
			proto_kv_i64(&o.pk, "code", DSCKPT_EVERSION);
			proto_kv_str(&o.pk, "message", "protocol mismatch");
			proto_kv_u64(&o.pk, "server_proto", 9);
			proto_kv_u64(&o.pk, "client_proto", PROTO_VERSION);
			break;
		}
		msgpack_pack_map(&o.pk, 3);
		proto_kv_str(&o.pk, "version", "fake");
		proto_kv_u64(&o.pk, "proto", PROTO_VERSION);
		proto_kv_u64(&o.pk, "client", 1);
		break;
	case PROTO_REGION_ADD:
		proto_get_u64(m, "region", UINT64_MAX, &u1, 1);
		proto_get_str(m, "kind", s1, 16, 1);
		proto_get_u64(m, "size", UINT64_MAX, &u2, 1);
		if (nfds != 1 || strcmp(s1, "host") != 0 || *nregs == 64) {
			fprintf(log, "BAD region_add\n");
			break;
		}
		regs[*nregs].id = u1;
		regs[*nregs].size = u2;
		regs[*nregs].p = mmap(NULL, u2, PROT_READ, MAP_SHARED, fds[0], 0);
		close(fds[0]);
		if (regs[*nregs].p == MAP_FAILED)
			fprintf(log, "BAD mmap\n");
		(*nregs)++;
		fprintf(log, "region_add %" PRIu64 " %" PRIu64 "\n", u1, u2);
		msgpack_pack_map(&o.pk, 0);
		break;
	case PROTO_REGION_DEL:
		proto_get_u64(m, "region", UINT64_MAX, &u1, 1);
		fprintf(log, "region_del %" PRIu64 "\n", u1);
		msgpack_pack_map(&o.pk, 0);
		break;
	case PROTO_SAVE_BEGIN:
		proto_get_str(m, "dir", s1, PROTO_MAX_STR, 1);
		proto_get_str(m, "file", s2, PROTO_MAX_STR, 1);
		fprintf(log, "save_begin %s %s\n", s1, s2);
		if (fo.begin_error) {
			proto_out_free(&o);
			proto_out_init(&o, PROTO_ERROR, id);
			msgpack_pack_map(&o.pk, 2);
			proto_kv_i64(&o.pk, "code", DSCKPT_EACCES);
			proto_kv_str(&o.pk, "message", "not under an allowed root");
			break;
		}
		msgpack_pack_map(&o.pk, 1);
		proto_kv_u64(&o.pk, "save", 7);
		break;
	case PROTO_SAVE_ADD:
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		/* fall through: SAVE_END may carry the last batch of entries too */
	entries:
		proto_get_array(m, "tensors", &arr, 65536, 0);
		proto_get_array(m, "blobs", &blobs, 65536, 0);
		if (h->type == PROTO_SAVE_END && !arr && !blobs)
			goto end;
		fprintf(log, "save_add len=%u tensors=%u blobs=%u\n", h->length,
			arr ? arr->size : 0, blobs ? blobs->size : 0);
		for (uint32_t i = 0; arr && i < arr->size; i++)
			fake_tensor(&arr->ptr[i], regs, *nregs, log);
		for (uint32_t i = 0; blobs && i < blobs->size; i++) {
			struct proto_map b;
			const void *data;
			size_t len;
			proto_map_init(&b, &blobs->ptr[i]);
			proto_get_str(&b, "name", s1, PROTO_MAX_NAME, 1);
			proto_get_bin(&b, "data", &data, &len, PROTO_MAX_BODY, 1);
			if (proto_map_end(&b) < 0)
				fprintf(log, "BAD blob: %s\n", b.why);
			else
				fprintf(log, "blob %s len=%zu fnv=%016" PRIx64 "\n", s1, len,
					fnv(data, len));
		}
		ntensors += arr ? arr->size : 0;
		if (h->type == PROTO_SAVE_END)
			goto end;
		msgpack_pack_map(&o.pk, 2);
		proto_kv_u64(&o.pk, "tensors", ntensors);
		proto_kv_u64(&o.pk, "bytes", 0);
		break;
	case PROTO_SAVE_END: {
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		goto entries;
	end:;
		const void *ev, *uuid;
		size_t evlen = 0, uuidlen = 0;
		int has_ev = proto_get_bin(m, "event", &ev, &evlen, 64, 0);
		int has_uuid = proto_get_bin(m, "uuid", &uuid, &uuidlen, 16, 0);
		if (has_ev != has_uuid || (has_ev == 1 && (evlen != 64 || uuidlen != 16)))
			fprintf(log, "BAD save_end event\n");
		fprintf(log, "save_end %" PRIu64 "%s\n", u1, has_ev == 1 ? " event" : "");
		if (fo.close_on_end) {
			proto_out_free(&o);
			return -1;
		}
		msgpack_pack_map(&o.pk, 1);
		proto_kv_i64(&o.pk, "level", DSCKPT_ACCEPTED);
		break;
	}
	case PROTO_WAIT:
		proto_get_u64(m, "save", UINT64_MAX, &u1, 1);
		proto_get_i64(m, "level", INT64_MIN, INT64_MAX, &i1, 1);
		proto_get_i64(m, "timeout_ms", INT64_MIN, INT64_MAX, &i2, 1);
		fprintf(log, "wait %" PRIu64 " %" PRId64 " %" PRId64 "\n", u1, i1, i2);
		i1 = fo.wait_level ? fo.wait_level : i1 ? i1 : DSCKPT_SNAPSHOT;
		msgpack_pack_map(&o.pk, i1 == DSCKPT_FAILED ? 6 : 5);
		proto_kv_u64(&o.pk, "save", u1);
		proto_kv_i64(&o.pk, "level", i1);
		proto_kv_u64(&o.pk, "bytes_total", 100);
		proto_kv_u64(&o.pk, "bytes_snapshot", 60);
		proto_kv_u64(&o.pk, "bytes_flushed", 20);
		if (i1 == DSCKPT_FAILED)
			proto_kv_str(&o.pk, "error", "disk full");
		break;
	case PROTO_COMMIT:
		proto_get_str(m, "dir", s1, PROTO_MAX_STR, 1);
		proto_get_u64(m, "world", UINT64_MAX, &u1, 1);
		proto_get_i64(m, "timeout_ms", INT64_MIN, INT64_MAX, &i1, 1);
		fprintf(log, "commit %s %" PRIu64 " %" PRId64 "\n", s1, u1, i1);
		msgpack_pack_map(&o.pk, 4);
		proto_kv_i64(&o.pk, "level", DSCKPT_COMMITTED);
		proto_kv_str(&o.pk, "tag", "step1");
		proto_kv_u64(&o.pk, "files", 1);
		proto_kv_u64(&o.pk, "bytes", 100);
		break;
	default:
		fprintf(log, "BAD type %u\n", h->type);
		break;
	}
	if (proto_map_end(m) < 0)
		fprintf(log, "BAD %s: %s\n", proto_type_name(h->type), m->why);
	size_t len = proto_out_finish(&o, 0);
	int e = proto_send(fd, o.sb.data, len, NULL, 0);
	proto_out_free(&o);
	return e < 0 ? -1 : 0;
}

/* The fake peer's process: one connection, requests until EOF. */
static void fake_serve(int lfd, const char *logpath)
{
	FILE *log = fopen(logpath, "w");
	struct fake_region regs[64];
	int nregs = 0;
	int fd = accept(lfd, NULL, NULL);

	if (!log || fd < 0)
		_exit(2);
	setvbuf(log, NULL, _IOLBF, 0);
	for (;;) {
		struct proto_hdr h;
		struct proto_in in;
		struct proto_map m;
		uint8_t *body;
		int fds[PROTO_MAX_FDS];
		unsigned nfds = 0;
		char why[160];

		if (proto_recv(fd, &h, &body, fds, &nfds, -1, why, sizeof(why)) < 0)
			break;
		if (h.version != PROTO_VERSION || h.nfds != nfds ||
		    proto_in_parse(&in, body, h.length, why, sizeof(why)) < 0) {
			fprintf(log, "BAD frame\n");
			break;
		}
		proto_map_init(&m, in.root);
		int r = fake_request(fd, &h, &m, fds, nfds, regs, &nregs, log);
		proto_in_free(&in);
		free(body);
		if (r < 0)
			break;
	}
	fprintf(log, "eof\n");
	fclose(log);
	_exit(0);
}

/* Starts a fake peer listening on a fresh socket. */
static void fake_start(struct fake *f)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int lfd;

	h_tmpdir(f->dir, sizeof(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/d.sock", f->dir);
	snprintf(f->log, sizeof(f->log), "%s/log", f->dir);
	ck_assert_uint_lt(strlen(f->path), sizeof(sa.sun_path));
	memcpy(sa.sun_path, f->path, strlen(f->path) + 1);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 1), 0);
	f->pid = fork();
	ck_assert_int_ge(f->pid, 0);
	if (f->pid == 0)
		fake_serve(lfd, f->log);
	close(lfd);
}

/* Waits for the fake peer to finish (the client closed) and returns its log. */
static char *fake_finish(struct fake *f)
{
	int st;
	ck_assert_int_eq(waitpid(f->pid, &st, 0), f->pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	char *log = h_read_file(f->log, NULL);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "BAD") == NULL, "fake peer saw: %s", log);
	h_rm_rf(f->dir);
	return log;
}

/* Connects to a fake peer and identifies as rank 0 of 2. */
static dsckpt_conn_t *fake_connect(struct fake *f)
{
	dsckpt_conn_t *c;
	fake_start(f);
	ck_assert_int_eq(dsckpt_connect(f->path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "job", 0, 2), 0);
	return c;
}

/* Counts the lines of a log that contain needle (line by line: strstr over a long log is
 * quadratic under ASan). */
static int count(const char *log, const char *needle)
{
	size_t nl = strlen(needle);
	int n = 0;
	for (const char *p = log; *p;) {
		const char *end = p;
		while (*end && *end != '\n')
			end++;
		if (memmem(p, (size_t)(end - p), needle, nl))
			n++;
		p = *end ? end + 1 : end;
	}
	return n;
}

/* Microseconds on the monotonic clock. */
static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* A whole save: 1,000 tensors zero-copy in one frame, staged ones, a blob in pieces. */
START_TEST(test_fake_save)
{
	enum { NT = 1000 };
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	dsckpt_progress_t p;
	char name[64], line[256];
	size_t blen = 9u << 20;
	uint8_t *host = dsckpt_host_alloc(NT * 64);
	uint8_t *heap = malloc(3000);
	uint8_t *blob = malloc(blen);
	int64_t shape[2] = {4, 4};
	struct lib_hostref h;

	for (size_t i = 0; i < NT * 64; i++)
		host[i] = (uint8_t)(i * 7);
	for (size_t i = 0; i < 3000; i++)
		heap[i] = (uint8_t)(i * 13);
	for (size_t i = 0; i < blen; i++)
		blob[i] = (uint8_t)(i >> 3);
	ck_assert_int_eq(lib_host_find(host, 1, &h), 1);

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/job/step1", "rank0", &s), 0);
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "layer.%d.weight", i);
		ck_assert_int_eq(dsckpt_add_tensor(s, name, "F32", shape, 2, host + i * 64, 64),
				 0);
	}
	ck_assert_int_eq(dsckpt_add_tensor(s, "layer.0.weight", "F32", shape, 2, host, 64),
			 DSCKPT_EEXIST);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "layer.0.weight"));
	ck_assert_int_eq(dsckpt_add_tensor(s, "bad", "F32", shape, 2, host, 63), DSCKPT_EINVAL);
	int64_t s128[1] = {128};
	ck_assert_int_eq(dsckpt_add_tensor(s, "past", "U8", s128, 1, host + h.size - 64, 128),
			 DSCKPT_EINVAL);
	int64_t s1[1] = {1000}, s2[1] = {2000}, s0[1] = {0};
	ck_assert_int_eq(dsckpt_add_tensor(s, "staged.a", "U8", s1, 1, heap, 1000), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "staged.b", "U8", s2, 1, heap + 1000, 2000), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "empty", "F32", s0, 1, NULL, 0), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "skeleton", blob, blen), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "skeleton", blob, 1), DSCKPT_EEXIST);
	ck_assert_int_eq(dsckpt_add_blob(s, "layer.0.weight", "x", 1), 0);
	ck_assert_int_eq(dsckpt_add_blob(s, "empty", NULL, 0), 0);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, 0), DSCKPT_ESTATE);

	double t0 = now_us();
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	double took = now_us() - t0;
	ck_assert_msg(took < 20000, "save_end took %.0f us", took);

	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_add_tensor(s, "late", "U8", s1, 1, heap, 1000), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_add_blob(s, "late", "x", 1), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_SNAPSHOT);
	ck_assert_int_eq(dsckpt_wait(s, 5, -1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_wait(s, -1, -1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_progress(s, &p), 0);
	ck_assert_int_eq(p.level, DSCKPT_SNAPSHOT);
	ck_assert_uint_eq(p.bytes_total, 100);
	ck_assert_uint_eq(p.bytes_snapshot, 60);
	ck_assert_uint_eq(p.bytes_flushed, 20);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/job/step1", 5000), 0);
	ck_assert_int_eq(dsckpt_commit(c, "relative", 5000), DSCKPT_EINVAL);
	dsckpt_save_free(s);
	dsckpt_close(c);

	char *log = fake_finish(&f);
	ck_assert_ptr_nonnull(strstr(log, "hello trainer job 0/2\n"));
	ck_assert_ptr_nonnull(strstr(log, "save_begin /ck/job/step1 rank0\n"));
	/* One host region (added once) and one staging arena, deleted by save_free. */
	ck_assert_int_eq(count(log, "region_add"), 2);
	snprintf(line, sizeof(line), "region_add %" PRIu64 " %" PRIu64 "\n", h.region, h.size);
	ck_assert_ptr_nonnull(strstr(log, line));
	ck_assert_ptr_nonnull(strstr(log, " 67108864\n"));
	ck_assert_int_eq(count(log, "region_del"), 1);
	snprintf(line, sizeof(line), "region_del %" PRIu64 "\n", h.region);
	ck_assert_ptr_null(strstr(log, line));
	/* The tensors travel in one frame, the 9 MiB blob in three pieces. */
	ck_assert_int_eq(count(log, "tensors=1003 blobs=0"), 1);
	ck_assert_int_eq(count(log, "blob skeleton len=4194304"), 2);
	ck_assert_int_eq(count(log, "blob skeleton len=1048576"), 1);
	ck_assert_int_eq(count(log, "blob empty len=0"), 1);
	for (int i = 0; i < NT; i += 111) {
		snprintf(line, sizeof(line), "tensor layer.%d.weight F32 ndim=2 region=%" PRIu64
			 " offset=%d nbytes=64 fnv=%016" PRIx64 "\n", i, h.region, i * 64,
			 fnv(host + i * 64, 64));
		ck_assert_msg(strstr(log, line), "missing %s", line);
	}
	snprintf(line, sizeof(line), "offset=0 nbytes=1000 fnv=%016" PRIx64 "\n",
		 fnv(heap, 1000));
	ck_assert_msg(strstr(log, line), "missing %s", line);
	snprintf(line, sizeof(line), "offset=4096 nbytes=2000 fnv=%016" PRIx64 "\n",
		 fnv(heap + 1000, 2000));
	ck_assert_msg(strstr(log, line), "missing %s", line);
	ck_assert_ptr_nonnull(strstr(log, "tensor empty F32 ndim=1"));
	ck_assert_ptr_nonnull(strstr(log, "wait 7 2 -1\n"));
	ck_assert_ptr_nonnull(strstr(log, "wait 7 0 0\n"));
	ck_assert_ptr_nonnull(strstr(log, "commit /ck/job/step1 2 5000\n"));
	free(log);
	dsckpt_host_free(host);
	free(heap);
	free(blob);
}
END_TEST

/* Freed host blocks are unregistered before the next SAVE_ADD, once. */
START_TEST(test_fake_region_del)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	int64_t shape[1] = {4096};
	uint8_t *a = dsckpt_host_alloc(4096), *b = dsckpt_host_alloc(4096);
	struct lib_hostref ha, hb;
	char line[64];

	ck_assert_int_eq(lib_host_find(a, 1, &ha), 1);
	ck_assert_int_eq(lib_host_find(b, 1, &hb), 1);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t1", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "a", "U8", shape, 1, a, 4096), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "b", "U8", shape, 1, b, 4096), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_host_free(a);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t2", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "b", "U8", shape, 1, b, 4096), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t3", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_close(c);
	dsckpt_host_free(b);

	char *log = fake_finish(&f);
	snprintf(line, sizeof(line), "region_del %" PRIu64 "\n", ha.region);
	char *del = strstr(log, line);
	ck_assert_ptr_nonnull(del);
	ck_assert_ptr_nonnull(strstr(del, "save_add"));
	ck_assert_ptr_null(strstr(del, "region_add"));   /* b stays registered */
	ck_assert_ptr_nonnull(strstr(log, "save_begin /ck/j/t2") < del ? del : NULL);
	ck_assert_int_eq(count(log, "region_del"), 1);
	ck_assert_int_eq(count(log, "region_add"), 2);
	free(log);
}
END_TEST

/* Tens of thousands of long-named tensors are split into frames under 16 MiB. */
START_TEST(test_fake_split)
{
	enum { NT = 40000 };
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	char name[PROTO_MAX_NAME + 1];
	int64_t shape[16];
	uint8_t *mem = dsckpt_host_alloc(NT);

	for (int i = 0; i < 16; i++)
		shape[i] = 1;
	memset(name, 'x', PROTO_MAX_NAME);
	name[PROTO_MAX_NAME] = 0;
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	for (int i = 0; i < NT; i++) {
		snprintf(name, sizeof(name), "%06d", i);
		name[6] = 'x';
		ck_assert_int_eq(dsckpt_add_tensor(s, name, "U8", shape, 16, mem + i, 1), 0);
	}
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	dsckpt_save_free(s);
	dsckpt_close(c);
	dsckpt_host_free(mem);

	char *log = fake_finish(&f);
	int frames = 0, total = 0;
	for (char *p = log; (p = strstr(p, "save_add len=")); p++) {
		unsigned len, nt, nb;
		ck_assert_int_eq(sscanf(p, "save_add len=%u tensors=%u blobs=%u", &len, &nt, &nb),
				 3);
		ck_assert_uint_lt(len, PROTO_MAX_BODY / 2);
		frames++;
		total += (int)nt;
	}
	ck_assert_int_ge(frames, 3);
	ck_assert_int_eq(total, NT);
	ck_assert_int_eq(count(log, "tensor "), NT);
	free(log);
}
END_TEST

/*
 * Without a CUDA driver (or in a process that never initialised CUDA) memory the library did
 * not allocate is host memory, wherever it lies: a device-looking mapping far from the heap
 * is staged, the stream is only stored, and SAVE_END carries no event.
 */
START_TEST(test_fake_no_gpu)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s, *s2;
	struct lib_gpu_ref g;
	size_t n = 1 << 20;
	int64_t shape[1] = {(int64_t)n};
	char line[160];
	uint8_t *far = mmap((void *)0x7f0000000000ull, n, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert(far != MAP_FAILED);
	for (size_t i = 0; i < n; i++)
		far[i] = (uint8_t)(i * 31 + 7);
	uint64_t sum = fnv(far, n);
	lib_conn_lock(c);
	ck_assert_int_eq(lib_cuda_place(c, far, n, -1, &g), 0);
	ck_assert_int_eq(lib_cuda_place(c, NULL, 0, 0, &g), 0);
	lib_conn_unlock(c);

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t1", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, (void *)0x1234), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "far", "U8", shape, 1, far, n), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, NULL), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_save_set_stream(s, NULL), DSCKPT_ESTATE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "already ended"));
	dsckpt_save_free(s);
	/* A save that failed refuses a stream too. */
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t2", "r0", &s2), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s2, "far", "U8", shape, 1, far, n), 0);
	dsckpt_close(c);
	ck_assert_int_eq(dsckpt_save_end(s2), DSCKPT_EPIPE);
	ck_assert_int_eq(dsckpt_save_set_stream(s2, NULL), DSCKPT_ESTATE);
	dsckpt_save_free(s2);
	munmap(far, n);

	char *log = fake_finish(&f);
	/* Each save staged the bytes in an arena of its own; only the first reached SAVE_END,
	 * without an event. */
	ck_assert_int_eq(count(log, "region_add"), 2);
	ck_assert_int_eq(count(log, "region_del"), 1);
	snprintf(line, sizeof(line), "offset=0 nbytes=%zu fnv=%016" PRIx64, n, sum);
	ck_assert_int_eq(count(log, line), 1);
	ck_assert_int_eq(count(log, "tensor far U8 ndim=1"), 1);
	ck_assert_int_eq(count(log, "save_end"), 1);
	ck_assert_ptr_nonnull(strstr(log, "save_end 7\n"));
	free(log);
}
END_TEST

/* Calls out of order are refused locally; names and paths are checked before sending. */
START_TEST(test_fake_state)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;

	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_identify(c, "", 0, 1), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 2, 2), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", -1, 2), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 65537), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_identify(c, "j", 1, 2), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 1, 2), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_save_begin(c, "rel/dir", "r0", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", ".hidden", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "a/b", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "", &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", NULL, &s), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_save_begin(c, NULL, "r0", &s), DSCKPT_EINVAL);
	ck_assert_ptr_null(s);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	/* The connection outlives dsckpt_close while a save holds it. */
	dsckpt_close(c);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EPIPE);
	ck_assert_int_eq(dsckpt_wait(s, DSCKPT_SNAPSHOT, -1), DSCKPT_ESTATE);
	dsckpt_save_free(s);
	char *log = fake_finish(&f);
	ck_assert_int_eq(count(log, "hello"), 1);
	ck_assert_int_eq(count(log, "save_begin"), 1);
	free(log);
}
END_TEST

/* dsckpt_add_tensors adds a batch as single calls would and stops at the first bad one. */
START_TEST(test_fake_add_tensors)
{
	struct fake f;
	dsckpt_conn_t *c = fake_connect(&f);
	dsckpt_save_t *s;
	uint8_t *host = dsckpt_host_alloc(4096);
	int64_t sh[2] = {4, 4}, bad[1] = {-1};
	dsckpt_tensor_t t[4] = {
		{"a", "F32", sh, 2, host, 64},
		{"b", "U8", sh, 2, host + 64, 16},
		{"c", "F32", bad, 1, host, 0},
		{"d", "F32", sh, 2, host, 64},
	};
	size_t added = 99;

	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/job/batch", "rank0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, NULL, 1, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 0, NULL), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 4, &added), DSCKPT_EINVAL);
	ck_assert_uint_eq(added, 2);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "tensor c"));
	ck_assert_int_eq(dsckpt_add_tensors(s, t, 1, &added), DSCKPT_EEXIST);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t + 3, 1, &added), 0);
	ck_assert_uint_eq(added, 1);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	ck_assert_int_eq(dsckpt_add_tensors(s, t + 3, 1, &added), DSCKPT_ESTATE);
	ck_assert_uint_eq(added, 0);
	ck_assert_int_eq(dsckpt_release_gpu(NULL), DSCKPT_EINVAL);
	ck_assert_int_eq(dsckpt_release_gpu(c), 0);  /* no GPU memory here: nothing to send */
	dsckpt_save_free(s);
	dsckpt_close(c);
	char *log = fake_finish(&f);
	ck_assert_int_eq(count(log, "tensors=3 blobs=0"), 1);
	ck_assert_ptr_nonnull(strstr(log, "tensor d F32 ndim=2"));
	ck_assert_ptr_null(strstr(log, "tensor c "));
	ck_assert_int_eq(count(log, "region_del"), 0);
	free(log);
	dsckpt_host_free(host);
}
END_TEST

/* An ERROR reply gives its code and message. */
START_TEST(test_fake_error_reply)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;

	fo.begin_error = 1;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/etc/x", "r0", &s), DSCKPT_EACCES);
	ck_assert_str_eq(dsckpt_last_error(c), "not under an allowed root");
	/* The connection goes on. */
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), 0);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* A version mismatch names both versions and ends the connection. */
START_TEST(test_fake_version)
{
	struct fake f;
	dsckpt_conn_t *c;

	fo.hello_version = 1;
	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EVERSION);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "protocol version mismatch: dsckptd "
				     "speaks protocol 9, this libdsckpt speaks protocol 1"));
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPIPE);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* A peer that hangs up: EPIPE now and for every later request. */
START_TEST(test_fake_hangup)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	int64_t shape[1] = {10};

	fo.close_on_end = 1;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_add_tensor(s, "t", "U8", shape, 1, "0123456789", 10), 0);
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_EPIPE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), f.path));
	ck_assert_int_eq(dsckpt_save_end(s), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_commit(c, "/ck/j/t", 0), DSCKPT_EPIPE);
	ck_assert_ptr_nonnull(strstr(dsckpt_last_error(c), "closed the connection"));
	dsckpt_save_free(s);
	dsckpt_close(c);
	char *log = fake_finish(&f);
	ck_assert_int_eq(count(log, "region_del"), 0);
	free(log);
}
END_TEST

/* A reply to the wrong request is a protocol error that ends the connection. */
START_TEST(test_fake_bad_id)
{
	struct fake f;
	dsckpt_conn_t *c;

	fo.bad_id = 1;
	fake_start(&f);
	ck_assert_int_eq(dsckpt_connect(f.path, &c), 0);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPROTO);
	ck_assert_int_eq(dsckpt_commit(c, "/x", 0), DSCKPT_ESTATE);
	ck_assert_int_eq(dsckpt_identify(c, "j", 0, 1), DSCKPT_EPIPE);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* WAIT: FAILED gives EFAILED with the reason; a lower level is a timeout. */
START_TEST(test_fake_wait)
{
	struct fake f;
	dsckpt_conn_t *c;
	dsckpt_save_t *s;
	dsckpt_progress_t p;

	fo.wait_level = _i == 0 ? DSCKPT_FAILED : DSCKPT_ACCEPTED;
	c = fake_connect(&f);
	ck_assert_int_eq(dsckpt_save_begin(c, "/ck/j/t", "r0", &s), 0);
	ck_assert_int_eq(dsckpt_save_end(s), 0);
	if (_i == 0) {
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_DURABLE, -1), DSCKPT_EFAILED);
		ck_assert_str_eq(dsckpt_last_error(c), "disk full");
		ck_assert_int_eq(dsckpt_save_progress(s, &p), 0);
		ck_assert_int_eq(p.level, DSCKPT_FAILED);
	} else {
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_DURABLE, 10), DSCKPT_ETIMEDOUT);
		ck_assert_int_eq(dsckpt_wait(s, DSCKPT_ACCEPTED, 10), DSCKPT_ACCEPTED);
	}
	dsckpt_save_free(s);
	dsckpt_close(c);
	free(fake_finish(&f));
}
END_TEST

/* The suite. */
static Suite *client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *tc = tcase_create("local");
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_levels);
	tcase_add_test(tc, test_host_alloc);
	tcase_add_test(tc, test_connect_errors);
	tcase_add_test(tc, test_tensor_check);
	tcase_add_test(tc, test_null_handles);
	suite_add_tcase(s, tc);
	tc = tcase_create("fake-peer");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_fake_save);
	tcase_add_test(tc, test_fake_region_del);
	tcase_add_test(tc, test_fake_split);
	tcase_add_test(tc, test_fake_state);
	tcase_add_test(tc, test_fake_add_tensors);
	tcase_add_test(tc, test_fake_error_reply);
	tcase_add_test(tc, test_fake_version);
	tcase_add_test(tc, test_fake_hangup);
	tcase_add_test(tc, test_fake_bad_id);
	tcase_add_test(tc, test_fake_no_gpu);
	tcase_add_loop_test(tc, test_fake_wait, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

/* Runs the suite. */
int main(void)
{
	SRunner *sr = srunner_create(client_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
