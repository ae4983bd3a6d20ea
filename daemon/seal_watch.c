/*
 * seal_watch.c — how a node learns that another node committed a tag it sealed. Of the nodes
 * sharing a root, one writes the manifest; every other node's sealed ranks wait for COMMITTED
 * all the same. While a tag waits for the other nodes, its directory is watched: inotify
 * (uv_fs_event) sees a manifest written on this host at once, and a poll of the manifest's
 * name (one fstatat: 100 ms, doubling to 2 s) sees one written by another host of a shared
 * filesystem, where inotify sees nothing (on a local filesystem inotify sees every writer:
 * no poll). When the manifest is there, the watch tells its owner (seal.c), whose look
 * under the job's lock (one open of the manifest, seal_watch_mine) decides whether that
 * manifest is the commit of its own run. The node that collects the records (seal.c) also
 * watches for records: a seal record renamed into place (inotify), or the directory's
 * modification time changed (the poll), tells it too. Loop thread only, but for
 * seal_watch_mine.
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <uv.h>

#define WATCH_POLL_FIRST_MS 100
#define WATCH_POLL_MAX_MS 2000

struct seal_watch {
	uv_fs_event_t ev;       /* inotify on the directory, when it could be started */
	uv_timer_t poll;        /* the look at the manifest's name */
	int have_ev;
	int open;               /* handles not yet closed */
	int dfd;                /* the directory watched (the owner's descriptor, not ours) */
	int records;            /* seal records tell the owner too */
	struct timespec mtime;  /* the directory's, as the last poll saw it */
	uint64_t next_ms;       /* the next poll's delay */
	seal_watch_cb cb;
	void *arg;
	struct seal_names names;  /* records inotify saw come since seal_watch_names */
	size_t cap;
	int polls;              /* the poll runs (another host may write) */
	int lost;               /* an event was missed: seal_watch_names cannot say */
	int others;             /* since seal_watch_relist: a name changed that is no record */
};

/* Whether the directory dfd is on a filesystem only this host writes (a local disk's, or
 * memory's): another host's writes to a shared one (NFS, Lustre, GPFS, CephFS, FUSE, ...)
 * reach no inotify watch here, so only an unknown or shared type is polled. */
static int watch_local(int dfd)
{
	static const unsigned long local[] = {
		0xEF53,      /* ext2, ext3, ext4 */
		0x58465342,  /* xfs */
		0x9123683E,  /* btrfs */
		0x01021994,  /* tmpfs */
		0x2FC12FC1,  /* zfs */
		0xF2F52010,  /* f2fs */
		0x794C7630,  /* overlay (containers) */
	};
	struct statfs sf;

	if (fstatfs(dfd, &sf) < 0)
		return 0;
	for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
		if ((unsigned long)sf.f_type == local[i])
			return 1;
	return 0;
}

/* Whether the watched directory holds a manifest now. */
static int watch_has_manifest(const struct seal_watch *w)
{
	struct stat st;
	return fstatat(w->dfd, FMT_MANIFEST, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Whether the directory changed since the last look (records watched only; one fstat). */
static int watch_dir_changed(struct seal_watch *w)
{
	struct stat st;

	if (!w->records || fstat(w->dfd, &st) < 0 || (st.st_mtim.tv_sec == w->mtime.tv_sec &&
						     st.st_mtim.tv_nsec == w->mtime.tv_nsec))
		return 0;
	w->mtime = st.st_mtim;
	return 1;
}

/* Timer: looks for the manifest (or a change, records watched); tells the owner, and looks
 * again later (the owner's look may have run while the manifest was being written). */
static void on_watch_poll(uv_timer_t *h)
{
	struct seal_watch *w = h->data;
	int changed = watch_dir_changed(w);

	if (changed)
		w->next_ms = WATCH_POLL_FIRST_MS;
	else if (w->next_ms < WATCH_POLL_MAX_MS)
		w->next_ms = w->next_ms * 2 > WATCH_POLL_MAX_MS ? WATCH_POLL_MAX_MS : w->next_ms * 2;
	uv_timer_start(&w->poll, on_watch_poll, w->next_ms, 0);
	if (w->cb && (changed || watch_has_manifest(w)))
		w->cb(w->arg);
}

/* Whether name is a seal record's partial (a record about to be replaced). */
static int watch_partial(const char *name)
{
	char rec[NAME_MAX + 1];
	size_t n = strlen(name), k = strlen(FMT_PARTIAL);

	if (n <= k || n - k >= sizeof(rec) || strcmp(name + n - k, FMT_PARTIAL) != 0)
		return 0;
	memcpy(rec, name, n - k);
	rec[n - k] = '\0';
	return seal_record_name(rec);
}

/* Adds name to the records seen come (once); lost when it cannot. */
static void watch_add_name(struct seal_watch *w, const char *name)
{
	struct seal_names *s = &w->names;

	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i], name) == 0)
			return;
	if (s->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 16;
		char **more = realloc(s->v, cap * sizeof(*more));
		if (!more) {
			w->lost = 1;
			return;
		}
		s->v = more;
		w->cap = cap;
	}
	if (!(s->v[s->n] = strdup(name)))
		w->lost = 1;
	else
		s->n++;
}

/* Frees the names s holds. */
void seal_names_free(struct seal_names *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	*s = (struct seal_names){NULL, 0};
}

/* Hands over into *out (freed first) the names of the seal records inotify saw come since the
 * last call (or the watch's start), the directory listed since the watch started (listed);
 * -1 when the watch cannot say (NULL w, it polls, an event was missed, or not listed): the
 * directory must be listed then, and changes are noted from now. 1 when, besides, inotify
 * saw no other name change since that listing: the listing, with these records, is the
 * directory now (its commit need not list it again). */
