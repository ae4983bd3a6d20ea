/*
 * recover.c — start-up recovery: what an interrupted daemon left under the allowed roots.
 *
 * Files are written as *.partial and renamed, and a tag is committed exactly when its
 * MANIFEST.json exists; after a crash, partial files and the files of tags without a manifest
 * remain. The roots may be a filesystem every node of a job shares, where other nodes' daemons
 * write the same tags right now, so recovery removes only what this host wrote, as the
 * "dsckpt.host" of a safetensors header (store_st_host) says, and what is old enough that no
 * one can still be writing it. A tag whose commit was interrupted after its manifest was
 * written whole is finished instead, and each job's `latest` and keep_last are repaired
 * (store_latest.c): `latest` then names the newest committed tag. The files of ranks this
 * node's seal record names stay (the tag may still be completed and committed by the daemons:
 * the record is handed to the caller to take up), and only the unsealed ranks' files go.
 *
 * The trees are users' and recovery runs before the daemon is ready, so it follows the rules
 * of a save and bounds its work. A tag is at least two levels below a root and a job one
 * (<root>/<job>/<tag>): nothing is removed, finished or written at the root itself, `latest`
 * only in a job directory, as that directory's owner, and retention keeps to what that owner
 * owns (retention.c). Files are opened as userfile_open does (no FIFO, device or link), a file
 * with more than one link is not read (dsckptd never makes one), of a header only its first
 * STORE_HEADER_PREFIX bytes (store_host.c). Each user (the owner of a directory directly below
 * a root) may cost max_recovery_entries_per_user directory entries and
 * max_recovery_mib_per_user read; past that, the rest of the user's tree is left as it is,
 * with one line in the log. A tag's staging directory (store_swap.c: a committed tag saved
 * again) is rolled forward or removed by swap_recover, or recovered as an uncommitted tag and
 * removed at once once empty.
 */
#include "dsckptd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECOVER_DEPTH 8     /* directory levels below a root that are searched */
#define RECOVER_STALE_S 900 /* a *.partial of unknown host younger than this may be in use */

/* One user's share of a recovery pass. */
struct recover_user {
	uid_t uid;
	struct store_budget b;
	int logged; /* its budget ran out and the log says so */
};

/* A sealed tag found, handed to on_sealed once the pass is over. */
struct recover_sealed {
	struct recover_sealed *next;
	char *path;
	struct seal_record r;
	uid_t uid;
	gid_t gid;
};

/* Counters of one recovery pass. */
struct recover_stats {
	struct recover_sealed *sealed; /* newest first */
	struct recover_user *users;
	size_t nusers;
	unsigned spent;    /* users whose trees were left part unchecked */
	unsigned dirs;
	unsigned partials;
	unsigned files;
	unsigned tags;
	unsigned left;  /* files another host wrote */
	unsigned fresh; /* partial files of unknown host, too recent to remove */
	unsigned finished; /* interrupted commits finished */
	unsigned resumed;  /* sealed tags handed to on_sealed */
	recover_sealed_cb on_sealed;
};

/* Who wrote a file, as its safetensors header says. */
enum recover_writer {
	RECOVER_UNKNOWN, /* no readable header with dsckpt metadata */
	RECOVER_OLD,     /* dsckpt metadata without "dsckpt.host" (written before it existed) */
	RECOVER_MINE,    /* "dsckpt.host" is this machine */
	RECOVER_OTHER,   /* "dsckpt.host" is another machine */
};

/* Charges one header read to b; 0, or -1 (b spent) when it is over. */
static int recover_take_header(struct store_budget *b)
{
	if (b->spent || b->bytes < STORE_HEADER_PREFIX) {
		b->spent = 1;
		return -1;
	}
	b->bytes -= STORE_HEADER_PREFIX;
	return 0;
}

/* Which host wrote the safetensors file (or partial) dirfd/name, its header read within b
 * (unknown once b is spent); another's name into host. */
