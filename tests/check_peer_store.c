/* check_peer_store.c — replica_store.c on its own: a copy is visible only once every file of
 * it arrived whole and matching the manifest's checksums and the sender's; what is refused
 * (a file not in the manifest, another size, a byte off, one file missing) is never seen;
 * past replica_cache_size files go to replica_root (.partial-<n>, then <n>), or are refused
 * without one; room is made by evicting the oldest copies first, never an owner's newest of
 * a job nor one being read. */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define HL 4096

static char root[256];
static char err[512];

/* A one-file copy of rank 0: hl bytes of header then data, seeded; its manifest. */
struct one {
	uint8_t *bytes;
	uint64_t size, created_ns;
	char sum[CHECKSUM_HEX + 1];
	char *manifest;
};

/* Makes a copy of size bytes for tag. */
static void one_make(struct one *o, const char *tag, uint64_t size, uint64_t seed)
{
	struct manifest_file f = { .name = "rank0.safetensors", .kind = MANIFEST_KIND_ST,
				   .size = size, .rank = 0, .header_len = HL, .data_xxh3 = o->sum,
				   .has_tensors = 1 };
	struct manifest m = { .tag = tag, .dsckptd_version = "test", .world_size = 1, .run = "run",
			      .created_ns = seed, .files = &f, .nfiles = 1 };
	o->size = size;
	o->created_ns = seed;
	o->bytes = malloc(size);
	h_pattern_fill(o->bytes, size, seed);
	checksum_hex(XXH3_64bits(o->bytes + HL, size - HL), o->sum);
	o->manifest = manifest_write(&m);
	ck_assert_ptr_nonnull(o->manifest);
}

/* Frees it. */
static void one_free(struct one *o)
{
	free(o->bytes);
	free(o->manifest);
}

/* Sends o into rs as owner's copy of job's tag, in pieces of 1000 bytes, flipping byte flip
 * (or none: -1); the first failing step's code, or 0 once visible. */
static int put(struct replica_store *rs, const char *owner, const char *job, const char *tag,
	       const struct one *o, long flip)
{
	struct replica_id id = { owner, job, "run", tag, "/ckpt/j/t", o->created_ns };
	unsigned rank = 0, idx;
	struct replica *r;
	int rc = replica_in_begin(rs, &id, o->manifest, strlen(o->manifest), &rank, 1, &r, err,
				  sizeof(err));
	if (rc != 0)
		return rc;
	if ((rc = replica_in_file(r, "rank0.safetensors", o->size, &idx, err, sizeof(err))) != 0)
		goto fail;
	for (uint64_t off = 0; off < o->size; off += 1000) {
		uint8_t piece[1000];
		size_t n = o->size - off < 1000 ? (size_t)(o->size - off) : 1000;
		memcpy(piece, o->bytes + off, n);
		if (flip >= 0 && (uint64_t)flip >= off && (uint64_t)flip < off + n)
			piece[flip - (long)off] ^= 1;
		if ((rc = replica_in_write(r, idx, piece, n, err, sizeof(err))) != 0)
			goto fail;
	}
	if ((rc = replica_in_file_end(r, idx, XXH3_64bits(o->bytes, o->size), err,
				      sizeof(err))) != 0 ||
	    (rc = replica_in_commit(r, err, sizeof(err))) != 0)
		goto fail;
	return 0;
fail:
	replica_in_abort(r);
	return rc;
}

/* Whether rs holds owner's copy of job's tag: the newest of job must be it. */
static int holds(struct replica_store *rs, const char *job, const char *tag)
{
	unsigned rank = 0;
	struct replica *r = replica_find(rs, job, &rank, 1);
	const char *text;
	size_t len;
	unsigned n;
	int yes = r && strcmp(replica_id(r, &text, &len, &n)->tag, tag) == 0;
	if (r)
		replica_put(r);
	return yes;
}

/* Entries of the root (whole copies "<n>" and partial ones ".partial-<n>"). */
static int root_entries(void)
{
	DIR *d = opendir(root);
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)) != NULL)
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	if (d)
		closedir(d);
	return n;
}

/* Makes the root. */
static void setup(void)
{
	h_tmpdir(root, sizeof(root));
	log_init("check_peer_store", LOG_LVL_ERROR);
}

/* Removes it. */
static void teardown(void)
{
	h_rm_rf(root);
}

