/*
 * check_resident.c — the hot set (daemon/resident.c): files kept in the cache after their
 * flush. Over a real tiny cache: eviction order (oldest file first, lowest piece first), pinned
 * files never evicted and a partial one trimmed at pin time, a waiter of cache_get woken by a
 * chunk kept, commits letting the older tags of the same job go and no other job's, a failed
 * save dropping its pieces, and saves, loads and commits on threads at once (for TSan).
 * Through the real engine (harness_engine.h): saves three times the cache stream through with
 * keeping on, and the pieces kept are the file's bytes. End to end through a real dsckptd and
 * libdsckpt: STATUS and dsckptctl show a committed file resident, a second save into another
 * tag evicts it, and a tag the daemons commit after a seal lets the older one go.
 */
#include "harness_engine.h"
#include "harness_daemon.h"

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CH (64 * KIB)

static struct cache *c;
static char errbuf[ERRLEN];

/* Quiet logs in every forked test. */
static void setup(void)
{
	log_init("check_resident", LOG_LVL_ERROR);
}

/* A cache of n chunks with keeping on. */
static void mk(unsigned n)
{
	ck_assert_msg(cache_create(n * CH, CH, NULL, &c, errbuf, sizeof(errbuf)) == 0, "%s",
		      errbuf);
	resident_init(c, 1);
}

/* Gives everything back and checks the cache is whole. */
static void done(void)
{
	resident_free_all();
	ck_assert_uint_eq(resident_bytes(), 0);
	ck_assert_uint_eq(cache_used(c), 0);
	cache_destroy(c);
}

/* A file's kept chunks as the test made them. */
struct kept {
	struct resident *r;
	void *p[16];
};

/*
 * Makes a resident of dir/file with npieces pieces of data and keeps pieces [from, npieces)
 * in fresh chunks, each filled with tag + i; durable as inode ino when ino is not 0.
 */
static void mkres(struct kept *k, const char *dir, const char *file, unsigned npieces,
		  unsigned from, ino_t ino, int tag)
{
	memset(k, 0, sizeof(*k));
	k->r = resident_begin(dir, file, getuid(), (uint64_t)npieces * CH);
	ck_assert_ptr_nonnull(k->r);
	for (unsigned i = from; i < npieces; i++) {
		k->p[i] = cache_tryget(c, -1);
		ck_assert_ptr_nonnull(k->p[i]);
		memset(k->p[i], tag + (int)i, CH);
		ck_assert_int_eq(resident_keep(k->r, i, k->p[i]), 1);
	}
	if (ino)
		resident_durable(k->r, 1, ino, "HDR", 3);
}

/* What resident_each lists, in order. */
struct listing {
	unsigned n;
	char dir[8][64], file[8][32];
	uint64_t bytes[8];
	int committed[8];
};

/* resident_each's callback: appends one file. */
static void list_add(void *arg, const char *dir, const char *file, uid_t uid, uint64_t bytes,
		     int committed)
{
	struct listing *l = arg;

	ck_assert_uint_lt(l->n, 8);
	ck_assert_uint_eq(uid, getuid());
	snprintf(l->dir[l->n], sizeof(l->dir[0]), "%s", dir);
	snprintf(l->file[l->n], sizeof(l->file[0]), "%s", file);
	l->bytes[l->n] = bytes;
	l->committed[l->n] = committed;
	l->n++;
}

/* The durable resident files now. */
static struct listing list(void)
{
	struct listing l = {0};
	resident_each(list_add, &l);
	return l;
}

/* Whether dir is listed (its index, or -1). */
static int listed(const struct listing *l, const char *dir)
{
	for (unsigned i = 0; i < l->n; i++)
		if (strcmp(l->dir[i], dir) == 0)
			return (int)i;
	return -1;
}

/* With no chunk free, takers get the oldest file's pieces, lowest first; a file with nothing
 * left is let go. */
