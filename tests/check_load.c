/*
 * check_load.c — restores, end to end on a real daemon: files saved through libdsckpt are
 * loaded back into host memory (memfd regions) with the LOAD messages a trainer's library
 * sends; every destination byte is compared. Mismatched names, dtypes and shapes, a flipped
 * byte, a truncated file, a client that dies mid-restore, a file larger than the cache, a
 * restore beside saves in flight, and which source (cache or file) the daemon chooses.
 * Tensors over many pieces and units (restore.c: at most 4 pieces a unit, fewer toward the
 * end), a flipped byte at each kind of place in them, and restores that have one or two
 * chunks of cache to go on.
 */
#include "harness_frames.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A tensor of the test files: U8 or F32 with one or two dimensions. */
struct spec {
	const char *name, *dtype;
	uint64_t shape[2];
	unsigned ndim;
};

/* Bytes of a spec'd tensor. */
static size_t spec_bytes(const struct spec *t)
{
	size_t n = strcmp(t->dtype, "F32") == 0 ? 4 : strcmp(t->dtype, "BF16") == 0 ? 2 : 1;
	for (unsigned i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

/* Three tensors over several 1 MiB chunks, one smaller than a chunk in between. */
static const struct spec three[] = {
	{"a", "F32", {768, 1024}, 2},    /* 3 MiB */
	{"b", "U8", {1000}, 1},
	{"c", "U8", {5 << 20}, 1},       /* 5 MiB */
};
#define NTHREE 3

/* Saves tensors t[0..n) (tensor i: seed+i's pattern) into dir/file and waits DURABLE. */
static void save_spec(dsckpt_conn_t *c, const char *dir, const char *file,
		      const struct spec *t, size_t n, uint64_t seed)
{
	dsckpt_save_t *s;
	void *mem[16];

	CK_DS(c, dsckpt_save_begin(c, dir, file, &s));
	for (size_t i = 0; i < n; i++) {
		int64_t shape[2] = {(int64_t)t[i].shape[0], (int64_t)t[i].shape[1]};
		mem[i] = dsckpt_host_alloc(spec_bytes(&t[i]));
		ck_assert_ptr_nonnull(mem[i]);
		h_pattern_fill(mem[i], spec_bytes(&t[i]), seed + i);
		CK_DS(c, dsckpt_add_tensor(s, t[i].name, t[i].dtype, shape, (int)t[i].ndim,
					   mem[i], spec_bytes(&t[i])));
	}
	CK_DS(c, dsckpt_save_end(s));
	wait_level(c, s, DSCKPT_DURABLE, 60000);
	dsckpt_save_free(s);
	for (size_t i = 0; i < n; i++)
		dsckpt_host_free(mem[i]);
}

/* A host region for destinations: a sealable memfd of size bytes mapped here, registered
 * as region 1 on a raw connection that said HELLO. */
struct dst {
	int fd, mfd;
	uint8_t *p;
	size_t size;
};

/* Opens a connection with a destination region of size bytes filled with 0xee. */
static void dst_open(struct dst *d, size_t size)
{
	struct res res;

	d->fd = raw_connect();
	raw_hello(d->fd);
	d->size = size;
	d->mfd = memfd_create("dst", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(d->mfd, 0);
	ck_assert_int_eq(ftruncate(d->mfd, (off_t)size), 0);
	d->p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, d->mfd, 0);
	ck_assert(d->p != MAP_FAILED);
	memset(d->p, 0xee, size);
	ck_assert_int_eq(r_region(d->fd, 1, d->mfd, size, &res), 0);
}

/* Closes what dst_open opened. */
static void dst_close(struct dst *d)
{
	munmap(d->p, d->size);
	close(d->mfd);
	close(d->fd);
}

/* LOAD_BEGIN: the load id (source into src, 16 bytes) or the ERROR's code (msg kept). */
static int64_t load_begin(int fd, const char *dir, const char *file, char *src, char *msg)
{
	struct proto_out o;
	struct reply r;
	uint64_t id = 0;
	int64_t code = 0;

	out_map(&o, PROTO_LOAD_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", dir);
	proto_kv_str(&o.pk, "file", file);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	int type = raw_recv(fd, &r, 10000);
	ck_assert_int_ge(type, 0);
	if (type == PROTO_ERROR) {
		proto_get_i64(&r.m, "code", INT32_MIN, -1, &code, 1);
		if (msg)
			proto_get_str(&r.m, "message", msg, 4000, 1);
		reply_free(&r);
		return code;
	}
	proto_get_u64(&r.m, "load", UINT64_MAX, &id, 1);
	proto_get_str(&r.m, "source", src ? src : (char[16]){0}, 15, 1);
	reply_free(&r);
	return (int64_t)id;
}

/* Packs one destination entry: spec t at offset off of region 1 (dtype/shape overridable). */
static void pack_dst(msgpack_packer *pk, const char *name, const char *dtype,
		     const uint64_t *shape, unsigned ndim, uint64_t off, uint64_t nbytes)
{
	proto_pack_tensor(pk, name, dtype, shape, ndim, 1, off, nbytes);
}

/* LOAD_END of load with t[0..n) placed one after another from byte 0 of region 1:
 * 0 (ACCEPTED) or the ERROR's code with its message in msg. */
static int load_end(int fd, int64_t load, const struct spec *t, size_t n, char *msg)
{
	struct proto_out o;
	struct reply r;
	int64_t code = 0;
	uint64_t off = 0;

	out_map(&o, PROTO_LOAD_END, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		uint64_t nb = spec_bytes(&t[i]);
		pack_dst(&o.pk, t[i].name, t[i].dtype, t[i].shape, t[i].ndim, off, nb);
		off += nb;
	}
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	int type = raw_recv(fd, &r, 10000);
	ck_assert_int_ge(type, 0);
	if (type == PROTO_ERROR) {
		proto_get_i64(&r.m, "code", INT32_MIN, -1, &code, 1);
		proto_get_str(&r.m, "message", msg, 4000, 1);
	}
	reply_free(&r);
	return (int)code;
}

/* LOAD_WAIT: the level reached, with the failure's code and message when FAILED. */
static int load_wait(int fd, int64_t load, int timeout_ms, int *code, char *msg)
{
	struct proto_out o;
	struct reply r;
	int64_t level = 0, c = 0;

	out_map(&o, PROTO_LOAD_WAIT, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)load);
	proto_kv_i64(&o.pk, "timeout_ms", timeout_ms);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_int_eq(raw_recv(fd, &r, timeout_ms < 0 ? 120000 : timeout_ms + 10000),
			 PROTO_REPLY);
	ck_assert_int_eq(proto_get_i64(&r.m, "level", -1, 2, &level, 1), 1);
	if (level == -1) {
		proto_get_i64(&r.m, "code", INT32_MIN, -1, &c, 1);
		proto_get_str(&r.m, "error", msg, 4000, 1);
	}
	if (code)
		*code = (int)c;
	reply_free(&r);
	return (int)level;
}

/* Checks that region bytes of t[0..n), placed one after another, hold seed+i's patterns. */
static void check_dst(const struct dst *d, const struct spec *t, size_t n, uint64_t seed)
{
	size_t off = 0;

	for (size_t i = 0; i < n; i++) {
		size_t nb = spec_bytes(&t[i]);
		size_t at = h_pattern_diff(d->p + off, nb, seed + i);
		ck_assert_msg(at == nb, "tensor %s differs at byte %zu", t[i].name, at);
		off += nb;
	}
}

/* Loads dir/file's t[0..n) into a fresh region; returns the source the daemon chose. */
static const char *load_all(const char *dir, const char *file, const struct spec *t, size_t n,
			    uint64_t seed)
{
	static char src[16];
	char msg[4096] = "";
	struct dst d;
	size_t total = 0;

	for (size_t i = 0; i < n; i++)
		total += spec_bytes(&t[i]);
	dst_open(&d, total);
	int64_t id = load_begin(d.fd, dir, file, src, msg);
	ck_assert_msg(id > 0, "LOAD_BEGIN: %s", msg);
	ck_assert_msg(load_end(d.fd, id, t, n, msg) == 0, "LOAD_END: %s", msg);
	ck_assert_msg(load_wait(d.fd, id, -1, NULL, msg) == 2, "LOAD_WAIT: %s", msg);
	check_dst(&d, t, n, seed);
	dst_close(&d);
	return src;
}

/* Every tensor back from the file (nothing resident), bytes exact. */
START_TEST(test_load_file)
{
	d_start(CACHE_32M, CHUNK_1M "\"keep_resident\": false,");
	const char *dir = h_path("%s/lf/step1", D->root);
	dsckpt_conn_t *c = conn_open("lf", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 100);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_close(c);
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 100), "file");
	/* Twice: the second read finds the pages cached (the buffered path). */
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 100), "file");
	check_alive();
	d_stop();
}
END_TEST