START_TEST(test_checked_or_nothing)
{
	struct replica_store *rs;
	struct one o;
	unsigned rank = 0, idx;
	struct replica *r;

	one_make(&o, "t1", HL + 5000, 11);
	ck_assert_int_eq(replica_store_open(1 << 20, NULL, &rs, err, sizeof(err)), 0);
	/* A byte off in the data (the manifest's checksum) or in the header (the sender's). */
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o, HL + 10), -EBADMSG);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o, 10), -EBADMSG);
	ck_assert_int_eq(holds(rs, "j", "t1"), 0);
	/* A file not in the manifest, or of another size; a manifest of another tag. */
	struct replica_id id = { "a", "j", "run", "t1", "/ckpt/j/t1", 0 };
	ck_assert_int_eq(replica_in_begin(rs, &id, o.manifest, strlen(o.manifest), &rank, 1, &r,
					  err, sizeof(err)), 0);
	ck_assert_int_eq(replica_in_file(r, "rank1.safetensors", o.size, &idx, err,
					 sizeof(err)), -EINVAL);
	ck_assert_int_eq(replica_in_file(r, "rank0.safetensors", o.size + 1, &idx, err,
					 sizeof(err)), -EINVAL);
	/* Its one file never sent: not whole, not visible. */
	ck_assert_int_eq(replica_in_commit(r, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "never came"), "%s", err);
	ck_assert_int_eq(holds(rs, "j", "t1"), 0);
	replica_in_abort(r);
	id.tag = "t2";
	ck_assert_int_eq(replica_in_begin(rs, &id, o.manifest, strlen(o.manifest), &rank, 1, &r,
					  err, sizeof(err)), -EINVAL);
	/* A copy whose identity names another run than its manifest. */
	id.tag = "t1";
	id.run = "an-earlier-run";
	ck_assert_int_eq(replica_in_begin(rs, &id, o.manifest, strlen(o.manifest), &rank, 1, &r,
					  err, sizeof(err)), -EINVAL);
	id.run = "run";
	/* Names that would leave a directory. */
	id.tag = "..";
	ck_assert_int_eq(replica_in_begin(rs, &id, o.manifest, strlen(o.manifest), &rank, 1, &r,
					  err, sizeof(err)), -EINVAL);
	/* Then whole: visible, byte for byte. */
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o, -1), 0);
	ck_assert_int_eq(holds(rs, "j", "t1"), 1);
	r = replica_find(rs, "j", &rank, 1);
	uint8_t *back = malloc(o.size);
	ck_assert_int_eq(replica_read(r, 0, 0, back, o.size), 0);
	ck_assert_int_eq(memcmp(back, o.bytes, o.size), 0);
	free(back);
	replica_put(r);
	replica_store_close(rs);
	one_free(&o);
}
END_TEST

START_TEST(test_spill_and_partial)
{
	struct replica_store *rs;
	struct one o;
	unsigned rank = 0, idx;
	struct replica *r;

	one_make(&o, "t1", HL + 300000, 12);
	/* No memory, no root: refused. */
	ck_assert_int_eq(replica_store_open(0, NULL, &rs, err, sizeof(err)), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o, -1), -ENOSPC);
	ck_assert_msg(strstr(err, "no replica_root"), "%s", err);
	replica_store_close(rs);
	/* No memory, a root: on disk, partial while it comes, whole once committed. */
	ck_assert_int_eq(replica_store_open(0, root, &rs, err, sizeof(err)), 0);
	struct replica_id id = { "a", "j", "run", "t1", "/ckpt/j/t1", 0 };
	ck_assert_int_eq(replica_in_begin(rs, &id, o.manifest, strlen(o.manifest), &rank, 1, &r,
					  err, sizeof(err)), 0);
	ck_assert_int_eq(replica_in_file(r, "rank0.safetensors", o.size, &idx, err, sizeof(err)),
			 0);
	ck_assert_int_eq(replica_in_write(r, idx, o.bytes, 5000, err, sizeof(err)), 0);
	ck_assert_int_eq(h_exists(h_path("%s/.partial-1/rank0.safetensors", root)), 1);
	ck_assert_int_eq(holds(rs, "j", "t1"), 0);
	replica_in_abort(r);
	ck_assert_int_eq(root_entries(), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o, -1), 0);
	ck_assert_int_eq(h_exists(h_path("%s/2/rank0.safetensors", root)), 1);
	ck_assert_int_eq(root_entries(), 1);
	ck_assert_int_eq(holds(rs, "j", "t1"), 1);
	replica_store_close(rs);
	one_free(&o);
}
END_TEST

/* Copies wholly on the root outlive the store: a store opened on it again takes them back,
 * checked (a byte flipped on disk: not taken back, removed), with what a dead daemon left
 * half-written removed. */
