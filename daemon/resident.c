/*
 * resident.c — the hot set: the cache chunks of files just saved, kept once a flush thread
 * has written them (instead of going back to the cache), so that a load on this node needs
 * no disk. Nothing is reserved for them: whenever the cache has no free chunk, cache_get and
 * cache_tryget call resident_evict, which gives one kept chunk back; only pinned files (a
 * load reading them) keep theirs, so a save never waits for chunks a resident holds.
 *
 * A resident is one file: piece i holds the data bytes [i * chunk, i * chunk + chunk) of its
 * data region, exactly as written (engine.c cuts a job the same way and flush_file.c writes the
 * chunk as it is). Its life:
 *
 *   resident_begin (loop, save_end) → resident_keep per piece (the flush thread holding the
 *   job) → resident_durable (that thread: dev/ino and header; now a load may find it) or
 *   resident_drop (failure, cancel) → let go by resident_committed (loop: a newer tag of
 *   its job was committed), by a newer copy of the same file, or once eviction took its last
 *   piece.
 *
 * Ownership: a resident is held by up to three parties, and freed when the last lets go:
 * the registry (listed, from resident_begin until it is let go), its writer (writing, the
 * job that fills it, from resident_begin until resident_durable or resident_drop) and loads
 * (pins). A resident let go while written or pinned is unlisted at once and its pieces go
 * back when the pins end; one let go while written keeps nothing more.
 *
 * Eviction order: the list runs oldest first (by resident_begin); the hook takes the lowest
 * piece still held of the first file that holds any and is not pinned. A save larger than
 * the cache thus streams through it: its own earlier pieces go once nothing older is left.
 *
 * Waiters: a cache_get that found nothing to evict waits for a chunk; keeping a chunk (and
 * unpinning a file) makes one evictable without putting any back, so resident.c tells the
 * cache (cache_evictable), which wakes its waiters to try the hook again.
 *
 * Pins: a load pins a durable copy; the restore threads read its pieces while no piece of it
 * can go. A partial copy is trimmed at pin time so that partial pinned copies hold at most
 * the cache less an eighth (at least one chunk): a restore that reads the rest of such a file
 * from disk needs chunks of its own, and the pinned pieces could otherwise hold them all.
 *
 * Lock order: hot_set.lock, then the cache's lock (cache_put and cache_evictable are called
 * with hot_set.lock held; the cache calls resident_evict without its own lock). No caller
 * holds engine.lock while calling in here. hot_set.lock guards the list, hot_set.bytes and every
 * field marked (H); the others are set before the resident is shared or, for the durable
 * identity and header, before it can be pinned (under the lock).
 */
#include "dsckptd.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESIDENT_DIR_MAX 4096

struct resident {
	char *dir;                 /* normalized tag directory */
	char *file;                /* name without ".safetensors" */
	uid_t uid;
	uint64_t data_len;
	uint64_t npieces;
	uint64_t seq;              /* resident_begin order */
	void **pieces;             /* (H) npieces slots: the kept chunk, or NULL */
	uint64_t nheld;            /* (H) pieces held */
	uint64_t held;             /* (H) data bytes held */
	uint64_t low;              /* (H) no piece below this one is held */
	int listed;                /* (H) in the registry: a load may find it once durable */
	int writing;               /* (H) its job has not yet ended it (durable or drop) */
	unsigned pins;             /* (H) loads reading it */
	int durable;               /* (H) */
	int committed;             /* (H) its tag was committed */
	dev_t dev;                 /* the file, once durable */
	ino_t ino;
	uint8_t *hdr;              /* the file's first hdr_len bytes, once durable */
	size_t hdr_len;
	struct resident *prev, *next; /* (H) registry links, oldest first */
};

/* The hot set: the registry of resident files, oldest first, and the cache they keep. */
static struct {
	pthread_mutex_t lock;
	struct cache *cache;
	uint64_t chunk;
	uint64_t nchunks;
	int enabled;               /* (H) */
	uint64_t seq;              /* (H) */
	uint64_t bytes;            /* (H) cache bytes held by every resident */
	struct resident *head;     /* (H) */
	struct resident *tail;     /* (H) */
} hot_set = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Data bytes of piece i of r. */
static uint64_t piece_len(const struct resident *r, uint64_t i)
{
	uint64_t start = i * hot_set.chunk;
	return r->data_len - start < hot_set.chunk ? r->data_len - start : hot_set.chunk;
}

/* Gives piece i of r back to the cache (lock held; the piece is held). */
static void give_piece(struct resident *r, uint64_t i)
{
	void *chunk = r->pieces[i];

	r->pieces[i] = NULL;
	r->nheld--;
	r->held -= piece_len(r, i);
	hot_set.bytes -= hot_set.chunk;
	cache_put(hot_set.cache, chunk);
}