START_TEST(test_evict_order)
{
	struct kept a, b;

	mk(6);
	mkres(&a, "/r/j/t1", "a", 2, 0, 11, 'a');
	mkres(&b, "/r/j/t2", "b", 3, 0, 12, 'b');
	ck_assert_uint_eq(resident_bytes(), 5 * CH);
	struct listing l = list();
	ck_assert_uint_eq(l.n, 2);
	ck_assert_str_eq(l.dir[0], "/r/j/t1");
	ck_assert_uint_eq(l.bytes[1], 3 * CH);
	ck_assert_int_eq(l.committed[0], 0);

	void *free1 = cache_tryget(c, -1);	/* the one free chunk: no eviction */
	ck_assert_ptr_nonnull(free1);
	ck_assert_uint_eq(resident_bytes(), 5 * CH);
	ck_assert_ptr_eq(cache_tryget(c, -1), a.p[0]);
	ck_assert_uint_eq(resident_bytes(), 4 * CH);
	ck_assert_ptr_eq(cache_get(c, -1), a.p[1]);
	l = list();
	ck_assert_uint_eq(l.n, 1);	/* a holds nothing more: let go */
	ck_assert_str_eq(l.dir[0], "/r/j/t2");
	ck_assert_ptr_eq(cache_tryget(c, -1), b.p[0]);
	l = list();
	ck_assert_uint_eq(l.bytes[0], 2 * CH);
	ck_assert_uint_eq(cache_used(c), 6 * CH);
	cache_put(c, free1);
	cache_put(c, a.p[0]);
	cache_put(c, a.p[1]);
	cache_put(c, b.p[0]);
	done();
}
END_TEST

/* A taker blocked in cache_get. */
struct taker {
	pthread_t t;
	void *got;
	atomic_int done;
};

/* Thread: takes one chunk, waiting if it must. */
static void *take(void *arg)
{
	struct taker *w = arg;
	w->got = cache_get(c, -1);
	atomic_store(&w->done, 1);
	return NULL;
}

/* A pinned file keeps its pieces: takers get the others', then wait, and get one of its
 * pieces once it is unpinned. A pin needs the file's identity. */
START_TEST(test_pinned)
{
	struct kept a, b;
	struct taker w = {0};
	size_t hl;

	mk(4);
	mkres(&a, "/r/j/t1", "a", 2, 0, 7, 'a');
	mkres(&b, "/r/j/t2", "b", 2, 0, 8, 'b');
	ck_assert_ptr_null(resident_pin("/r/j/t1", "a", 1, 8));
	ck_assert_ptr_null(resident_pin("/r/j/t1", "b", 1, 7));
	ck_assert_ptr_null(resident_pin("/r/j/t1", "a", 2, 7));
	struct resident *r = resident_pin("/r/j/t1", "a", 1, 7);
	ck_assert_ptr_eq(r, a.r);
	ck_assert_int_eq(memcmp(resident_header(r, &hl), "HDR", 3), 0);
	ck_assert_uint_eq(hl, 3);
	ck_assert_uint_eq(resident_held(r), 2 * CH);
	ck_assert_int_eq(((const uint8_t *)resident_piece(r, 1))[CH - 1], 'a' + 1);
	ck_assert_ptr_null(resident_piece(r, 2));

	ck_assert_ptr_eq(cache_tryget(c, -1), b.p[0]);
	ck_assert_ptr_eq(cache_tryget(c, -1), b.p[1]);
	ck_assert_ptr_null(cache_tryget(c, -1));	/* only pinned pieces are left */
	ck_assert_int_eq(pthread_create(&w.t, NULL, take, &w), 0);
	h_sleep_ms(200);
	ck_assert_int_eq(atomic_load(&w.done), 0);
	ck_assert_uint_eq(resident_held(r), 2 * CH);
	resident_unpin(r);
	pthread_join(w.t, NULL);
	ck_assert_ptr_eq(w.got, a.p[0]);
	cache_put(c, w.got);
	cache_put(c, b.p[0]);
	cache_put(c, b.p[1]);
	done();
}
END_TEST

/* A partial copy is trimmed as it is pinned, so that a reader of the rest of its file finds a
 * chunk to read into; a complete copy is pinned whole even when it holds the whole cache. */