START_TEST(test_recovered_after_restart)
{
	struct replica_store *rs;
	struct one o[2];
	unsigned rank = 0;
	struct replica *r;

	one_make(&o[0], "t1", HL + 300000, 21);
	one_make(&o[1], "t2", HL + 300000, 22);
	ck_assert_int_eq(replica_store_open(0, root, &rs, err, sizeof(err)), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o[0], -1), 0);
	ck_assert_int_eq(put(rs, "b", "k", "t2", &o[1], -1), 0);
	replica_store_close(rs);
	ck_assert_int_eq(root_entries(), 2);
	ck_assert_int_eq(mkdir(h_path("%s/.partial-9", root), 0700), 0);
	/* b's copy damaged while the daemon was down. */
	int fd = open(h_path("%s/2/rank0.safetensors", root), O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "x", 1, HL + 7), 1);
	close(fd);
	ck_assert_int_eq(replica_store_open(0, root, &rs, err, sizeof(err)), 0);
	replica_recover(rs);
	ck_assert_int_eq(holds(rs, "j", "t1"), 1);
	ck_assert_ptr_null(replica_find(rs, "k", &rank, 1));
	ck_assert_int_eq(root_entries(), 1);
	r = replica_find(rs, "j", &rank, 1);
	uint8_t *back = malloc(o[0].size);
	ck_assert_int_eq(replica_read(r, 0, 0, back, o[0].size), 0);
	ck_assert_int_eq(memcmp(back, o[0].bytes, o[0].size), 0);
	const char *text;
	size_t len;
	unsigned n;
	ck_assert_str_eq(replica_id(r, &text, &len, &n)->run, "run");
	free(back);
	replica_put(r);
	replica_store_close(rs);
	one_free(&o[0]);
	one_free(&o[1]);
}
END_TEST

START_TEST(test_eviction_order)
{
	struct replica_store *rs;
	struct one o[4];
	unsigned copies, rank = 0;
	uint64_t mem, evictions;

	for (int i = 0; i < 4; i++)
		one_make(&o[i], (const char *[]){ "t1", "t2", "t3", "t4" }[i], HL + 100000,
			 (uint64_t)20 + (uint64_t)i);
	/* Room for two copies in memory, none on disk. */
	ck_assert_int_eq(replica_store_open(2 * (HL + 100000), NULL, &rs, err, sizeof(err)), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o[0], -1), 0);
	ck_assert_int_eq(put(rs, "b", "k", "t2", &o[1], -1), 0);
	/* Full, and both are their owner's newest of their job: nothing may go. */
	ck_assert_int_eq(put(rs, "c", "l", "t3", &o[2], -1), -ENOSPC);
	ck_assert_int_eq(holds(rs, "j", "t1") && holds(rs, "k", "t2"), 1);
	/* a's newer copy of j: t1 stays a's newest until t4 is whole, so no room either. */
	ck_assert_int_eq(put(rs, "a", "j", "t4", &o[3], -1), -ENOSPC);
	replica_store_close(rs);
	ck_assert_int_eq(replica_store_open(3 * (HL + 100000), NULL, &rs, err, sizeof(err)), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o[0], -1), 0);
	ck_assert_int_eq(put(rs, "b", "k", "t2", &o[1], -1), 0);
	ck_assert_int_eq(put(rs, "a", "j", "t3", &o[2], -1), 0);
	/* t4 of a (j): the oldest that may go is t1 (a's, older than t3), never t2 (b's newest). */
	ck_assert_int_eq(put(rs, "a", "j", "t4", &o[3], -1), 0);
	replica_stats(rs, &copies, &mem, &evictions);
	ck_assert_uint_eq(copies, 3);
	ck_assert_uint_eq(evictions, 1);
	ck_assert_int_eq(holds(rs, "k", "t2"), 1);
	ck_assert_int_eq(holds(rs, "j", "t4"), 1);
	/* A copy being read stays readable while another goes for room; an older copy arriving
	 * late (t1 again) does not make a's newest (t4) evictable: t3 goes. */
	struct replica *reading = replica_find(rs, "j", &rank, 1);
	ck_assert_ptr_nonnull(reading);
	ck_assert_int_eq(put(rs, "a", "j", "t1", &o[0], -1), 0);
	ck_assert_int_eq(holds(rs, "j", "t4"), 1);
	replica_stats(rs, &copies, &mem, &evictions);
	ck_assert_uint_eq(evictions, 2);
	uint8_t *back = malloc(o[3].size);
	ck_assert_int_eq(replica_read(reading, 0, 0, back, o[3].size), 0);
	ck_assert_int_eq(memcmp(back, o[3].bytes, o[3].size), 0);
	free(back);
	replica_put(reading);
	replica_store_close(rs);
	for (int i = 0; i < 4; i++)
		one_free(&o[i]);
}
END_TEST

/* The suite. */
static Suite *peer_store_suite(void)
{
	Suite *s = suite_create("peer_store");
	TCase *tc = tcase_create("peer_store");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_checked_or_nothing);
	tcase_add_test(tc, test_spill_and_partial);
	tcase_add_test(tc, test_recovered_after_restart);
	tcase_add_test(tc, test_eviction_order);
	suite_add_tcase(s, tc);
	return s;
}

CHECK_MAIN(peer_store_suite)