/* Gives the lowest piece r holds back (lock held; r holds one). */
static void give_lowest(struct resident *r)
{
	while (r->pieces[r->low] == NULL)
		r->low++;
	give_piece(r, r->low);
}

/* Gives every piece of r back (lock held). */
static void give_all(struct resident *r)
{
	for (uint64_t i = r->low; r->nheld > 0 && i < r->npieces; i++)
		if (r->pieces[i])
			give_piece(r, i);
}

/* Frees r once no party holds it (lock held); 1 when freed. */
static int maybe_free(struct resident *r)
{
	if (r->listed || r->writing || r->pins)
		return 0;
	give_all(r);
	free(r->pieces);
	free(r->hdr);
	free(r->dir);
	free(r->file);
	free(r);
	return 1;
}

/* Takes r out of the registry: nothing finds it any more; its pieces go back now unless a
 * load pins it (then at the last unpin). The caller then calls maybe_free (lock held). */
static void unlist(struct resident *r)
{
	if (!r->listed)
		return;
	r->listed = 0;
	if (r->prev)
		r->prev->next = r->next;
	else
		hot_set.head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		hot_set.tail = r->prev;
	r->prev = r->next = NULL;
	if (!r->pins)
		give_all(r);
}

/* Unlists r and frees it when nobody else holds it (lock held). */
static void let_go(struct resident *r)
{
	unlist(r);
	maybe_free(r);
}

/* The cache's eviction hook: gives one chunk of the oldest unpinned resident back; 1 when
 * one went back, 0 when none can (every held piece is pinned, or none is held). */
static int resident_evict(struct cache *c)
{
	int got = 0;

	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.head; r; r = r->next) {
		if (r->pins || r->nheld == 0)
			continue;
		give_lowest(r);
		got = 1;
		/* A finished copy with nothing left is of no use to a load. */
		if (r->nheld == 0 && !r->writing)
			let_go(r);
		break;
	}
	pthread_mutex_unlock(&hot_set.lock);
	return got;
}

/* Starts keeping (when enabled) and hooks eviction into cache c; again (a reload) changes
 * only whether new files are kept. */
void resident_init(struct cache *c, int enabled)
{
	pthread_mutex_lock(&hot_set.lock);
	hot_set.enabled = enabled;
	if (hot_set.cache != c) {
		hot_set.cache = c;
		hot_set.chunk = cache_chunk(c);
		hot_set.nchunks = cache_total(c) / hot_set.chunk;
		cache_set_evict(c, resident_evict);
	}
	pthread_mutex_unlock(&hot_set.lock);
}

/* A save's file about to be written into dir/file (data_len bytes in cache-chunk pieces),
 * of uid; NULL when nothing is kept (disabled, no memory). Loop thread. */
struct resident *resident_begin(const char *dir, const char *file, uid_t uid,
				uint64_t data_len)
{
	struct resident *r;
	int enabled;

	pthread_mutex_lock(&hot_set.lock);
	enabled = hot_set.enabled && hot_set.cache;
	pthread_mutex_unlock(&hot_set.lock);
	if (!enabled || strlen(dir) >= RESIDENT_DIR_MAX || !(r = calloc(1, sizeof(*r))))
		return NULL;
	r->dir = strdup(dir);
	r->file = strdup(file);
	r->uid = uid;
	r->data_len = data_len;
	r->npieces = (data_len + hot_set.chunk - 1) / hot_set.chunk;
	r->pieces = calloc(r->npieces ? r->npieces : 1, sizeof(void *));
	if (!r->dir || !r->file || !r->pieces) {
		free(r->dir);
		free(r->file);
		free(r->pieces);
		free(r);
		return NULL;
	}
	r->listed = 1;
	r->writing = 1;
	pthread_mutex_lock(&hot_set.lock);
	r->seq = ++hot_set.seq;
	r->prev = hot_set.tail;
	if (hot_set.tail)
		hot_set.tail->next = r;
	else
		hot_set.head = r;
	hot_set.tail = r;
	pthread_mutex_unlock(&hot_set.lock);
	return r;
}

/* Keeps the flushed chunk of piece i (the flush thread writing r's file): 1 kept, 0 the
 * caller puts it back (r was let go meanwhile, or NULL). */
int resident_keep(struct resident *r, uint64_t piece, void *chunk)
{
	int kept = 0;

	if (!r)
		return 0;
	pthread_mutex_lock(&hot_set.lock);
	if (r->listed && r->writing && piece < r->npieces && !r->pieces[piece]) {
		/* Ownership: the chunk is the resident's until it is given back. */
		r->pieces[piece] = chunk;
		r->nheld++;
		r->held += piece_len(r, piece);
		hot_set.bytes += hot_set.chunk;
		if (piece < r->low)
			r->low = piece;
		kept = 1;
		/* A taker waiting for a chunk may now evict this one. */
		cache_evictable(hot_set.cache);
	}
	pthread_mutex_unlock(&hot_set.lock);
	return kept;
}

