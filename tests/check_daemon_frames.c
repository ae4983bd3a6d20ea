/*
 * check_daemon_frames.c — malformed frames, the way an attacker sends them (raw, built with
 * proto.h): bad headers, bodies and keys, descriptors that lie, tensors past their region,
 * another connection's save. Each is answered or cut off, and a new connection is served.
 */
#include "harness_frames.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- raw exchanges of these tests ---- */

/* Fails the test unless the daemon closes fd within five seconds (reading what comes). */
static void raw_expect_closed(int fd)
{
	char buf[4096];
	for (int i = 0; i < 100; i++) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return;
	}
	ck_abort_msg("%s: the daemon kept the connection open", raw_step);
}

/* Expects one ERROR with code want (or want2), then the connection closed. */
static void raw_expect_fatal(int fd, int want, int want2)
{
	int code = raw_expect_error(fd);
	ck_assert_msg(code == want || code == want2, "%s: ERROR code %s, want %s", raw_step,
		      dsckpt_err_name(code), dsckpt_err_name(want));
	raw_expect_closed(fd);
}
/* A trainer connection with region 1 and an open save; returns the fd, save id in *save. */
static int raw_trainer_save(uint64_t *save)
{
	struct proto_out o;
	int fd = raw_connect();

	raw_hello(fd);
	raw_region(fd, 1);
	out_map(&o, PROTO_SAVE_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", h_path("%s/raw/t1", D->root));
	proto_kv_str(&o.pk, "file", h_path("f%llu", (unsigned long long)raw_next_id));
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	*save = raw_expect_reply(fd, "save");
	return fd;
}

/* Packs one tensor entry [name, dtype, [dim], region 1, offset, nbytes]. */
static void pack_tensor(msgpack_packer *pk, const char *name, const char *dtype, uint64_t dim,
			uint64_t offset, uint64_t nbytes)
{
	proto_pack_tensor(pk, name, dtype, &dim, 1, 1, offset, nbytes);
}

/* Sends SAVE_ADD of one tensor to save on fd and expects an ERROR (code returned). */
static int raw_add_bad(int fd, uint64_t save, const char *dtype, uint64_t dim, uint64_t offset,
		       uint64_t nbytes)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", dtype, dim, offset, nbytes);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	return raw_expect_error(fd);
}

/* ---- tests: malformed frames, each followed by a new connection that must work ---- */