START_TEST(test_pin_partial)
{
	struct kept a;

	mk(8);
	mkres(&a, "/r/j/t1", "a", 10, 2, 5, 'a');	/* pieces 2..9: the whole cache */
	ck_assert_uint_eq(cache_used(c), 8 * CH);
	struct resident *r = resident_pin("/r/j/t1", "a", 1, 5);
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(resident_held(r), 7 * CH);
	ck_assert_ptr_null(resident_piece(r, 2));
	ck_assert_ptr_eq(resident_piece(r, 3), a.p[3]);
	struct resident *r2 = resident_pin("/r/j/t1", "a", 1, 5);	/* a second load */
	ck_assert_ptr_eq(r2, r);
	ck_assert_uint_eq(resident_held(r), 7 * CH);	/* being read: not trimmed again */
	resident_unpin(r2);
	void *p = cache_tryget(c, -1);
	ck_assert_ptr_eq(p, a.p[2]);
	ck_assert_ptr_null(cache_tryget(c, -1));
	cache_put(c, p);
	resident_unpin(r);
	resident_free_all();
	ck_assert_uint_eq(cache_used(c), 0);

	mkres(&a, "/r/j/t2", "a", 8, 0, 6, 'b');	/* complete, the whole cache */
	r = resident_pin("/r/j/t2", "a", 1, 6);
	ck_assert_uint_eq(resident_held(r), 8 * CH);
	ck_assert_ptr_null(cache_tryget(c, -1));
	resident_unpin(r);
	ck_assert_ptr_eq(p = cache_tryget(c, -1), a.p[0]);
	cache_put(c, p);
	resident_free_all();

	/* Two partial copies pinned at once: the second gives up what the first leaves no room
	 * for, here everything, and is let go at its unpin. */
	struct kept b;
	mkres(&b, "/r/j/t3", "b", 2, 1, 7, 'c');
	mkres(&a, "/r/j/t4", "a", 10, 3, 8, 'd');
	r = resident_pin("/r/j/t4", "a", 1, 8);
	ck_assert_uint_eq(resident_held(r), 7 * CH);
	r2 = resident_pin("/r/j/t3", "b", 1, 7);
	ck_assert_uint_eq(resident_held(r2), 0);
	ck_assert_uint_eq(cache_used(c), 7 * CH);
	resident_unpin(r2);
	struct listing l = list();
	ck_assert_uint_eq(l.n, 1);
	ck_assert_str_eq(l.dir[0], "/r/j/t4");
	resident_unpin(r);
	done();
}
END_TEST

/* A taker waiting for a chunk (every one is out, none kept) is woken when a flush thread keeps
 * one, and evicts it. */
START_TEST(test_keep_wakes_waiter)
{
	struct taker w = {0};

	mk(2);
	void *p = cache_get(c, -1), *q = cache_get(c, -1);
	struct resident *r = resident_begin("/r/j/t1", "a", getuid(), 2 * CH);
	ck_assert_int_eq(pthread_create(&w.t, NULL, take, &w), 0);
	h_sleep_ms(200);
	ck_assert_int_eq(atomic_load(&w.done), 0);
	ck_assert_int_eq(resident_keep(r, 0, p), 1);
	pthread_join(w.t, NULL);
	ck_assert_ptr_eq(w.got, p);
	ck_assert_uint_eq(resident_bytes(), 0);
	ck_assert_int_eq(resident_keep(r, 1, q), 1);
	resident_drop(r);	/* the save failed: q goes back */
	ck_assert_uint_eq(cache_used(c), CH);
	cache_put(c, p);
	done();
}
END_TEST

/* A failed or abandoned save gives its pieces back; a resident let go while its save still
 * runs keeps nothing more; a disabled hot set keeps nothing. */
START_TEST(test_drop)
{
	struct kept a;

	mk(4);
	mkres(&a, "/r/j/t1", "a", 3, 0, 0, 'a');
	ck_assert_uint_eq(list().n, 0);	/* not durable: not listed */
	ck_assert_uint_eq(cache_used(c), 3 * CH);
	resident_drop(a.r);
	ck_assert_uint_eq(cache_used(c), 0);
	ck_assert_uint_eq(resident_bytes(), 0);

	/* Committing a later tag of the job lets an older one in flight go. */
	struct resident *r = resident_begin("/r/j/t2", "a", getuid(), 2 * CH);
	mkres(&a, "/r/j/t3", "a", 1, 0, 9, 'b');
	void *p = cache_get(c, -1);
	ck_assert_int_eq(resident_keep(r, 0, p), 1);
	resident_committed("/r/j/t3");
	ck_assert_uint_eq(cache_used(c), CH);	/* t3's piece */
	void *q = cache_get(c, -1);
	ck_assert_int_eq(resident_keep(r, 1, q), 0);
	cache_put(c, q);
	resident_durable(r, 1, 10, "H", 1);
	struct listing l = list();
	ck_assert_uint_eq(l.n, 1);
	ck_assert_str_eq(l.dir[0], "/r/j/t3");
	ck_assert_int_eq(l.committed[0], 1);

	resident_init(c, 0);
	ck_assert_ptr_null(resident_begin("/r/j/t4", "a", getuid(), CH));
	resident_init(c, 1);
	done();
}
END_TEST