/* Whether a and b name the same file. */
static int same_file(const struct resident *a, const struct resident *b)
{
	return strcmp(a->dir, b->dir) == 0 && strcmp(a->file, b->file) == 0;
}

/* The file is durable as dev/ino with header hdr (copied): from now on a load may find it,
 * and an older copy of the same file is let go. Its writer lets go of r. */
void resident_durable(struct resident *r, dev_t dev, ino_t ino, const void *hdr,
		      size_t hdr_len)
{
	uint8_t *copy = malloc(hdr_len ? hdr_len : 1);

	if (copy)
		memcpy(copy, hdr, hdr_len);
	pthread_mutex_lock(&hot_set.lock);
	r->writing = 0;
	if (r->listed && copy) {
		r->hdr = copy;
		r->hdr_len = hdr_len;
		r->dev = dev;
		r->ino = ino;
		r->durable = 1;
		copy = NULL;
		for (struct resident *o = hot_set.head, *next; o; o = next) {
			next = o->next;
			if (o != r && same_file(o, r))
				let_go(o);
		}
	} else {
		unlist(r);	/* without its header no load could use it */
	}
	maybe_free(r);
	pthread_mutex_unlock(&hot_set.lock);
	free(copy);
}

/* The save failed or was abandoned: every kept chunk goes back; its writer lets go of r. */
void resident_drop(struct resident *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&hot_set.lock);
	r->writing = 0;
	let_go(r);
	pthread_mutex_unlock(&hot_set.lock);
}

/* Length of dir's parent (the job directory) in dir; 0 when dir has no '/' past its first
 * character. */
static size_t job_len(const char *dir)
{
	const char *slash = strrchr(dir, '/');
	return slash && slash != dir ? (size_t)(slash - dir) : 0;
}

/* Whether r lies in the job directory of length n at job. */
static int in_job(const struct resident *r, const char *job, size_t n)
{
	return job_len(r->dir) == n && strncmp(r->dir, job, n) == 0;
}

/*
 * dir was committed (loop thread): its residents are marked committed, and of its job only
 * the newest committed tag stays: the residents of the job's other committed tags go, and
 * so do uncommitted ones begun before dir's (an older tag, never to be the newest). Tags
 * begun later, still being saved, stay until they commit or are evicted. Which tag is newer
 * is judged by when their residents began here; a dir with none here (evicted, or saved
 * elsewhere) counts as newer than every committed tag and says nothing of uncommitted ones.
 */
static void resident_committed_tag(const char *dir)
{
	size_t n = job_len(dir);
	uint64_t cseq = UINT64_MAX;
	int newer = 0, here = 0;

	if (n == 0)
		return;
	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.head; r; r = r->next) {
		if (strcmp(r->dir, dir) == 0) {
			r->committed = 1;
			here = 1;
			if (r->seq < cseq)
				cseq = r->seq;
		}
	}
	for (struct resident *r = hot_set.head, *next; r; r = next) {
		next = r->next;
		if (strcmp(r->dir, dir) == 0 || !in_job(r, dir, n))
			continue;
		if (r->seq < cseq && (r->committed || here))
			let_go(r);	/* an older tag, committed or not */
		else if (r->committed)
			newer = 1;	/* a newer tag was committed first: dir is the old one */
	}
	for (struct resident *r = hot_set.head, *next; newer && r; r = next) {
		next = r->next;
		if (strcmp(r->dir, dir) == 0)
			let_go(r);
	}
	pthread_mutex_unlock(&hot_set.lock);
}

/* dir was committed (loop thread): a staging directory's files now lie in its tag, whose old
 * version's resident copies go; then the tag's older tags are let go as above. */
void resident_committed(const char *dir)
{
	char tag[NAME_MAX + 1], path[PATH_MAX];
	const char *slash = strrchr(dir, '/');

	if (!slash || store_tag_version(slash + 1, tag, sizeof(tag)) != 1) {
		resident_committed_tag(dir);
		return;
	}
	snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - dir), dir, tag);
	resident_moved(dir, path);
	resident_committed_tag(path);
}

/* The files of dir now lie in to (a staging directory exchanged with its tag, loop thread):
 * the copies of to's old version go (a pinned one stays readable until its unpin), and dir's
 * are to's from now on. */