/* One tensor named: only its bytes are written, the rest of the region is untouched. */
START_TEST(test_load_subset)
{
	d_start(CACHE_32M, CHUNK_1M "\"keep_resident\": false,");
	const char *dir = h_path("%s/ls/step1", D->root);
	dsckpt_conn_t *c = conn_open("ls", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 7);
	dsckpt_close(c);
	struct dst d;
	char msg[4096] = "";
	dst_open(&d, 4096 + 1000);
	int64_t id = load_begin(d.fd, dir, "rank0", NULL, msg);
	ck_assert_msg(id > 0, "%s", msg);
	struct proto_out o;
	out_map(&o, PROTO_LOAD_END, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)id);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_dst(&o.pk, "b", "U8", three[1].shape, 1, 4096, 1000);
	ck_assert_int_eq(raw_send(d.fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(d.fd, "level");
	ck_assert_int_eq(load_wait(d.fd, id, -1, NULL, msg), 2);
	ck_assert(h_all_bytes(d.p, 4096, 0xee));
	ck_assert_uint_eq(h_pattern_diff(d.p + 4096, 1000, 8), 1000);
	dst_close(&d);
	d_stop();
}
END_TEST

/* A missing name, a wrong dtype, a wrong shape and a name given twice: one EINVAL naming all
 * four, nothing written; the same connection then loads correctly. */
START_TEST(test_load_mismatch)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/lm/step1", D->root);
	dsckpt_conn_t *c = conn_open("lm", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 1);
	dsckpt_close(c);
	const struct spec bad[] = {
		{"nope", "U8", {16}, 1},
		{"a", "BF16", {768, 2048}, 2},
		{"c", "U8", {1 << 20, 5}, 2},
		{"b", "U8", {1000}, 1},
		{"b", "U8", {1000}, 1},
	};
	struct dst d;
	char msg[4096] = "";
	size_t total = 0;
	for (size_t i = 0; i < 5; i++)
		total += spec_bytes(&bad[i]);
	dst_open(&d, total);
	int64_t id = load_begin(d.fd, dir, "rank0", NULL, msg);
	ck_assert_msg(id > 0, "%s", msg);
	ck_assert_int_eq(load_end(d.fd, id, bad, 5, msg), DSCKPT_EINVAL);
	ck_assert_msg(strstr(msg, "4 tensors do not match") && strstr(msg, "'nope': not in the file") &&
		      strstr(msg, "'a': dtype BF16 given, F32 in the file") &&
		      strstr(msg, "'c': shape [1048576, 5] given, [5242880] in the file") &&
		      strstr(msg, "'b': named twice"), "message: %s", msg);
	ck_assert(h_all_bytes(d.p, d.size, 0xee));
	/* The load is gone; the connection goes on. */
	int code = 0;
	struct proto_out o;
	out_map(&o, PROTO_LOAD_WAIT, 2);
	proto_kv_u64(&o.pk, "load", (uint64_t)id);
	proto_kv_i64(&o.pk, "timeout_ms", 0);
	ck_assert_int_eq(raw_send(d.fd, &o, 0, NULL, 0), 0);
	ck_assert_int_eq(raw_expect_error(d.fd), DSCKPT_ENOENT);
	dst_close(&d);
	(void)code;
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 1), "cache");
	d_stop();
}
END_TEST