/* A commit marks its tag's files and lets go the job's older tags (committed or not), never
 * a later tag still being saved nor another job's; a newer copy of a file replaces the old. */
START_TEST(test_committed)
{
	struct kept o1, a0, a1, a2, a3, a1b;

	mk(16);
	mkres(&o1, "/r/other/t1", "rank0", 1, 0, 1, 'o');
	resident_committed("/r/other/t1");
	mkres(&a0, "/r/job/t0", "rank0", 1, 0, 2, 'a');
	mkres(&a1, "/r/job/t1", "rank0", 2, 0, 3, 'b');
	mkres(&a1b, "/r/job/t1", "rank1", 1, 0, 4, 'c');
	resident_committed("/r/job/t1");
	struct listing l = list();
	ck_assert_uint_eq(l.n, 3);
	ck_assert_int_lt(listed(&l, "/r/job/t0"), 0);	/* older, never committed */
	ck_assert_int_eq(l.committed[listed(&l, "/r/job/t1")], 1);
	ck_assert_int_eq(l.committed[listed(&l, "/r/other/t1")], 1);

	mkres(&a2, "/r/job/t2", "rank0", 1, 0, 5, 'd');
	mkres(&a3, "/r/job/t3", "rank0", 1, 0, 0, 'e');	/* still being saved */
	resident_committed("/r/job/t2");
	l = list();
	ck_assert_uint_eq(l.n, 2);	/* t3 is not durable yet */
	ck_assert_int_ge(listed(&l, "/r/other/t1"), 0);
	ck_assert_int_eq(l.committed[listed(&l, "/r/job/t2")], 1);
	ck_assert_uint_eq(resident_bytes(), 3 * CH);	/* o1, a2, a3 */
	resident_durable(a3.r, 1, 6, "H", 1);
	l = list();
	ck_assert_int_eq(l.committed[listed(&l, "/r/job/t3")], 0);

	/* The same file saved again: the new copy replaces the old at DURABLE. */
	struct kept a3b;
	mkres(&a3b, "/r/job/t3", "rank0", 2, 0, 0, 'f');
	ck_assert_uint_eq(resident_bytes(), 5 * CH);
	resident_durable(a3b.r, 1, 7, "H", 1);
	ck_assert_uint_eq(resident_bytes(), 4 * CH);
	ck_assert_ptr_null(resident_pin("/r/job/t3", "rank0", 1, 6));
	struct resident *r = resident_pin("/r/job/t3", "rank0", 1, 7);
	ck_assert_uint_eq(resident_held(r), 2 * CH);

	/* A commit of a tag with no file here (evicted, saved elsewhere) lets the job's
	 * committed files go, not those still uncommitted. */
	resident_committed("/r/job/t4");
	l = list();
	ck_assert_uint_eq(l.n, 2);
	ck_assert_int_lt(listed(&l, "/r/job/t2"), 0);
	ck_assert_int_ge(listed(&l, "/r/job/t3"), 0);
	ck_assert_uint_eq(resident_bytes(), 3 * CH);	/* o1, a3b */

	/* A pinned file let go stays readable until unpinned. */
	struct kept a5;
	mkres(&a5, "/r/job/t5", "rank0", 1, 0, 8, 'g');
	resident_committed("/r/job/t5");
	l = list();
	ck_assert_uint_eq(l.n, 2);
	ck_assert_int_lt(listed(&l, "/r/job/t3"), 0);
	ck_assert_ptr_eq(resident_piece(r, 1), a3b.p[1]);
	ck_assert_uint_eq(resident_bytes(), 4 * CH);
	resident_unpin(r);
	ck_assert_uint_eq(resident_bytes(), 2 * CH);
	ck_assert_uint_eq(cache_used(c), 2 * CH);
	done();
}
END_TEST

/* ---- threads at once: saves keeping pieces, loads pinning them, commits (TSan's case) ---- */