void resident_moved(const char *dir, const char *to)
{
	char *copy;

	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.head, *next; r; r = next) {
		next = r->next;
		if (strcmp(r->dir, to) == 0)
			let_go(r);
	}
	for (struct resident *r = hot_set.head; r; r = r->next) {
		if (strcmp(r->dir, dir) == 0 && (copy = strdup(to))) {
			free(r->dir);
			r->dir = copy;
		}
	}
	pthread_mutex_unlock(&hot_set.lock);
}

/* Trims r (about to be pinned, lock held) so that partial pinned copies leave a reader of
 * the rest of such a file chunks to read into: at most the cache less an eighth (at least
 * one chunk) stays pinned in partial copies. A complete copy needs no chunk: it stays; one
 * pinned already is being read: it stays too (and is counted already). */
static void trim_for_pin(struct resident *r)
{
	uint64_t reserve = hot_set.nchunks / 8 ? hot_set.nchunks / 8 : 1, pinned = 0;

	if (r->nheld == r->npieces || r->pins)
		return;
	for (struct resident *o = hot_set.head; o; o = o->next)
		if (o->pins && o->nheld < o->npieces)
			pinned += o->nheld;
	while (r->nheld > 0 && pinned + r->nheld + reserve > hot_set.nchunks)
		give_lowest(r);
}

/* Finds the durable copy of dir/file still identical to the file dev/ino and pins it: no
 * piece of it is given up until resident_unpin. NULL if none. */
struct resident *resident_pin(const char *dir, const char *file, dev_t dev, ino_t ino)
{
	struct resident *found = NULL;

	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.tail; r; r = r->prev) {
		if (r->durable && r->dev == dev && r->ino == ino && strcmp(r->dir, dir) == 0 &&
		    strcmp(r->file, file) == 0) {
			found = r;
			break;
		}
	}
	if (found) {
		trim_for_pin(found);
		found->pins++;
	}
	pthread_mutex_unlock(&hot_set.lock);
	return found;
}

/* A pinned copy's header: the file's first *len bytes. */
const void *resident_header(const struct resident *r, size_t *len)
{
	*len = r->hdr_len;
	return r->hdr;
}

/* Piece i of a pinned copy (data bytes [i * chunk, ...)), or NULL when not held. */
const void *resident_piece(const struct resident *r, uint64_t i)
{
	const void *p;

	pthread_mutex_lock(&hot_set.lock);
	p = i < r->npieces ? r->pieces[i] : NULL;
	pthread_mutex_unlock(&hot_set.lock);
	return p;
}

/* Data bytes of a pinned copy still held. */
uint64_t resident_held(const struct resident *r)
{
	uint64_t held;

	pthread_mutex_lock(&hot_set.lock);
	held = r->held;
	pthread_mutex_unlock(&hot_set.lock);
	return held;
}

/* Ends a pin: the pieces may go again (freed now if it was let go meanwhile). */
void resident_unpin(struct resident *r)
{
	pthread_mutex_lock(&hot_set.lock);
	if (--r->pins == 0) {
		if (r->listed && r->nheld == 0 && r->npieces > 0)
			unlist(r);	/* trimmed to nothing at its pin: of no use any more */
		if (!r->listed)
			give_all(r);
		if (!maybe_free(r) && r->nheld > 0)
			cache_evictable(hot_set.cache);	/* its pieces may be evicted now */
	}
	pthread_mutex_unlock(&hot_set.lock);
}

/* Cache bytes held by resident files now (whole chunks). */
uint64_t resident_bytes(void)
{
	uint64_t b;

	pthread_mutex_lock(&hot_set.lock);
	b = hot_set.bytes;
	pthread_mutex_unlock(&hot_set.lock);
	return b;
}

/* Data bytes held by every resident file now. */
uint64_t resident_data_bytes(void)
{
	uint64_t b = 0;

	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.head; r; r = r->next)
		b += r->held;
	pthread_mutex_unlock(&hot_set.lock);
	return b;
}

/* Calls fn for each durable resident file, oldest first, under the lock (fn must not call
 * into resident.c). */
void resident_each(void (*fn)(void *arg, const char *dir, const char *file, uid_t uid,
			      uint64_t bytes, int committed), void *arg)
{
	pthread_mutex_lock(&hot_set.lock);
	for (struct resident *r = hot_set.head; r; r = r->next)
		if (r->durable)
			fn(arg, r->dir, r->file, r->uid, r->held, r->committed);
	pthread_mutex_unlock(&hot_set.lock);
}

/* Gives every chunk back and frees every resident nobody writes (shutdown: the engine and
 * the restore threads are stopped). */
void resident_free_all(void)
{
	pthread_mutex_lock(&hot_set.lock);
	while (hot_set.head) {
		struct resident *r = hot_set.head;
		r->pins = 0;
		let_go(r);
	}
	pthread_mutex_unlock(&hot_set.lock);
}