static enum recover_writer recover_writer(int dirfd, const char *name, char *host,
					  size_t hostlen, struct store_budget *b)
{
	if (recover_take_header(b) < 0)
		return RECOVER_UNKNOWN;
	switch (store_st_host(dirfd, name, host, hostlen)) {
	case 0:
		return RECOVER_OLD;
	case 1:
		return strcmp(host, store_host()) == 0 ? RECOVER_MINE : RECOVER_OTHER;
	default:
		return RECOVER_UNKNOWN;
	}
}

/*
 * Which host wrote our partial file dirfd/name. A safetensors partial says so once its header
 * is written; a .meta partial is written while its safetensors sibling holds its final header,
 * so the sibling answers for it. MANIFEST.json and latest partials name no host.
 */
static enum recover_writer recover_partial_writer(int dirfd, const char *name, char *host,
					      size_t hostlen, struct store_budget *b)
{
	static const char *const sibs[] = {FMT_SAFETENSORS FMT_PARTIAL, FMT_SAFETENSORS};
	char stem[NAME_MAX + 1], sib[NAME_MAX + 1];
	size_t n = strlen(name) - strlen(FMT_PARTIAL);

	snprintf(stem, sizeof(stem), "%.*s", (int)n, name);
	if (store_has_suffix(stem, FMT_SAFETENSORS)) {
		enum recover_writer w = recover_writer(dirfd, name, host, hostlen, b);
		/* No header yet (killed before the first flush): the xattr set at its creation. */
		if (w == RECOVER_UNKNOWN && store_xattr_host(dirfd, name, host, hostlen) == 1)
			w = strcmp(host, store_host()) == 0 ? RECOVER_MINE : RECOVER_OTHER;
		return w;
	}
	if (seal_record_host(stem, host, hostlen) == 0)	/* its name says whose */
		return strcmp(host, store_host()) == 0 ? RECOVER_MINE : RECOVER_OTHER;
	if (!store_has_suffix(stem, FMT_META))
		return RECOVER_UNKNOWN;
	stem[n - strlen(FMT_META)] = '\0';
	for (size_t i = 0; i < sizeof(sibs) / sizeof(sibs[0]); i++) {
		int len = snprintf(sib, sizeof(sib), "%s%s", stem, sibs[i]);
		if (len < 0 || (size_t)len >= sizeof(sib) || !store_is_regular(dirfd, sib))
			continue;
		enum recover_writer w = recover_writer(dirfd, sib, host, hostlen, b);
		if (w != RECOVER_UNKNOWN)
			return w;
	}
	return RECOVER_UNKNOWN;
}

/* Whether st was last modified RECOVER_STALE_S or more ago (a time in the future is recent). */
static int recover_is_stale(const struct stat *st)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	return now.tv_sec - st->st_mtim.tv_sec >= RECOVER_STALE_S;
}

/* Removes dirfd/name (a leftover of ours) and logs why; 1 if it was removed. */
static int recover_unlink(int dirfd, const char *path, const char *name, const char *why)
{
	if (unlinkat(dirfd, name, 0) < 0) {
		log_warn("recovery: cannot remove %s/%s", path, name);
		return 0;
	}
	log_warnx("removed %s %s/%s", why, path, name);
	return 1;
}

/* What recovery left in one directory because another node may be writing it. */
struct recover_left {
	unsigned files;            /* files whose header names another host */
	unsigned fresh;            /* partial files of unknown host, modified recently */
	int several;               /* the files name more than one host */
	char host[STORE_HOST_MAX]; /* the first host named */
};

/* Counts one file of host as left. */
static void recover_left_add(struct recover_left *l, const char *host)
{
	if (l->files++ == 0)
		snprintf(l->host, sizeof(l->host), "%s", host);
	else if (strcmp(l->host, host) != 0)
		l->several = 1;
}

/*
 * Removes the .meta file beside the safetensors partial name (just removed) in a tag without a
 * manifest: a flush renames a file's .meta into place right before the file itself, so a crash
 * between the two leaves that .meta, of the same uncommitted save, without its file.
 */