#define ST_WORKERS 3
#define ST_SAVES 60
#define ST_PIECES 3

/* The byte piece i of save ino is filled with. */
static uint8_t st_byte(ino_t ino, uint64_t i)
{
	return (uint8_t)(ino * 31 + i * 7 + 1);
}

static atomic_uint st_done[ST_WORKERS];  /* saves durable so far, per worker */
static atomic_int st_stop;

/* Worker w: saves ST_SAVES files of ST_PIECES pieces, each into its own tag of job j<w>,
 * taking chunks as a copy thread does and keeping them as a flush thread does. */
static void *st_worker(void *arg)
{
	unsigned w = (unsigned)(uintptr_t)arg;

	for (unsigned k = 0; k < ST_SAVES; k++) {
		ino_t ino = w * 1000 + k + 1;
		char dir[32];
		snprintf(dir, sizeof(dir), "/r/j%u/t%u", w, k);
		struct resident *r = resident_begin(dir, "f", getuid(), ST_PIECES * CH - 100);
		ck_assert_ptr_nonnull(r);
		for (uint64_t i = 0; i < ST_PIECES; i++) {
			void *p = cache_get(c, -1);
			ck_assert_ptr_nonnull(p);
			memset(p, st_byte(ino, i), CH);
			if (!resident_keep(r, i, p))
				cache_put(c, p);
		}
		if (k % 7 == 3) {
			resident_drop(r);	/* a failed save */
			continue;
		}
		resident_durable(r, 1, ino, "HDR", 3);
		atomic_store(&st_done[w], k + 1);
	}
	return NULL;
}

/* resident_each's callback for the stress: only counts. */
static void st_count(void *arg, const char *dir, const char *file, uid_t uid, uint64_t bytes,
		     int committed)
{
	(*(unsigned *)arg)++;
}

/* The "loop": commits tags, lists, and pins files to check that their pieces hold still. */
static void *st_loop(void *arg)
{
	unsigned seed = 1, pins = 0, after = 0;
	int committed[ST_WORKERS];

	for (unsigned w = 0; w < ST_WORKERS; w++)
		committed[w] = -1;

	/* Once the workers are done, on until a pin was had (their last files stay). */
	while (!atomic_load(&st_stop) || (pins == 0 && after++ < 100000)) {
		unsigned w = rand_r(&seed) % ST_WORKERS, n = atomic_load(&st_done[w]);
		if (n == 0)
			continue;
		/* Mostly the newest files, which eviction has not reached yet. */
		unsigned back = rand_r(&seed) % (rand_r(&seed) % 4 ? 3 : n);
		unsigned k = n - 1 - (back < n ? back : n - 1);
		ino_t ino = w * 1000 + k + 1;
		unsigned count = 0;
		char dir[32];
		snprintf(dir, sizeof(dir), "/r/j%u/t%u", w, k);
		switch (rand_r(&seed) % 4) {
		case 0:
			if ((int)k > committed[w]) {	/* commits go forward */
				resident_committed(dir);
				committed[w] = (int)k;
			}
			break;
		case 1:
			resident_each(st_count, &count);
			ck_assert_uint_le(resident_bytes(), cache_total(c));
			break;
		default: {
			struct resident *r = resident_pin(dir, "f", 1, ino);
			if (!r)
				break;
			pins++;
			for (int round = 0; round < 2; round++) {
				for (uint64_t i = 0; i < ST_PIECES; i++) {
					const uint8_t *p = resident_piece(r, i);
					if (!p)
						continue;
					ck_assert_int_eq(p[0], st_byte(ino, i));
					ck_assert_int_eq(p[CH - 1], st_byte(ino, i));
				}
				sched_yield();
			}
			resident_unpin(r);
		}
		}
	}
	return (void *)(uintptr_t)pins;
}

/* Saves, loads and commits at once on a cache of 8 chunks: nobody deadlocks, a pinned file's
 * pieces never change under its reader, and every chunk comes back. */
START_TEST(test_threads)
{
	pthread_t workers[ST_WORKERS], loopt;
	void *pins;

	mk(8);
	ck_assert_int_eq(pthread_create(&loopt, NULL, st_loop, NULL), 0);
	for (unsigned w = 0; w < ST_WORKERS; w++)
		ck_assert_int_eq(pthread_create(&workers[w], NULL, st_worker,
						(void *)(uintptr_t)w), 0);
	for (unsigned w = 0; w < ST_WORKERS; w++)
		pthread_join(workers[w], NULL);
	atomic_store(&st_stop, 1);
	pthread_join(loopt, &pins);
	ck_assert_uint_gt((uintptr_t)pins, 0);
	ck_assert_uint_le(resident_bytes(), cache_used(c));
	done();
}
END_TEST