/* Flips one byte of a file's byte at data offset at; returns the file's path. */
static const char *flip_byte(const char *dir, const char *file, uint64_t at)
{
	const char *path = h_path("%s/%s.safetensors", dir, file);
	int fd = open(path, O_RDWR);
	uint64_t hlen;
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &hlen, 8, 0), 8);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)(8 + hlen + at)), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(8 + hlen + at)), 1);
	close(fd);
	return path;
}

/* A flipped byte in tensor c (from the disk, nothing resident): FAILED with ECHECKSUM naming
 * the tensor and the file; the other tensors' checks passed. */
START_TEST(test_load_corrupt)
{
	d_start(CACHE_32M, CHUNK_1M "\"keep_resident\": false,");
	const char *dir = h_path("%s/lc/step1", D->root);
	dsckpt_conn_t *c = conn_open("lc", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 5);
	dsckpt_close(c);
	flip_byte(dir, "rank0", (3 << 20) + 1000 + 4321);
	struct dst d;
	char msg[4096] = "";
	int code = 0;
	dst_open(&d, (3 << 20) + 1000 + (5 << 20));
	int64_t id = load_begin(d.fd, dir, "rank0", NULL, msg);
	ck_assert_msg(id > 0, "%s", msg);
	ck_assert_int_eq(load_end(d.fd, id, three, NTHREE, msg), 0);
	ck_assert_int_eq(load_wait(d.fd, id, -1, &code, msg), -1);
	ck_assert_int_eq(code, DSCKPT_ECHECKSUM);
	ck_assert_msg(strstr(msg, "tensor 'c'") && strstr(msg, "rank0.safetensors"), "%s", msg);
	dst_close(&d);
	check_alive();
	d_stop();
}
END_TEST