static void recover_partial_meta(int dirfd, const char *path, const char *name)
{
	char meta[NAME_MAX + 1];
	size_t n = strlen(name) - strlen(FMT_SAFETENSORS FMT_PARTIAL);

	if (!store_has_suffix(name, FMT_SAFETENSORS FMT_PARTIAL) ||
	    faccessat(dirfd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return;
	snprintf(meta, sizeof(meta), "%.*s" FMT_META, (int)n, name);
	if (store_is_regular(dirfd, meta))
		recover_unlink(dirfd, path, meta, "file of an uncommitted checkpoint:");
}

/*
 * Removes our partial file dirfd/name (stat st) if this host wrote it, or if it names no host
 * and has not been modified for RECOVER_STALE_S (a safetensors partial with the .meta it left,
 * recover_partial_meta); 1 if it was removed. A partial this host left
 * before any header was in it (a crash before the first flush), or a MANIFEST.json or latest
 * partial, looks like one another node is writing: it stays until a restart after the grace
 * period, or until the same file is written again (store_file_create replaces it). Left there
 * it is never reported as committed.
 */
static int recover_partial(int fd, const char *path, const char *name,
				 const struct stat *st, struct recover_left *l,
				 struct store_budget *b)
{
	char host[STORE_HOST_MAX];
	enum recover_writer w = recover_partial_writer(fd, name, host, sizeof(host), b);

	if (b->spent)
		return 0;	/* over budget: not looked at, left as it is */
	if (w == RECOVER_OTHER) {
		recover_left_add(l, host);
		return 0;
	}
	if (w != RECOVER_MINE && !recover_is_stale(st)) {
		l->fresh++;
		return 0;
	}
	if (!recover_unlink(fd, path, name, w == RECOVER_MINE ?
			    "partial file left by an interrupted write:" :
			    "stale partial file that names no host:"))
		return 0;
	recover_partial_meta(fd, path, name);
	return 1;
}

/* Reads the seal record fd/name into r, within b; 1 when it is a sound one (a regular file of
 * one link). */
static int recover_seal_read(int fd, const char *name, struct seal_record *r,
			     struct store_budget *b)
{
	struct stat st;

	if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
	    st.st_nlink > 1)
		return 0;
	if ((uint64_t)st.st_size > b->bytes) {
		b->spent = 1;
		return 0;
	}
	b->bytes -= (uint64_t)st.st_size;
	return store_seal_read(fd, name, r) == 0;
}

/* Reads this node's seal record among the tag fd's names (n) into r, its name into own,
 * within b: of several (a node whose ranks sealed late writes another), the one naming the
 * most ranks; 1 when there is a sound one. */
static int recover_seal_record(int fd, char **names, size_t n, struct seal_record *r,
			       char *own, size_t ownlen, struct store_budget *b)
{
	char host[STORE_HOST_MAX];
	int found = 0;

	for (size_t i = 0; i < n && !b->spent; i++) {
		struct seal_record got;
		if (seal_record_host(names[i], host, sizeof(host)) < 0 ||
		    strcmp(host, store_host()) != 0 || !recover_seal_read(fd, names[i], &got, b))
			continue;
		if (found && got.nranks <= r->nranks) {
			seal_record_free(&got);
			continue;
		}
		if (found)
			seal_record_free(r);
		*r = got;
		snprintf(own, ownlen, "%s", names[i]);
		found = 1;
	}
	return found;
}

/* Whether the safetensors file fd/name is of a rank the seal record names (NULL: none); when
 * its header cannot be read within b, it is kept as if it were. */
static int recover_sealed(int fd, const char *name, const struct seal_record *sealed,
			  struct store_budget *b)
{
	char rank[16];

	if (!sealed)
		return 0;
	if (recover_take_header(b) < 0)
		return 1;
	if (store_st_rank(fd, name, rank, sizeof(rank)) < 0)
		return 0;
	for (unsigned i = 0; i < sealed->nranks; i++) {
		char r[16];
		snprintf(r, sizeof(r), "%u", sealed->ranks[i]);
		if (strcmp(r, rank) == 0)
			return 1;
	}
	return 0;
}

/*
 * Removes the files of the manifest-less tag in fd that this host wrote (or that name no host,
 * from before hosts were recorded): each safetensors file and its .meta. Files of another host
 * are counted in l and left. Returns how many files it removed.
 */
static unsigned recover_tag(int fd, const char *path, char **names, size_t n,
				  const struct seal_record *sealed, struct recover_left *l,
				  struct store_budget *b)
{
	char host[STORE_HOST_MAX], meta[NAME_MAX + 1];
	unsigned removed = 0;

	for (size_t i = 0; i < n; i++) {
		if (!store_has_suffix(names[i], FMT_SAFETENSORS) || !store_is_regular(fd, names[i]))
			continue;
		enum recover_writer w = recover_writer(fd, names[i], host, sizeof(host), b);
		if (w == RECOVER_UNKNOWN || recover_sealed(fd, names[i], sealed, b))
			continue;
		size_t base = strlen(names[i]) - strlen(FMT_SAFETENSORS);
		snprintf(meta, sizeof(meta), "%.*s.meta", (int)base, names[i]);
		int has_meta = store_is_regular(fd, meta);
		if (w == RECOVER_OTHER) {
			recover_left_add(l, host);
			if (has_meta)
				recover_left_add(l, host);
			continue;
		}
		removed += (unsigned)recover_unlink(fd, path, names[i],
						  "file of an uncommitted checkpoint:");
		if (has_meta)
			removed += (unsigned)recover_unlink(fd, path, meta,
							  "file of an uncommitted checkpoint:");
	}
	return removed;
}

/* Keeps this node's seal record r of the tag fd (at path, named name; r is taken over) for
 * on_sealed, with the record's owner. */
static void recover_keep_sealed(struct recover_stats *s, int fd, const char *path,
				const char *name, struct seal_record *r)
{
	struct recover_sealed *k;
	struct stat rs;

	if (!s->on_sealed || fstatat(fd, name, &rs, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	if (!(k = calloc(1, sizeof(*k))) || !(k->path = strdup(path))) {
		log_warnx("recovery: out of memory; the seals of %s are not taken up", path);
		free(k);
		return;
	}
	k->r = *r;
	*r = (struct seal_record){0};
	k->uid = rs.st_uid;
	k->gid = rs.st_gid;
	k->next = s->sealed;
	s->sealed = k;
}

/*
 * Hands every sealed tag found to on_sealed, and frees them. Only now: taking a tag up starts
 * work in the threadpool that takes its job's lock, which recovery takes without waiting.
 */
static void recover_hand_sealed(struct recover_stats *s)
{
	while (s->sealed) {
		struct recover_sealed *k = s->sealed;
		s->sealed = k->next;
		s->on_sealed(k->path, &k->r, k->uid, k->gid);
		s->resumed++;
		seal_record_free(&k->r);
		free(k->path);
		free(k);
	}
}

/* Whether dirfd/name is a directory holding a MANIFEST.json that is a regular file. */
static int recover_has_manifest(int dirfd, const char *name)
{
	char p[NAME_MAX + sizeof("/" FMT_MANIFEST)];
	struct stat st;

	snprintf(p, sizeof(p), "%s/" FMT_MANIFEST, name);
	return fstatat(dirfd, p, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/*
 * Cleans one directory at depth levels below its root (1: a job directory) and, up to the
 * depth limit, those below it: our *.partial files (in a job directory only latest's) and,
 * from depth 2 on (a tag), the files of a tag without a manifest, where this host wrote them
 * (see recover_run); then repairs the job when a tag below it is committed. Everything is
 * charged to the user's budget u, and nothing more is done once it is spent. Returns whether
 * it removed anything here, so that the caller may remove the directory once it is empty:
 * only a directory unmodified for RECOVER_STALE_S, which no other node is filling.
 */
static int recover_dir(const struct config *cfg, int fd, const char *path, int depth,
		       struct recover_user *u, struct recover_stats *s)
{
	struct seal_record sealed = {0};
	struct recover_left l = {0};
	struct store_budget *b = &u->b;
	char **names, sub[PATH_MAX];
	size_t n;
	int removed = 0, manifest = 0, tensors = 0, committed_tags = 0;

	s->dirs++;
	if (store_list_within(fd, b, &names, &n) < 0) {
		if (errno != E2BIG)
			log_warn("recovery: cannot list %s", path);
		return 0;
	}
	/* An interrupted commit whose manifest is whole is finished, not cleaned up. */
	if (depth >= 2 && faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
	    faccessat(fd, FMT_MANIFEST FMT_PARTIAL, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		manifest = store_finish_manifest(fd, path, b);
		s->finished += (unsigned)manifest;
	}
	for (size_t i = 0; i < n && !b->spent; i++) {
		struct stat st;
		if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < RECOVER_DEPTH) {
			char tag[NAME_MAX + 1];
			int staging = store_tag_version(names[i], tag, sizeof(tag));
			/* A tag saved again: its new version rolled forward, or removed. */
			if (staging && swap_recover(fd, path, names[i], b)) {
				committed_tags = 1;
				continue;
			}
			int cfd = openat(fd, names[i], STORE_DIR_FLAGS);
			if (cfd < 0)
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, names[i]);
			int emptied = recover_dir(cfg, cfd, sub, depth + 1, u, s);
			committed_tags |= recover_has_manifest(fd, names[i]);
			close(cfd);
			if ((staging || (emptied && recover_is_stale(&st))) &&
			    unlinkat(fd, names[i], AT_REMOVEDIR) == 0)
				log_warnx("removed empty directory %s", sub);
		} else if (S_ISREG(st.st_mode)) {
			if (store_is_our_partial(names[i]) &&
			    (depth >= 2 || strcmp(names[i], FMT_LATEST FMT_PARTIAL) == 0)) {
				int r = recover_partial(fd, path, names[i], &st, &l, b);
				s->partials += (unsigned)r;
				removed |= r;
			}
			manifest |= strcmp(names[i], FMT_MANIFEST) == 0;
			tensors |= store_has_suffix(names[i], FMT_SAFETENSORS);
		}
	}
	if (depth >= 2 && tensors && !manifest && !b->spent) {
		char own[NAME_MAX + 1];
		int has_seal = recover_seal_record(fd, names, n, &sealed, own, sizeof(own), b);
		unsigned r = recover_tag(fd, path, names, n, has_seal ? &sealed : NULL, &l, b);
		if (has_seal)
			recover_keep_sealed(s, fd, path, own, &sealed);
		seal_record_free(&sealed);
		if (r > 0) {
			s->files += r;
			s->tags++;
			removed = 1;
		}
	}
	if (committed_tags && !b->spent)
		store_job_repair(cfg, fd, path, b);
	if (l.files > 0)
		log_info("recovery: left %u files of host %s%s in %s: another node may be writing "
			 "it", l.files, l.host, l.several ? " and others" : "", path);
	if (l.fresh > 0)
		log_info("recovery: left %u partial files in %s that name no host and changed in "
			 "the last %d s: another node may be writing them", l.fresh, path,
			 RECOVER_STALE_S);
	s->left += l.files;
	s->fresh += l.fresh;
	store_list_free(names, n);
	return removed;
}

/* The share of user uid in s (a fresh one, of cfg's budget, at its first directory); NULL
 * without memory. */
static struct recover_user *recover_user(const struct config *cfg, struct recover_stats *s,
					 uid_t uid)
{
	for (size_t i = 0; i < s->nusers; i++) {
		if (s->users[i].uid == uid)
			return &s->users[i];
	}
	struct recover_user *p = realloc(s->users, (s->nusers + 1) * sizeof(*p));
	if (!p)
		return NULL;
	s->users = p;
	p[s->nusers] = (struct recover_user){
		.uid = uid, .b = {.entries = cfg->max_recovery_entries,
				  .bytes = cfg->max_recovery_bytes}};
	return &p[s->nusers++];
}

/*
 * Recovers under the allowed root fd (at path): each directory directly below it is a job
 * directory of its owner, recovered within that owner's budget (which its entry in the
 * root's listing is charged to as well); the root itself is never a job or a tag.
 */
static void recover_root(const struct config *cfg, int fd, const char *path,
			 struct recover_stats *s)
{
	char sub[PATH_MAX];
	struct dirent *de;
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;

	if (!d) {
		log_warn("recovery: cannot list %s", path);
		if (dfd >= 0)
			close(dfd);
		return;
	}
	s->dirs++;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		struct recover_user *u;
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !(u = recover_user(cfg, s, st.st_uid)) || u->b.spent)
			continue;
		if (u->b.entries == 0) {
			u->b.spent = 1;
			continue;
		}
		u->b.entries--;
		if (!S_ISDIR(st.st_mode))
			continue;
		int cfd = openat(fd, de->d_name, STORE_DIR_FLAGS);
		if (cfd < 0)
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
		int emptied = recover_dir(cfg, cfd, sub, 1, u, s);
		close(cfd);
		if (emptied && recover_is_stale(&st) && unlinkat(fd, de->d_name, AT_REMOVEDIR) == 0)
			log_warnx("removed empty directory %s", sub);
	}
	closedir(d);
	for (size_t i = 0; i < s->nusers; i++) {
		struct recover_user *u = &s->users[i];
		if (u->b.spent && !u->logged) {
			u->logged = 1;
			s->spent++;
			log_warnx("recovery: the files of uid %u under %s cost more than the %u "
				  "directory entries or %llu MiB recovery spends on one user "
				  "(max_recovery_*_per_user): the rest of them were left as they are",
				  (unsigned)u->uid, path, cfg->max_recovery_entries,
				  (unsigned long long)(cfg->max_recovery_bytes >> 20));
		}
	}
}

/*
 * Reports and cleans what this host left under every allowed root. The roots may be a shared
 * filesystem where other nodes' daemons write the same tags right now, so a file is removed
 * only when this host wrote it ("dsckpt.host" in its header, or the header of its safetensors
 * sibling), when it is a durable file from before hosts were recorded, or when it is a partial
 * file that names no host and has not changed for RECOVER_STALE_S.
 */
void recover_run(const struct config *cfg, recover_sealed_cb on_sealed)
{
	struct recover_stats s = {.on_sealed = on_sealed};
	const char *host = store_host();

	for (size_t i = 0; i < cfg->n_roots; i++) {
		int fd = open(cfg->allowed_roots[i], STORE_DIR_FLAGS);
		if (fd < 0) {
			log_warn("recovery: cannot open allowed root %s", cfg->allowed_roots[i]);
			continue;
		}
		recover_root(cfg, fd, cfg->allowed_roots[i], &s);
		close(fd);
	}
	recover_hand_sealed(&s);
	log_info("recovery (host %s): checked %u directories under %zu roots, removed %u partial "
		 "files and %u files of %u uncommitted checkpoints; left %u files of other hosts "
		 "and %u recent partial files%s", host, s.dirs, cfg->n_roots, s.partials, s.files,
		 s.tags, s.left, s.fresh, s.spent ? " (and users' trees past their budget)" : "");
	metrics_recovered(RECOVERY_PARTIAL_REMOVED, s.partials);
	metrics_recovered(RECOVERY_FILE_REMOVED, s.files);
	metrics_recovered(RECOVERY_COMMIT_FINISHED, s.finished);
	metrics_recovered(RECOVERY_SEAL_RESUMED, s.resumed);
	metrics_recovered(RECOVERY_FILE_LEFT, s.left + s.fresh);
	free(s.users);
}