int seal_watch_names(struct seal_watch *w, struct seal_names *out, int listed)
{
	seal_names_free(out);
	if (!w)
		return -1;
	if (w->lost || !w->have_ev || !w->cb || w->polls || !listed) {
		seal_names_free(&w->names);
		w->cap = 0;
		w->lost = 0;	/* the listing that follows sees what was missed */
		w->others = 0;
		return -1;
	}
	*out = w->names;
	w->names = (struct seal_names){NULL, 0};
	w->cap = 0;
	return !w->others;
}

/* inotify: a name in the directory changed; the manifest's (or a record's made or renamed
 * into place, records watched) tells the owner. A record is written whole under the job
 * lock, which the owner's look takes: its later changes (its owner, its bytes) say nothing
 * new. Any other name changed makes the last listing old (seal_watch_names). */
static void on_watch_event(uv_fs_event_t *h, const char *name, int events, int status)
{
	struct seal_watch *w = h->data;

	if (!w->cb || status != 0)
		return;
	w->others |= !name || !seal_record_name(name);
	/* The owner's look opens the manifest whether or not it is there: no stat first. */
	if (!name || strcmp(name, FMT_MANIFEST) == 0) {
		w->lost |= !name;
		w->cb(w->arg);
	} else if (w->records && (events & UV_RENAME) && seal_record_name(name)) {
		watch_add_name(w, name);
		w->cb(w->arg);
	} else if (w->records && (events & UV_RENAME) && watch_partial(name)) {
		/* A record replaced (the inode read is not the new one's): the look lists, under
		 * the lock its writer holds until it is done. */
		w->lost = 1;
		w->cb(w->arg);
	}
}

/* Frees a watch once its last handle is closed. */
static void watch_closed(uv_handle_t *h)
{
	struct seal_watch *w = h->data;
	if (--w->open == 0) {
		seal_names_free(&w->names);
		free(w);
	}
}

/* Starts watching dir (open as dfd, which the caller keeps open until seal_watch_stop) for a
 * manifest, and for seal records if records; cb(arg) is called on loop whenever one is seen
 * there. NULL without memory. */
struct seal_watch *seal_watch_start(struct uv_loop_s *loop, const char *dir, int dfd,
				    int records, seal_watch_cb cb, void *arg)
{
	struct stat st;
	struct seal_watch *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return NULL;
	w->dfd = dfd;
	w->records = records;
	w->others = 1;	/* what came before the watch is known to a listing after it alone */
	if (fstat(dfd, &st) == 0)
		w->mtime = st.st_mtim;
	w->cb = cb;
	w->arg = arg;
	w->next_ms = WATCH_POLL_FIRST_MS;
	uv_timer_init(loop, &w->poll);
	w->poll.data = w;
	uv_fs_event_init(loop, &w->ev);
	w->ev.data = w;
	w->open = 2;
	if ((rc = uv_fs_event_start(&w->ev, on_watch_event, dir, 0)) == 0) {
		w->have_ev = 1;
	} else {
		log_debug("seal of %s: no inotify watch (%s); polling for the manifest", dir,
			  uv_strerror(rc));
		uv_close((uv_handle_t *)&w->ev, watch_closed);
	}
	/* On a local filesystem every writer is of this host, and inotify sees it all. */
	if ((w->polls = !w->have_ev || !watch_local(dfd)))
		uv_timer_start(&w->poll, on_watch_poll, w->next_ms, 0);
	return w;
}

/* w, or (NULL, or watching records unless records) a new watch as seal_watch_start makes. */
struct seal_watch *seal_watch_keep(struct seal_watch *w, struct uv_loop_s *loop,
				   const char *dir, int dfd, int records, seal_watch_cb cb,
				   void *arg)
{
	if (w && w->records == records)
		return w;
	seal_watch_stop(w);
	return seal_watch_start(loop, dir, dfd, records, cb, arg);
}

/* Stops and frees a watch (NULL is fine); its callback is not called again. */
void seal_watch_stop(struct seal_watch *w)
{
	if (!w)
		return;
	w->cb = NULL;
	uv_timer_stop(&w->poll);
	uv_close((uv_handle_t *)&w->poll, watch_closed);
	if (w->have_ev) {
		uv_fs_event_stop(&w->ev);
		uv_close((uv_handle_t *)&w->ev, watch_closed);
	}
}

/* Threadpool: whether the manifest in the tag dfd is the commit of run by world ranks (its
 * saves of run are then COMMITTED), and whether there is one: one open either way. */
int seal_watch_mine(int dfd, const char *run, unsigned world, int *present)
{
	char why[200];
	/* What it says of itself: the records it names are not read. */
	struct manifest *m = manifest_load_at(dfd, FMT_MANIFEST, present, why, sizeof(why));
	int mine = m && m->world_size == world && strcmp(m->run ? m->run : "", run) == 0;

	manifest_free(m);
	return mine;
}

/* Threadpool: whether the tag dfd (named tag in jobfd) is committed already, so that no record
 * is added beside its manifest: said by the listing l when the look lists (no name looked
 * up), else by an open of the manifest and a look at the tag's name (a new version exchanged
 * with it is committed); *mine: the manifest commits run by world ranks. */
int seal_watch_committed(int dfd, int jobfd, const char *tag, const char *run, unsigned world,
			 const struct seal_listing *l, int *mine)
{
	int present = 0;

	if (l && !l->manifest)
		return 0;
	*mine = seal_watch_mine(dfd, run, world, &present);
	return present || (!l && !store_dir_at(jobfd, tag, dfd));
}