/* A truncated file and a file that is not safetensors: EINVAL at LOAD_BEGIN, saying why. */
START_TEST(test_load_truncated)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/lt/step1", D->root);
	dsckpt_conn_t *c = conn_open("lt", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 9);
	dsckpt_close(c);
	ck_assert_int_eq(truncate(h_path("%s/rank0.safetensors", dir), 8192 + (1 << 20)), 0);
	ck_assert_int_eq(h_system("printf 'not a checkpoint' > %s/junk.safetensors", dir), 0);
	int fd = raw_connect();
	raw_hello(fd);
	char msg[4096] = "";
	ck_assert_int_eq(load_begin(fd, dir, "rank0", NULL, msg), DSCKPT_EINVAL);
	ck_assert_msg(strstr(msg, "truncated"), "%s", msg);
	ck_assert_int_eq(load_begin(fd, dir, "junk", NULL, msg), DSCKPT_EINVAL);
	ck_assert_msg(strstr(msg, "not a safetensors file"), "%s", msg);
	ck_assert_int_eq(load_begin(fd, dir, "absent", NULL, msg), DSCKPT_ENOENT);
	ck_assert_int_eq(load_begin(fd, dir, "../x", NULL, msg), DSCKPT_EINVAL);
	ck_assert_int_eq(load_begin(fd, h_path("%s/../lt/step1", D->root), "rank0", NULL, msg),
			 DSCKPT_EINVAL);
	close(fd);
	check_alive();
	d_stop();
}
END_TEST