/* Reads len bytes at off of path. */
static void read_at(const char *path, void *buf, size_t len, off_t off)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, buf, len, off), (ssize_t)len);
	close(fd);
}

/* Checks that the resident copy of <root>/<rel>/<file>, if any is left, is the file: its
 * header and every piece it holds; returns how many pieces it holds. */
static uint64_t check_copy(const char *rel, const struct tjob *t, uint64_t chunk)
{
	char dir[PATH_MAX + 64], path[PATH_MAX + 200];
	struct stat st;
	size_t hl;
	uint64_t held = 0, pieces = 0;

	snprintf(dir, sizeof(dir), "%s/%s", root, rel);
	snprintf(path, sizeof(path), "%s/%s.safetensors", dir, t->file);
	ck_assert_int_eq(stat(path, &st), 0);
	struct resident *r = resident_pin(dir, t->file, st.st_dev, st.st_ino);
	if (!r)
		return 0;	/* every piece was evicted: let go */
	const uint8_t *hdr = resident_header(r, &hl);
	uint8_t *buf = malloc(hl > chunk ? hl : chunk);
	read_at(path, buf, hl, 0);
	ck_assert_int_eq(memcmp(buf, hdr, hl), 0);
	for (uint64_t i = 0; i * chunk < t->data_len; i++) {
		const void *p = resident_piece(r, i);
		uint64_t len = t->data_len - i * chunk < chunk ? t->data_len - i * chunk : chunk;
		if (!p)
			continue;
		read_at(path, buf, len, (off_t)(hl + i * chunk));
		ck_assert_msg(memcmp(buf, p, len) == 0, "%s: piece %llu differs", path,
			      (unsigned long long)i);
		held += len;
		pieces++;
	}
	ck_assert_uint_eq(held, resident_held(r));
	free(buf);
	resident_unpin(r);
	return pieces;
}

/* A save three times the cache streams through with keeping on (its own earlier pieces are
 * evicted); the pieces it keeps are the file's; several saves at once, O_DIRECT or not, all
 * durable and whole. */
START_TEST(test_engine_stream)
{
	const uint64_t chunk = 16 * KIB, cache_bytes = 4 * chunk;
	char dir[PATH_MAX + 64];
	unsigned n = _i == 0 ? 1 : 12;

	eng_start(2, 2, cache_bytes, chunk);
	resident_init(tcache, 1);
	int dfd = open_dir("job/t1");
	snprintf(dir, sizeof(dir), "%s/job/t1", root);
	for (unsigned k = 0; k < n; k++) {
		char file[32];
		snprintf(file, sizeof(file), "rank%u", k);
		plan(&jobs[k], file, k == 0 ? 12 : 1 + k % MAXT, k % 3 == 2 ? size_big : size_mixed,
		     k + 3, k % 2);
		jobs[k].res = resident_begin(dir, file, getuid(), jobs[k].data_len);
		ck_assert_ptr_nonnull(jobs[k].res);
		submit(&jobs[k], dfd, (int)(k % 2));
	}
	ck_assert_uint_gt(jobs[0].data_len, 2 * cache_bytes);
	run_until(n);
	uint64_t pieces = 0;
	for (unsigned k = 0; k < n; k++) {
		verify(&jobs[k], "job/t1");
		pieces += check_copy("job/t1", &jobs[k], chunk);
	}
	/* Demand ends with the last piece: at most a copy thread's worth is evicted after it. */
	ck_assert_uint_ge(pieces, 2);
	ck_assert_uint_eq(resident_bytes(), pieces * chunk);	/* nothing else held */
	close(dfd);
	resident_free_all();
	eng_stop();
}
END_TEST