/* Header with a bad magic. */
static void bad_magic(void)
{
	struct proto_hdr h = {.magic = 0x12345678, .version = PROTO_VERSION, .type = PROTO_HELLO};
	uint8_t b[PROTO_HDR_SIZE];
	int fd = raw_connect();
	proto_hdr_pack(&h, b);
	ck_assert_int_eq(proto_send(fd, b, sizeof(b), NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A header announcing a body over 16 MiB; the body never comes, the answer must. */
static void too_long(void)
{
	struct proto_hdr h = {.magic = PROTO_MAGIC, .version = PROTO_VERSION,
			      .type = PROTO_HELLO, .length = PROTO_MAX_BODY + 1, .id = 1};
	uint8_t b[PROTO_HDR_SIZE];
	int fd = raw_connect();
	proto_hdr_pack(&h, b);
	ck_assert_int_eq(proto_send(fd, b, sizeof(b), NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EMSGSIZE, DSCKPT_EPROTO);
	close(fd);
}

/* A body cut short, then the client goes away (first frame, and after HELLO). */
static void truncated(void)
{
	for (int i = 0; i < 2; i++) {
		struct proto_out o;
		int fd = raw_connect();
		if (i)
			raw_hello(fd);
		out_map(&o, i ? PROTO_STATUS : PROTO_HELLO, 0);
		for (int k = 0; k < 100; k++)
			msgpack_pack_nil(&o.pk);
		size_t n = proto_out_finish(&o, 0);
		ck_assert_int_eq(proto_send(fd, o.sb.data, n - 50, NULL, 0), 0);
		proto_out_free(&o);
		h_sleep_ms(50);
		close(fd);
	}
}

/* HELLO from a client of another protocol version: EVERSION with both versions. */
static void wrong_version(void)
{
	struct proto_out o;
	struct reply r;
	int64_t code;
	uint64_t sv, cv;
	int fd = raw_connect();

	out_map(&o, PROTO_HELLO, 2);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", 1);
	size_t n = proto_out_finish(&o, 0);
	((uint8_t *)o.sb.data)[4] = 99;
	((uint8_t *)o.sb.data)[5] = 0;
	ck_assert_int_eq(proto_send(fd, o.sb.data, n, NULL, 0), 0);
	proto_out_free(&o);
	ck_assert_int_eq(raw_recv(fd, &r, 5000), PROTO_ERROR);
	ck_assert_msg(proto_get_i64(&r.m, "code", INT32_MIN, 0, &code, 1) == 1 &&
			      proto_get_u64(&r.m, "server_proto", 65535, &sv, 1) == 1 &&
			      proto_get_u64(&r.m, "client_proto", 65535, &cv, 1) == 1,
		      "EVERSION reply: %s", r.m.why);
	ck_assert_int_eq(code, DSCKPT_EVERSION);
	ck_assert_uint_eq(sv, PROTO_VERSION);
	ck_assert_uint_eq(cv, 99);
	reply_free(&r);
	raw_expect_closed(fd);
	close(fd);
}

/* A message type nobody defined, after a good HELLO. */
static void unknown_type(void)
{
	struct proto_out o;
	int fd = raw_connect();
	raw_hello(fd);
	out_map(&o, 50, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A body that is an array, not a map. */
static void not_a_map(void)
{
	struct proto_out o;
	int fd = raw_connect();
	proto_out_init(&o, PROTO_HELLO, 1);
	msgpack_pack_array(&o.pk, 2);
	msgpack_pack_int(&o.pk, 1);
	msgpack_pack_int(&o.pk, 2);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* HELLO with a key the message does not have. */
static void unknown_key(void)
{
	struct proto_out o;
	int fd = raw_connect();
	out_map(&o, PROTO_HELLO, 3);
	proto_kv_str(&o.pk, "role", "ctl");
	proto_kv_u64(&o.pk, "pid", 1);
	proto_kv_u64(&o.pk, "bogus", 1);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A job name with a NUL byte inside. */
static void nul_string(void)
{
	struct proto_out o;
	int fd = raw_connect();
	out_map(&o, PROTO_HELLO, 5);
	proto_kv_str(&o.pk, "role", "trainer");
	proto_key(&o.pk, "job");
	msgpack_pack_str(&o.pk, 5);
	msgpack_pack_str_body(&o.pk, "ab\0cd", 5);
	proto_kv_u64(&o.pk, "rank", 0);
	proto_kv_u64(&o.pk, "world", 1);
	proto_kv_u64(&o.pk, "pid", 1);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* A run id with a control character, and one of 129 bytes (version 6's HELLO). */
static void bad_run(void)
{
	char longer[130];
	memset(longer, 'r', 129);
	longer[129] = '\0';
	const char *runs[] = {"run\n1", longer};
	for (int i = 0; i < 2; i++) {
		struct proto_out o;
		int fd = raw_connect();
		out_map(&o, PROTO_HELLO, 6);
		proto_kv_str(&o.pk, "role", "trainer");
		proto_kv_str(&o.pk, "job", "j");
		proto_kv_u64(&o.pk, "rank", 0);
		proto_kv_u64(&o.pk, "world", 1);
		proto_kv_str(&o.pk, "run", runs[i]);
		proto_kv_u64(&o.pk, "pid", 1);
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
		close(fd);
	}
}

/* STATUS and SAVE_BEGIN before HELLO. */
static void before_hello(void)
{
	struct proto_out o;
	for (int i = 0; i < 2; i++) {
		int fd = raw_connect();
		if (i == 0) {
			out_map(&o, PROTO_STATUS, 0);
		} else {
			out_map(&o, PROTO_SAVE_BEGIN, 2);
			proto_kv_str(&o.pk, "dir", h_path("%s/nohello/t1", D->root));
			proto_kv_str(&o.pk, "file", "rank0");
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	ck_assert(!h_exists(h_path("%s/nohello", D->root)));
}

/* REGION_ADD whose header announces a descriptor that never came. */
static void fds_missing(void)
{
	struct proto_out o;
	int fd = raw_connect();
	raw_hello(fd);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", 1);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/* REGION_ADD with a pipe instead of a memfd, then a descriptor nobody announced. */
static void pipe_fd(void)
{
	struct proto_out o;
	int p[2];
	int fd = raw_connect();
	raw_hello(fd);
	ck_assert_int_eq(pipe(p), 0);
	out_map(&o, PROTO_REGION_ADD, 3);
	proto_kv_u64(&o.pk, "region", 1);
	proto_kv_str(&o.pk, "kind", "host");
	proto_kv_u64(&o.pk, "size", 4096);
	ck_assert_int_eq(raw_send(fd, &o, 1, &p[0], 1), 0);
	raw_expect_error(fd);
	close(fd);

	raw_step = "STATUS carrying a descriptor it does not announce";
	fd = raw_connect();
	raw_hello(fd);
	out_map(&o, PROTO_STATUS, 0);
	ck_assert_int_eq(raw_send(fd, &o, 0, &p[0], 1), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
	close(p[0]);
	close(p[1]);
}

/* 64 KiB of random bytes, first frame and after HELLO. */
static void garbage(void)
{
	static uint8_t junk[65536];
	h_pattern_fill(junk, sizeof(junk), 77);
	for (int i = 0; i < 2; i++) {
		int fd = raw_connect();
		if (i)
			raw_hello(fd);
		(void)!send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
		raw_expect_closed(fd);
		close(fd);
	}
}

/* Tensors that reach past their region, also with offsets that overflow. */
static void past_region(void)
{
	uint64_t save;
	int fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 100, 4000, 100), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 100, UINT64_MAX - 50, 100), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "U8", 8192, 0, 8192), 0);
	close(fd);
}

/* nbytes that does not match shape × dtype size, and a dtype nobody knows. */
static void bad_nbytes(void)
{
	uint64_t save;
	int fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "F32", 10, 0, 44), 0);
	close(fd);
	fd = raw_trainer_save(&save);
	ck_assert_int_lt(raw_add_bad(fd, save, "F33", 10, 0, 40), 0);
	close(fd);
}

/*
 * Sends SAVE_END for save and expects an ERROR: the last point where a bad save may still
 * be refused (PROTOCOL.md wants SAVE_ADD to refuse it; refusing at SAVE_END writes nothing
 * either).
 */
static void raw_end_refused(int fd, uint64_t save)
{
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", save);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_error(fd);
}

/* Starts a SAVE_BEGIN of dir raw/whole, file f, with end (unless !end) and nkeys more keys. */
static void whole_begin(struct proto_out *o, int end, uint32_t nkeys)
{
	out_map(o, PROTO_SAVE_BEGIN, 2 + (end != 0) + nkeys);
	proto_kv_str(&o->pk, "dir", h_path("%s/raw/whole", D->root));
	proto_kv_str(&o->pk, "file", "f");
	if (end)
		proto_kv_bool(&o->pk, "end", 1);
}

/* A trainer connection, with region 1 when region, for whole_save. */
static int whole_conn(int region)
{
	int fd = raw_connect();
	raw_hello(fd);
	if (region)
		raw_region(fd, 1);
	return fd;
}

/* Sends o on fd, expects a fatal EPROTO and closes fd. */
static void whole_fatal(int fd, struct proto_out *o)
{
	ck_assert_int_eq(raw_send(fd, o, 0, NULL, 0), 0);
	raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
	close(fd);
}

/*
 * SAVE_BEGIN that ends its save too: entries without end are unknown keys and a bad entry or
 * a lone event are fatal (the save goes with the connection); a refused tensor is an ERROR
 * that leaves nothing open (the same file saves again at once), and a good one is ACCEPTED
 * with its id and written.
 */
static void whole_save(void)
{
	struct proto_out o;
	int fd = whole_conn(0);
	whole_begin(&o, 0, 1);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 0);
	whole_fatal(fd, &o);

	fd = whole_conn(1);
	whole_begin(&o, 1, 1);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	msgpack_pack_str_with_body(&o.pk, "x", 1);
	whole_fatal(fd, &o);

	fd = whole_conn(0);
	whole_begin(&o, 1, 1);
	proto_kv_bin(&o.pk, "event", "0123456789012345678901234567890123456789012345678901234567890123",
		     64);
	whole_fatal(fd, &o);

	fd = whole_conn(1);
	whole_begin(&o, 1, 1);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 8192, 0, 8192);	/* past the 4096-byte region */
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_int_eq(raw_expect_error(fd), DSCKPT_ERANGE);
	whole_begin(&o, 1, 1);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 16, 0, 16);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	struct reply r;
	uint64_t save = 0;
	int64_t level = 0;
	ck_assert_int_eq(raw_recv(fd, &r, 10000), PROTO_REPLY);
	ck_assert_int_eq(proto_get_u64(&r.m, "save", UINT64_MAX, &save, 1), 1);
	ck_assert_int_eq(proto_get_i64(&r.m, "level", -1, 4, &level, 1), 1);
	ck_assert_int_eq(proto_map_end(&r.m), 0);
	reply_free(&r);
	ck_assert_int_eq(level, DSCKPT_ACCEPTED);
	out_map(&o, PROTO_WAIT, 3);
	proto_kv_u64(&o.pk, "save", save);
	proto_kv_i64(&o.pk, "level", DSCKPT_DURABLE);
	proto_kv_i64(&o.pk, "timeout_ms", 10000);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_eq(raw_expect_reply(fd, "save"), save);
	close(fd);
	struct stf f;
	int64_t shape = 16;
	stf_load(&f, h_path("%s/raw/whole/f.safetensors", D->root));
	ck_assert_ptr_nonnull(stf_tensor(&f, "x", "U8", &shape, 1, 16));
	stf_free(&f);
}

/* The same tensor name twice, in one SAVE_ADD and across two: refused, no file written. */
static void dup_name(void)
{
	struct proto_out o;
	struct reply r;
	uint64_t save;
	int fd = raw_trainer_save(&save);
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 2);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	pack_tensor(&o.pk, "x", "U8", 10, 10, 10);
	raw_step = "tensor name twice in one SAVE_ADD";
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	int type = raw_recv(fd, &r, 5000);
	ck_assert_int_ge(type, 0);
	reply_free(&r);
	if (type == PROTO_REPLY)
		raw_end_refused(fd, save);
	close(fd);

	fd = raw_trainer_save(&save);
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "tensors");
	raw_step = "tensor name again in a second SAVE_ADD";
	out_map(&o, PROTO_SAVE_ADD, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 20, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	type = raw_recv(fd, &r, 5000);
	ck_assert_int_ge(type, 0);
	reply_free(&r);
	if (type == PROTO_REPLY)
		raw_end_refused(fd, save);
	close(fd);
	h_sleep_ms(100);
	ck_assert_msg(h_system("find '%s' -type f | grep -q .", D->root) != 0,
		      "a file was written for a save with a duplicate tensor name");
}

/* SAVE_ADD, SAVE_END and WAIT naming a save of another connection. */
static void foreign_save(void)
{
	uint64_t save, mine;
	int owner = raw_trainer_save(&save);
	for (int i = 0; i < 3; i++) {
		struct proto_out o;
		int fd = raw_trainer_save(&mine);
		if (i == 0) {
			ck_assert_int_lt(raw_add_bad(fd, save, "U8", 10, 0, 10), 0);
			close(fd);
			continue;
		}
		out_map(&o, i == 1 ? PROTO_SAVE_END : PROTO_WAIT, i == 1 ? 1 : 3);
		proto_kv_u64(&o.pk, "save", save);
		if (i == 2) {
			proto_kv_i64(&o.pk, "level", 0);
			proto_kv_i64(&o.pk, "timeout_ms", 0);
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		raw_expect_error(fd);
		close(fd);
	}
	/* The owner's save is untouched: it still ends. */
	struct proto_out o;
	out_map(&o, PROTO_SAVE_END, 1);
	proto_kv_u64(&o.pk, "save", save);
	ck_assert_int_eq(raw_send(owner, &o, 0, NULL, 0), 0);
	raw_expect_reply(owner, "level");
	close(owner);
}

/* SEAL without a dir, with a dir of the wrong type, with a key too many, or with a path
 * outside the roots or a relative one: malformed ones close the connection with EPROTO, the
 * bad paths get an error and the connection goes on. */
static void bad_seal(void)
{
	for (int i = 0; i < 5; i++) {
		struct proto_out o;
		int fd = raw_connect();
		raw_hello(fd);
		out_map(&o, PROTO_SEAL, i == 0 ? 0 : i == 2 ? 2 : 1);
		if (i == 1)
			proto_kv_u64(&o.pk, "dir", 7);
		else if (i >= 2)
			proto_kv_str(&o.pk, "dir", i == 3 ? "/etc" : i == 4 ? "ckpt/job/t1" :
						       h_path("%s/job/t1", D->root));
		if (i == 2)
			proto_kv_u64(&o.pk, "bogus", 1);
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		if (i < 3)
			raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
		else
			raw_expect_error(fd);
		close(fd);
	}
}

/* NODES without keys, with nodes of the wrong type, an empty host name, a host name holding a
 * NUL or a rank that is not an unsigned integer: each closes the connection with EPROTO; a
 * well-formed one where peer copies are off gets ENOTSUP and the connection goes on. */
static void bad_nodes(void)
{
	for (int i = 0; i < 6; i++) {
		struct proto_out o;
		int fd = raw_connect();
		raw_hello(fd);
		out_map(&o, PROTO_NODES, i == 0 ? 0 : 3);
		if (i > 0) {
			proto_kv_str(&o.pk, "dir", h_path("%s/job", D->root));
			proto_key(&o.pk, "nodes");
			if (i == 1) {
				msgpack_pack_uint64(&o.pk, 7);
			} else {
				static const char nul[] = {'n', '\0', '1'};
				msgpack_pack_array(&o.pk, 1);
				msgpack_pack_str(&o.pk, i == 2 ? 0 : i == 4 ? 3 : 2);
				msgpack_pack_str_body(&o.pk, i == 4 ? nul : "n1", i == 2 ? 0 :
						      i == 4 ? 3 : 2);
			}
			proto_key(&o.pk, "ranks");
			msgpack_pack_array(&o.pk, 1);
			if (i == 3)
				msgpack_pack_str_with_body(&o.pk, "x", 1);
			else
				msgpack_pack_uint64(&o.pk, 0);
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		if (i < 5) {
			raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
		} else {
			ck_assert_int_eq(raw_expect_error(fd), DSCKPT_ENOTSUP);
			out_map(&o, PROTO_STATUS, 0);	/* still served */
			ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
			raw_expect_reply(fd, NULL);
		}
		close(fd);
	}
}

/* A durable file raw/t1/loadme holding U8 tensor "x" of 10 bytes, saved by raw frames. */
static const char *raw_saved_file(void)
{
	struct proto_out o;
	int fd = raw_connect();

	raw_hello(fd);
	raw_region(fd, 1);
	out_map(&o, PROTO_SAVE_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", h_path("%s/raw/t1", D->root));
	proto_kv_str(&o.pk, "file", "loadme");
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	uint64_t save = raw_expect_reply(fd, "save");
	out_map(&o, PROTO_SAVE_END, 2);
	proto_kv_u64(&o.pk, "save", save);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "level");
	out_map(&o, PROTO_WAIT, 3);
	proto_kv_u64(&o.pk, "save", save);
	proto_kv_i64(&o.pk, "level", 3);
	proto_kv_i64(&o.pk, "timeout_ms", 10000);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "level");
	close(fd);
	return "loadme";
}

/* LOAD_BEGIN of the raw file on a new connection with region 1; the load id. */
static uint64_t raw_load(int *fd, const char *file)
{
	struct proto_out o;

	*fd = raw_connect();
	raw_hello(*fd);
	raw_region(*fd, 1);
	out_map(&o, PROTO_LOAD_BEGIN, 2);
	proto_kv_str(&o.pk, "dir", h_path("%s/raw/t1", D->root));
	proto_kv_str(&o.pk, "file", file);
	ck_assert_int_eq(raw_send(*fd, &o, 0, NULL, 0), 0);
	return raw_expect_reply(*fd, "load");
}

/* The load messages malformed (EPROTO, the connection closed) and out of order or naming
 * what is not there (an error, the connection goes on): ten cases, then a good load. */
static void bad_load(void)
{
	const char *file = raw_saved_file();
	char f[64];
	snprintf(f, sizeof(f), "%s", file);
	for (int i = 0; i < 10; i++) {
		struct proto_out o;
		int fd, other;
		uint64_t load = raw_load(&fd, f);
		switch (i) {
		case 0:	/* LOAD_BEGIN without file */
			out_map(&o, PROTO_LOAD_BEGIN, 1);
			proto_kv_str(&o.pk, "dir", h_path("%s/raw/t1", D->root));
			break;
		case 1:	/* LOAD_WAIT with a key too many */
			out_map(&o, PROTO_LOAD_WAIT, 3);
			proto_kv_u64(&o.pk, "load", load);
			proto_kv_i64(&o.pk, "timeout_ms", 0);
			proto_kv_u64(&o.pk, "bogus", 1);
			break;
		case 2:	/* a shape of strings */
			out_map(&o, PROTO_LOAD_ADD, 2);
			proto_kv_u64(&o.pk, "load", load);
			proto_key(&o.pk, "tensors");
			msgpack_pack_array(&o.pk, 1);
			msgpack_pack_array(&o.pk, 6);
			proto_str(&o.pk, "x");
			proto_str(&o.pk, "U8");
			proto_str(&o.pk, "10");
			msgpack_pack_uint64(&o.pk, 1);
			msgpack_pack_uint64(&o.pk, 0);
			msgpack_pack_uint64(&o.pk, 10);
			break;
		case 3:	/* an event without its GPU */
			out_map(&o, PROTO_LOAD_END, 2);
			proto_kv_u64(&o.pk, "load", load);
			proto_kv_bin(&o.pk, "event", f, 64);
			break;
		case 4:	/* LOAD_END of a load that does not exist */
			out_map(&o, PROTO_LOAD_END, 1);
			proto_kv_u64(&o.pk, "load", load + 1000);
			break;
		case 5:	/* LOAD_WAIT before LOAD_END */
			out_map(&o, PROTO_LOAD_WAIT, 2);
			proto_kv_u64(&o.pk, "load", load);
			proto_kv_i64(&o.pk, "timeout_ms", 0);
			break;
		case 6:	/* a destination past its region abandons the load */
			out_map(&o, PROTO_LOAD_ADD, 2);
			proto_kv_u64(&o.pk, "load", load);
			proto_key(&o.pk, "tensors");
			msgpack_pack_array(&o.pk, 1);
			pack_tensor(&o.pk, "x", "U8", 10, 4090, 10);
			break;
		case 7:	/* LOAD_END of another connection's load */
			raw_load(&other, f);
			out_map(&o, PROTO_LOAD_END, 1);
			proto_kv_u64(&o.pk, "load", load);
			ck_assert_int_eq(raw_send(other, &o, 0, NULL, 0), 0);
			ck_assert_int_eq(raw_expect_error(other), DSCKPT_ENOENT);
			close(other);
			out_map(&o, PROTO_LOAD_ABORT, 1);
			proto_kv_u64(&o.pk, "load", load);
			break;
		case 8:	/* LOAD_ABORT of nothing */
			out_map(&o, PROTO_LOAD_ABORT, 1);
			proto_kv_u64(&o.pk, "load", load + 7);
			break;
		default: /* nbytes that is not the shape's */
			out_map(&o, PROTO_LOAD_END, 2);
			proto_kv_u64(&o.pk, "load", load);
			proto_key(&o.pk, "tensors");
			msgpack_pack_array(&o.pk, 1);
			pack_tensor(&o.pk, "x", "U8", 10, 0, 11);
			break;
		}
		ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
		if (i < 4) {
			raw_expect_fatal(fd, DSCKPT_EPROTO, DSCKPT_EPROTO);
		} else if (i == 7) {
			raw_expect_reply(fd, NULL);	/* the owner's load was untouched */
		} else {
			int code = raw_expect_error(fd);
			int want = i == 5 ? DSCKPT_ESTATE : i == 6 ? DSCKPT_ERANGE :
				   i == 9 ? DSCKPT_EINVAL : DSCKPT_ENOENT;
			ck_assert_msg(code == want, "case %d: code %d", i, code);
		}
		close(fd);
	}
	/* After all that, a good load of the file. */
	struct proto_out o;
	int fd;
	uint64_t load = raw_load(&fd, f);
	out_map(&o, PROTO_LOAD_END, 2);
	proto_kv_u64(&o.pk, "load", load);
	proto_key(&o.pk, "tensors");
	msgpack_pack_array(&o.pk, 1);
	pack_tensor(&o.pk, "x", "U8", 10, 0, 10);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	raw_expect_reply(fd, "level");
	out_map(&o, PROTO_LOAD_WAIT, 2);
	proto_kv_u64(&o.pk, "load", load);
	proto_kv_i64(&o.pk, "timeout_ms", 10000);
	ck_assert_int_eq(raw_send(fd, &o, 0, NULL, 0), 0);
	ck_assert_uint_eq(raw_expect_reply(fd, "bytes_done"), 10);
	close(fd);
}

/* The malformed inputs of test_malformed, one per iteration. */
static const struct {
	const char *name;
	void (*fn)(void);
} malformed[] = {
	{"bad magic", bad_magic},
	{"body > 16 MiB", too_long},
	{"truncated body", truncated},
	{"wrong version", wrong_version},
	{"unknown type", unknown_type},
	{"body not a map", not_a_map},
	{"unknown key", unknown_key},
	{"string with NUL", nul_string},
	{"bad run id", bad_run},
	{"request before HELLO", before_hello},
	{"nfds without fds", fds_missing},
	{"pipe for REGION_ADD", pipe_fd},
	{"garbage", garbage},
	{"tensor past its region", past_region},
	{"nbytes != shape x dtype", bad_nbytes},
	{"duplicate tensor name", dup_name},
	{"whole save in SAVE_BEGIN", whole_save},
	{"save of another connection", foreign_save},
	{"bad SEAL", bad_seal},
	{"bad LOAD", bad_load},
	{"bad NODES", bad_nodes},
};

/* One malformed input per iteration; afterwards a new connection must be served. */
START_TEST(test_malformed)
{
	d_start(CACHE_8M, CHUNK_1M);
	raw_step = malformed[_i].name;
	malformed[_i].fn();
	check_alive();
	d_stop();
}
END_TEST

/* Builds the suite: one test case per group, each with a time limit that fits it. */
static Suite *daemon_frames_suite(void)
{
	Suite *s = suite_create("daemon frames");
	h_add_case(s, "malformed", test_malformed, 30,
		   (int)(sizeof(malformed) / sizeof(malformed[0])));
	return s;
}

CHECK_MAIN(daemon_frames_suite)