/* Clients that go away after LOAD_END of a 48 MiB file (16 chunks of cache), at once and a
 * little later: the daemon cancels, serves others, and ends cleanly. */
START_TEST(test_load_client_dies)
{
	d_start(CACHE_16M, CHUNK_1M "\"keep_resident\": false,");
	const char *dir = h_path("%s/ld/step1", D->root);
	const struct spec big[] = {{"w", "U8", {48 << 20}, 1}};
	dsckpt_conn_t *c = conn_open("ld", 0, 1);
	save_spec(c, dir, "rank0", big, 1, 3);
	dsckpt_close(c);
	for (int i = 0; i < 6; i++) {
		struct dst d;
		char msg[4096] = "";
		dst_open(&d, 48 << 20);
		int64_t id = load_begin(d.fd, dir, "rank0", NULL, msg);
		ck_assert_msg(id > 0, "%s", msg);
		ck_assert_int_eq(load_end(d.fd, id, big, 1, msg), 0);
		h_sleep_ms(i * 3);
		dst_close(&d);
	}
	check_alive();
	ck_assert_str_eq(load_all(dir, "rank0", big, 1, 3), "file");
	d_stop();
}
END_TEST

/* A 40 MiB file through an 8 MiB cache (it streams through), with a save of 24 MiB going on
 * at the same time on another connection: both whole. */
START_TEST(test_load_beside_saves)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir = h_path("%s/lb/step1", D->root);
	const char *dir2 = h_path("%s/lb/step2", D->root);
	const struct spec big[] = {{"x", "U8", {24 << 20}, 1}, {"y", "F32", {4 << 20}, 1}};
	dsckpt_conn_t *c = conn_open("lb", 0, 1);
	save_spec(c, dir, "rank0", big, 2, 11);
	void *mem;
	dsckpt_save_t *s = save_pattern(c, dir2, "rank0", 24 << 20, 77, &mem);
	ck_assert_str_eq(load_all(dir, "rank0", big, 2, 11), "file");
	wait_level(c, s, DSCKPT_DURABLE, 60000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	check_pattern_file(dir2, "rank0", 24 << 20, 77);
	dsckpt_close(c);
	d_stop();
}
END_TEST

/* The daemon keeps a file just saved in its cache: the load comes from there ("cache");
 * after a restart the same load reads the file. */
START_TEST(test_load_hot_then_file)
{
	d_start(CACHE_32M, CHUNK_1M);
	const char *dir = h_path("%s/lh/step1", D->root);
	dsckpt_conn_t *c = conn_open("lh", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 21);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_close(c);
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 21), "cache");
	d_kill(SIGTERM);
	d_restart(0);
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 21), "file");
	d_stop();
}
END_TEST

/* A save that needs the room evicts the resident file: the next load of it reads the file,
 * while the save's own file comes from the cache. */
START_TEST(test_load_evicted)
{
	d_start(CACHE_16M, CHUNK_1M);
	const char *dir = h_path("%s/le/step1", D->root);
	const char *dir2 = h_path("%s/le/step2", D->root);
	dsckpt_conn_t *c = conn_open("le", 0, 1);
	save_spec(c, dir, "rank0", three, NTHREE, 31);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	const struct spec big[] = {{"z", "U8", {14 << 20}, 1}};
	save_spec(c, dir2, "rank0", big, 1, 41);
	dsckpt_close(c);
	ck_assert_str_eq(load_all(dir2, "rank0", big, 1, 41), "cache");
	ck_assert_str_eq(load_all(dir, "rank0", three, NTHREE, 31), "file");
	d_stop();
}
END_TEST

/* Tensors of odd sizes across many 1 MiB pieces, six restore threads, three loads at once
 * and a fourth of a file with one flipped byte: every part is hashed in order whichever
 * thread reads its piece first, the good loads are exact, the bad one names its tensor, and
 * every chunk goes back (the daemon's exit checks the cache). */