/* A save that fails gives back what it kept: nothing stays resident, every chunk is back. */
START_TEST(test_engine_fail)
{
	char dir[PATH_MAX + 64];

	eng_start(2, 2, 4 * 16 * KIB, 16 * KIB);
	resident_init(tcache, 1);
	int dfd = open_dir("job/r");
	snprintf(dir, sizeof(dir), "%s/job/r", root);
	plan(&jobs[0], "bad", 8, size_16k, 0, 1);
	jobs[0].src[0].fail_at = 4;	/* its last read, after pieces were kept */
	jobs[0].src[0].fail_code = ERR_EIO;
	jobs[0].res = resident_begin(dir, "bad", getuid(), jobs[0].data_len);
	plan(&jobs[1], "good", 10, size_mixed, 4, 1);
	jobs[1].res = resident_begin(dir, "good", getuid(), jobs[1].data_len);
	submit(&jobs[0], dfd, 0);
	submit(&jobs[1], dfd, 0);
	run_until(2);
	verify_failed(&jobs[0], root, ERR_EIO, "fake read");
	verify(&jobs[1], "job/r");
	struct listing l = list();
	ck_assert_uint_le(l.n, 1);	/* bad never; good unless bad's copies evicted it all */
	if (l.n)
		ck_assert_str_eq(l.file[0], "good");
	uint64_t pieces = check_copy("job/r", &jobs[1], 16 * KIB);	/* the pin may trim it */
	ck_assert_uint_eq(resident_bytes(), pieces * 16 * KIB);
	close(dfd);
	resident_free_all();
	eng_stop();
}
END_TEST

/* ---- end to end: a real dsckptd ---- */

/* STATUS as dsckptctl --json prints it. */
static cJSON *status_json(void)
{
	char *out = NULL;
	int rc = ctl(&out, "--json status");
	ck_assert_msg(rc == 0, "dsckptctl status: %d\n%s", rc, out ? out : "");
	cJSON *doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	free(out);
	return doc;
}

/* The entry of STATUS's resident list for dir, or NULL. */
static const cJSON *status_file(const cJSON *doc, const char *dir)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(doc, "resident")) {
		if (strcmp(cJSON_GetObjectItem(e, "dir")->valuestring, dir) == 0)
			return e;
	}
	return NULL;
}

/* The line of out that holds needle (a static copy; "" when none). */
static const char *line_of(const char *out, const char *needle)
{
	static char line[1024];
	const char *p = strstr(out, needle), *b = p, *e;

	if (!p)
		return "";
	while (b > out && b[-1] != '\n')
		b--;
	e = strchrnul(p, '\n');
	snprintf(line, sizeof(line), "%.*s", (int)(e - b), b);
	return line;
}

/* A committed save stays resident (STATUS, dsckptctl status and list say so); a save into
 * another tag as large as the cache evicts it; its commit marks it committed; a third tag
 * committed by the daemons after a seal lets the second go. */