START_TEST(test_load_parallel)
{
	d_start(CACHE_16M, CHUNK_1M "\"restore_threads\": 6, \"keep_resident\": false,");
	const char *dir = h_path("%s/lp/step1", D->root);
	struct spec t[12];
	char names[12][8];
	for (int i = 0; i < 12; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (struct spec){names[i], "U8", {(uint64_t)(300000 + 217000 * i)}, 1};
	}
	dsckpt_conn_t *c = conn_open("lp", 0, 1);
	for (int f = 0; f < 4; f++)
		save_spec(c, dir, h_path("rank%d", f), t, 12, 1000 * (uint64_t)f);
	dsckpt_close(c);
	flip_byte(dir, "rank3", 300000 + 217000 + 5);	/* in t1, of the fourth file */
	struct dst d[4];
	int64_t id[4];
	char msg[4096];
	size_t total = 0;
	for (int i = 0; i < 12; i++)
		total += spec_bytes(&t[i]);
	for (int f = 0; f < 4; f++) {
		dst_open(&d[f], total);
		id[f] = load_begin(d[f].fd, dir, h_path("rank%d", f), NULL, msg);
		ck_assert_msg(id[f] > 0, "%s", msg);
		ck_assert_int_eq(load_end(d[f].fd, id[f], t, 12, msg), 0);
	}
	for (int f = 0; f < 4; f++) {
		int code = 0;
		int level = load_wait(d[f].fd, id[f], -1, &code, msg);
		if (f < 3) {
			ck_assert_msg(level == 2, "load %d: %s", f, msg);
			check_dst(&d[f], t, 12, 1000 * (uint64_t)f);
		} else {
			ck_assert_int_eq(level, -1);
			ck_assert_int_eq(code, DSCKPT_ECHECKSUM);
			ck_assert_msg(strstr(msg, "tensor 't1'"), "%s", msg);
		}
		dst_close(&d[f]);
	}
	d_stop();
}
END_TEST

/* Over 1 MiB pieces, with six threads (restore.c: a unit started with r pieces left is at
 * most r / 6 pieces long): h in piece 0; L over pieces 0 to 11 (units 0-2, 3-4, 5-6, 7-8,
 * then one piece each: the cap cutting it at every boundary from 3 on); m crossing from piece
 * 11 into 12 (a new unit: the cap); n over pieces 12 to 15 and t over 15 to 18, a piece each:
 * 19 pieces in 14 units. */
static const struct spec units[] = {
	{"h", "U8", {500000}, 1},
	{"L", "U8", {(11 << 20) + 12345}, 1},
	{"m", "F32", {300, 1000}, 2},
	{"s", "U8", {4096}, 1},
	{"n", "U8", {3 << 20}, 1},
	{"t", "BF16", {1000, 1250}, 2},
};
#define NUNITS 6
#define L_AT 500000ULL  /* data offset of L */

/* A file of tensors over 19 pieces and 14 units, loaded from the file twice (the second time
 * from the page cache) by six threads through an 8-chunk cache: every byte exact. */
START_TEST(test_load_units)
{
	d_start(CACHE_8M, CHUNK_1M "\"restore_threads\": 6, \"keep_resident\": false,");
	const char *dir = h_path("%s/lu/step1", D->root);
	dsckpt_conn_t *c = conn_open("lu", 0, 1);
	save_spec(c, dir, "rank0", units, NUNITS, 300);
	dsckpt_close(c);
	ck_assert_str_eq(load_all(dir, "rank0", units, NUNITS, 300), "file");
	ck_assert_str_eq(load_all(dir, "rank0", units, NUNITS, 300), "file");
	d_stop();
}
END_TEST

/* The line of the daemon's log (debug) that starts with head, copied (freed by the caller);
 * fails the test when there is none. */