START_TEST(test_daemon_resident)
{
	d_start(CACHE_8M, CHUNK_1M);
	const char *dir1 = h_path("%s/job/step1", D->root);
	const char *dir2 = h_path("%s/job/step2", D->root);
	dsckpt_conn_t *cn = conn_open("job", 0, 1);
	void *mem;

	dsckpt_save_t *s = save_pattern(cn, dir1, "rank0", 3 * MIB, 1, &mem);
	wait_level(cn, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	cJSON *doc = status_json();
	const cJSON *e = status_file(doc, dir1);
	ck_assert_ptr_nonnull(e);
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(e, "committed")));
	cJSON_Delete(doc);
	CK_DS(cn, dsckpt_commit(cn, dir1, 30000));

	doc = status_json();
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_resident")->valuedouble, 3.0 * MIB);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "resident")), 1);
	e = status_file(doc, dir1);
	ck_assert_ptr_nonnull(e);
	ck_assert_str_eq(cJSON_GetObjectItem(e, "file")->valuestring, "rank0");
	ck_assert_int_eq(cJSON_GetObjectItem(e, "bytes")->valuedouble, 3.0 * MIB);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(e, "committed")));
	cJSON_Delete(doc);
	char *out = NULL;
	ck_assert_int_eq(ctl(&out, "status"), 0);
	ck_assert_msg(strstr(out, "resident  3.00 MiB in 1 file\n") != NULL, "%s", out);
	ck_assert_msg(strstr(out, h_path("  %s/rank0  3.00 MiB, committed\n", dir1)) != NULL,
		      "%s", out);
	free(out);
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(strstr(line_of(out, "job/step1 "), " cache local"), "%s", out);
	free(out);

	/* 8 MiB into the 8 MiB cache: step1's pieces, the oldest, are evicted first. */
	s = save_pattern(cn, dir2, "rank0", 8 * MIB, 2, &mem);
	wait_level(cn, s, DSCKPT_DURABLE, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	doc = status_json();
	ck_assert_ptr_null(status_file(doc, dir1));
	e = status_file(doc, dir2);
	ck_assert_ptr_nonnull(e);
	ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(e, "committed")));
	double bytes = cJSON_GetObjectItem(e, "bytes")->valuedouble;
	ck_assert(bytes > 0 && bytes <= 8.0 * MIB);
	ck_assert(cJSON_GetObjectItem(doc, "cache_resident")->valuedouble == bytes);
	cJSON_Delete(doc);
	CK_DS(cn, dsckpt_commit(cn, dir2, 30000));
	doc = status_json();
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(status_file(doc, dir2), "committed")));
	cJSON_Delete(doc);
	ck_assert_int_eq(ctl(&out, "list '%s'", D->root), 0);
	ck_assert_msg(!strstr(line_of(out, "job/step1 "), "cache"), "%s", out);
	ck_assert_msg(strstr(line_of(out, "job/step2 "), " cache local"), "%s", out);
	free(out);
	ck_assert_int_eq(ctl(&out, "list --json '%s'", D->root), 0);
	doc = cJSON_Parse(out);
	ck_assert_msg(doc != NULL, "not JSON: %s", out);
	const cJSON *t;
	cJSON_ArrayForEach(t, cJSON_GetObjectItem(doc, "tags")) {
		int step2 = strcmp(cJSON_GetObjectItem(t, "path")->valuestring, "job/step2") == 0;
		ck_assert_int_eq(cJSON_IsTrue(cJSON_GetObjectItem(t, "resident")), step2);
	}
	cJSON_Delete(doc);
	free(out);

	/* A tag the daemon commits after the seal lets step2 go in turn. */
	const char *dir3 = h_path("%s/job/step3", D->root);
	s = save_pattern(cn, dir3, "rank0", MIB, 3, &mem);
	ck_assert_int_eq(dsckpt_seal(cn, dir3), 0);
	wait_level(cn, s, DSCKPT_COMMITTED, 30000);
	dsckpt_save_free(s);
	dsckpt_host_free(mem);
	doc = status_json();
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "resident")), 1);
	ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(status_file(doc, dir3), "committed")));
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_resident")->valuedouble, 1.0 * MIB);
	cJSON_Delete(doc);
	check_pattern_file(dir1, "rank0", 3 * MIB, 1);
	check_pattern_file(dir2, "rank0", 8 * MIB, 2);
	check_pattern_file(dir3, "rank0", MIB, 3);
	dsckpt_close(cn);
	d_stop();
}
END_TEST

/* With keep_resident off nothing stays in the cache. */
START_TEST(test_daemon_off)
{
	d_start(CACHE_8M, CHUNK_1M "\"keep_resident\": false,");
	dsckpt_conn_t *cn = conn_open("job", 0, 1);
	save_and_commit(cn, h_path("%s/job/step1", D->root), 3);
	cJSON *doc = status_json();
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_resident")->valueint, 0);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "resident")), 0);
	ck_assert_int_eq(cJSON_GetObjectItem(doc, "cache_used")->valueint, 0);
	cJSON_Delete(doc);
	dsckpt_close(cn);
	d_stop();
}
END_TEST

/* Builds the suite. */
static Suite *resident_suite(void)
{
	Suite *s = suite_create("resident");
	TCase *tc = tcase_create("cache");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_evict_order);
	tcase_add_test(tc, test_pinned);
	tcase_add_test(tc, test_pin_partial);
	tcase_add_test(tc, test_keep_wakes_waiter);
	tcase_add_test(tc, test_drop);
	tcase_add_test(tc, test_committed);
	tcase_add_test(tc, test_threads);
	suite_add_tcase(s, tc);
	tc = eng_case(s, "engine");
	tcase_add_loop_test(tc, test_engine_stream, 0, 2);
	tcase_add_test(tc, test_engine_fail);
	h_add_case(s, "daemon", test_daemon_resident, 60, 1);
	h_add_case(s, "daemon off", test_daemon_off, 60, 1);
	return s;
}

CHECK_MAIN(resident_suite)