static char *log_line(const char *head)
{
	char *log = h_read_file(D->log, NULL);

	ck_assert_ptr_nonnull(log);
	char *at = strstr(log, head);
	ck_assert_msg(at, "no line '%s…' in the daemon's log", head);
	char *line = strndup(at, strcspn(at, "\n"));
	free(log);
	return line;
}

/* At log_level debug each restore ends with a line saying where its time went (issue 34: a
 * first load after the daemon's start told from the later ones, phase by phase), numbered
 * from the daemon's start: the 19 pieces in 14 units over six threads, twice. */
START_TEST(test_load_timing_line)
{
	d_start(CACHE_8M, CHUNK_1M "\"restore_threads\": 6, \"keep_resident\": false,");
	const char *dir = h_path("%s/lt/step1", D->root);
	dsckpt_conn_t *c = conn_open("lt", 0, 1);
	save_spec(c, dir, "rank0", units, NUNITS, 300);
	dsckpt_close(c);
	for (int k = 1; k <= 2; k++) {
		ck_assert_str_eq(load_all(dir, "rank0", units, NUNITS, 300), "file");
		char *line = log_line(h_path("restore %d of %s/rank0.safetensors: ", k, dir));
		ck_assert_msg(strstr(line, " GB in 14 units (first claimed after ") &&
			      strstr(line, "over 6 threads: chunk waits ") &&
			      strstr(line, " GB with O_DIRECT), copies queued and hashed ") &&
			      strstr(line, " ms, device checksums 0.0 ms; slowest piece ") &&
			      strstr(line, " of 19)"), "%s", line);
		free(line);
	}
	d_stop();
}
END_TEST

/* The same file from the daemon's resident copy (piece after piece in each unit): exact. */
START_TEST(test_load_units_hot)
{
	d_start(CACHE_32M, CHUNK_1M "\"restore_threads\": 6,");
	const char *dir = h_path("%s/lu/step2", D->root);
	dsckpt_conn_t *c = conn_open("lu", 0, 1);
	save_spec(c, dir, "rank0", units, NUNITS, 400);
	CK_DS(c, dsckpt_commit(c, dir, 30000));
	dsckpt_close(c);
	ck_assert_str_eq(load_all(dir, "rank0", units, NUNITS, 400), "cache");
	d_stop();
}
END_TEST

/* One flipped byte per file: in L's first part, in its first part past the first unit (left
 * for later when that unit is not hashed yet), in a unit's second piece, in a unit of one
 * piece near the end, in m's part past a cap, and in L's last byte: each load FAILED with
 * ECHECKSUM naming that tensor. */
START_TEST(test_load_units_corrupt)
{
	static const struct { uint64_t at; const char *name; } flips[] = {
		{L_AT + 5, "L"},
		{(3 << 20) + 10, "L"},
		{(6 << 20) + 777, "L"},
		{(9 << 20) + 777, "L"},
		{(12 << 20) + 100, "m"},
		{L_AT + (11 << 20) + 12344, "L"},
	};
	enum { NFLIPS = sizeof(flips) / sizeof(flips[0]) };
	d_start(CACHE_8M, CHUNK_1M "\"restore_threads\": 6, \"keep_resident\": false,");
	char dir[512];	/* h_path's buffers are reused by the calls below */
	snprintf(dir, sizeof(dir), "%s/luc/step1", D->root);
	dsckpt_conn_t *c = conn_open("luc", 0, 1);
	for (int f = 0; f < NFLIPS; f++)
		save_spec(c, dir, h_path("rank%d", f), units, NUNITS, 500);
	dsckpt_close(c);
	for (int f = 0; f < NFLIPS; f++) {
		flip_byte(dir, h_path("rank%d", f), flips[f].at);
		for (int pass = 0; pass < 2; pass++) {	/* from the disk, then the page cache */
			struct dst d;
			char msg[4096] = "";
			int code = 0;
			size_t total = 0;
			for (size_t i = 0; i < NUNITS; i++)
				total += spec_bytes(&units[i]);
			dst_open(&d, total);
			int64_t id = load_begin(d.fd, dir, h_path("rank%d", f), NULL, msg);
			ck_assert_msg(id > 0, "%s", msg);
			ck_assert_int_eq(load_end(d.fd, id, units, NUNITS, msg), 0);
			ck_assert_int_eq(load_wait(d.fd, id, -1, &code, msg), -1);
			ck_assert_int_eq(code, DSCKPT_ECHECKSUM);
			ck_assert_msg(strstr(msg, h_path("tensor '%s'", flips[f].name)), "flip %d: %s",
				      f, msg);
			dst_close(&d);
		}
	}
	check_alive();
	d_stop();	/* the daemon's exit checks that every chunk came back */
}
END_TEST

/* Six restore threads with one, then two, free chunks: a 4-chunk cache (the least there is)
 * with a resident file of 3, then 2, pieces pinned by a load begun and left open. The units
 * file still loads whole, its units waiting for their own chunk. */
START_TEST(test_load_few_chunks)
{
	d_start(0.00390625, CHUNK_1M "\"restore_threads\": 6,");
	char dir[512];	/* h_path's buffers are reused by the calls below */
	snprintf(dir, sizeof(dir), "%s/lfc/step1", D->root);
	dsckpt_conn_t *c = conn_open("lfc", 0, 1);
	save_spec(c, dir, "rank0", units, NUNITS, 600);
	CK_DS(c, dsckpt_commit(c, dir, 30000));	/* kept across the restarts */
	dsckpt_close(c);
	for (unsigned pinned = 3; pinned >= 2; pinned--) {
		d_kill(SIGTERM);
		d_restart(0);	/* nothing resident */
		const struct spec pin[] = {{"p", "U8", {(uint64_t)pinned << 20}, 1}};
		const char *pdir = h_path("%s/lfc/pin%u", D->root, pinned);
		c = conn_open("lfc", 0, 1);
		save_spec(c, pdir, "rank0", pin, 1, 700);
		dsckpt_close(c);
		char src[16] = "", msg[4096] = "";
		int fd = raw_connect();
		raw_hello(fd);
		int64_t id = load_begin(fd, pdir, "rank0", src, msg);
		ck_assert_msg(id > 0, "%s", msg);
		ck_assert_str_eq(src, "cache");	/* its pieces held: 4 - pinned chunks left */
		ck_assert_str_eq(load_all(dir, "rank0", units, NUNITS, 600), "file");
		close(fd);
	}
	check_alive();
	d_stop();
}
END_TEST

/* The suite. */
static Suite *load_suite(void)
{
	Suite *s = suite_create("load");
	h_add_case(s, "file", test_load_file, 60, 1);
	h_add_case(s, "subset", test_load_subset, 60, 1);
	h_add_case(s, "mismatch", test_load_mismatch, 60, 1);
	h_add_case(s, "corrupt", test_load_corrupt, 60, 1);
	h_add_case(s, "truncated", test_load_truncated, 60, 1);
	h_add_case(s, "client_dies", test_load_client_dies, 120, 1);
	h_add_case(s, "beside_saves", test_load_beside_saves, 120, 1);
	h_add_case(s, "hot_then_file", test_load_hot_then_file, 60, 1);
	h_add_case(s, "evicted", test_load_evicted, 60, 1);
	h_add_case(s, "parallel", test_load_parallel, 120, 3);
	h_add_case(s, "units", test_load_units, 120, 1);
	h_add_case(s, "units_hot", test_load_units_hot, 60, 1);
	h_add_case(s, "timing_line", test_load_timing_line, 120, 1);
	h_add_case(s, "units_corrupt", test_load_units_corrupt, 120, 1);
	h_add_case(s, "few_chunks", test_load_few_chunks, 120, 3);
	return s;
}

CHECK_MAIN(load_suite)
