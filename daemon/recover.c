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
 */
#include "dsckptd.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RECOVER_DEPTH 8     /* directory levels below a root that are searched */
#define RECOVER_STALE_S 900 /* a *.partial of unknown host younger than this may be in use */

/* Counters of one recovery pass. */
struct recover_stats {
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

/* Which host wrote the safetensors file (or partial) dirfd/name; another's name into host. */
static enum recover_writer recover_writer(int dirfd, const char *name, char *host,
					  size_t hostlen)
{
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
					      size_t hostlen)
{
	static const char *const sibs[] = {FMT_SAFETENSORS FMT_PARTIAL, FMT_SAFETENSORS};
	char stem[NAME_MAX + 1], sib[NAME_MAX + 1];
	size_t n = strlen(name) - strlen(FMT_PARTIAL);

	snprintf(stem, sizeof(stem), "%.*s", (int)n, name);
	if (store_has_suffix(stem, FMT_SAFETENSORS)) {
		enum recover_writer w = recover_writer(dirfd, name, host, hostlen);
		/* No header yet (killed before the first flush): the xattr set at its creation. */
		if (w == RECOVER_UNKNOWN && store_xattr_host(dirfd, name, host, hostlen) == 1)
			w = strcmp(host, store_host()) == 0 ? RECOVER_MINE : RECOVER_OTHER;
		return w;
	}
	if (seal_record_name(stem)) {	/* SEAL.<host>.json: its name says whose */
		size_t hl = strlen(stem) - strlen(FMT_SEAL_PREFIX FMT_SEAL_SUFFIX);
		snprintf(host, hostlen, "%.*s", (int)hl, stem + strlen(FMT_SEAL_PREFIX));
		return strcmp(host, store_host()) == 0 ? RECOVER_MINE : RECOVER_OTHER;
	}
	if (!store_has_suffix(stem, FMT_META))
		return RECOVER_UNKNOWN;
	stem[n - strlen(FMT_META)] = '\0';
	for (size_t i = 0; i < sizeof(sibs) / sizeof(sibs[0]); i++) {
		int len = snprintf(sib, sizeof(sib), "%s%s", stem, sibs[i]);
		if (len < 0 || (size_t)len >= sizeof(sib) || !store_is_regular(dirfd, sib))
			continue;
		enum recover_writer w = recover_writer(dirfd, sib, host, hostlen);
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
 * Removes our partial file dirfd/name (stat st) if this host wrote it, or if it names no host
 * and has not been modified for RECOVER_STALE_S; 1 if it was removed. A partial this host left
 * before any header was in it (a crash before the first flush), or a MANIFEST.json or latest
 * partial, looks like one another node is writing: it stays until a restart after the grace
 * period, or until the same file is written again (store_file_create replaces it). Left there
 * it is never reported as committed.
 */
static int recover_partial(int fd, const char *path, const char *name,
				 const struct stat *st, struct recover_left *l)
{
	char host[STORE_HOST_MAX];
	enum recover_writer w = recover_partial_writer(fd, name, host, sizeof(host));

	if (w == RECOVER_OTHER) {
		recover_left_add(l, host);
		return 0;
	}
	if (w != RECOVER_MINE && !recover_is_stale(st)) {
		l->fresh++;
		return 0;
	}
	return recover_unlink(fd, path, name, w == RECOVER_MINE ?
				    "partial file left by an interrupted write:" :
				    "stale partial file that names no host:");
}

/* Reads this node's seal record in the tag fd into r; 1 when there is a sound one. */
static int recover_seal_record(int fd, struct seal_record *r)
{
	char name[STORE_HOST_MAX + 16];

	snprintf(name, sizeof(name), FMT_SEAL_PREFIX "%s" FMT_SEAL_SUFFIX, store_host());
	if (faccessat(fd, name, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	return store_seal_read(fd, name, r) == 0;
}

/* Whether the safetensors file fd/name is of a rank the seal record names (NULL: none). */
static int recover_sealed(int fd, const char *name, const struct seal_record *sealed)
{
	char rank[16];

	if (!sealed || store_st_rank(fd, name, rank, sizeof(rank)) < 0)
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
				  const struct seal_record *sealed, struct recover_left *l)
{
	char host[STORE_HOST_MAX], meta[NAME_MAX + 1];
	unsigned removed = 0;

	for (size_t i = 0; i < n; i++) {
		if (!store_has_suffix(names[i], FMT_SAFETENSORS) || !store_is_regular(fd, names[i]))
			continue;
		enum recover_writer w = recover_writer(fd, names[i], host, sizeof(host));
		if (w == RECOVER_UNKNOWN || recover_sealed(fd, names[i], sealed))
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

/*
 * Cleans one directory and, up to the depth limit, those below it: our *.partial files and the
 * files of a tag without a manifest, where this host wrote them (see recover_run). Returns
 * whether it removed anything here, so that the caller may remove the directory once it is
 * empty: only a directory unmodified for RECOVER_STALE_S, which no other node is filling.
 */
static int recover_dir(const struct config *cfg, int fd, const char *path, int depth,
		       struct recover_stats *s)
{
	struct seal_record sealed = {0};
	struct recover_left l = {0};
	char **names, sub[PATH_MAX];
	size_t n;
	int removed = 0, manifest = 0, tensors = 0, committed_tags = 0;

	s->dirs++;
	if (store_list(fd, &names, &n) < 0) {
		log_warn("recovery: cannot list %s", path);
		return 0;
	}
	/* An interrupted commit whose manifest is whole is finished, not cleaned up. */
	if (faccessat(fd, FMT_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) < 0 &&
	    faccessat(fd, FMT_MANIFEST FMT_PARTIAL, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		manifest = store_finish_manifest(fd, path);
		s->finished += (unsigned)manifest;
	}
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < RECOVER_DEPTH) {
			int cfd = openat(fd, names[i], STORE_DIR_FLAGS);
			if (cfd < 0)
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, names[i]);
			int emptied = recover_dir(cfg, cfd, sub, depth + 1, s);
			committed_tags |= store_tag_committed(fd, names[i]) != 0;
			close(cfd);
			if (emptied && recover_is_stale(&st) &&
			    unlinkat(fd, names[i], AT_REMOVEDIR) == 0)
				log_warnx("removed empty directory %s", sub);
		} else if (S_ISREG(st.st_mode)) {
			if (store_is_our_partial(names[i])) {
				int r = recover_partial(fd, path, names[i], &st, &l);
				s->partials += (unsigned)r;
				removed |= r;
			}
			manifest |= strcmp(names[i], FMT_MANIFEST) == 0;
			tensors |= store_has_suffix(names[i], FMT_SAFETENSORS);
		}
	}
	if (tensors && !manifest) {
		int has_seal = recover_seal_record(fd, &sealed);
		unsigned r = recover_tag(fd, path, names, n, has_seal ? &sealed : NULL, &l);
		if (has_seal && s->on_sealed) {
			struct stat rs;
			char name[STORE_HOST_MAX + 16];
			snprintf(name, sizeof(name), FMT_SEAL_PREFIX "%s" FMT_SEAL_SUFFIX,
				 store_host());
			if (fstatat(fd, name, &rs, AT_SYMLINK_NOFOLLOW) == 0) {
				s->on_sealed(path, &sealed, rs.st_uid, rs.st_gid);
				s->resumed++;
			}
		}
		seal_record_free(&sealed);
		if (r > 0) {
			s->files += r;
			s->tags++;
			removed = 1;
		}
	}
	if (committed_tags)
		store_job_repair(cfg, fd, path);
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
		recover_dir(cfg, fd, cfg->allowed_roots[i], 0, &s);
		close(fd);
	}
	log_info("recovery (host %s): checked %u directories under %zu roots, removed %u partial "
		 "files and %u files of %u uncommitted checkpoints; left %u files of other hosts "
		 "and %u recent partial files", host, s.dirs, cfg->n_roots, s.partials, s.files,
		 s.tags, s.left, s.fresh);
	metrics_recovered(RECOVERY_PARTIAL_REMOVED, s.partials);
	metrics_recovered(RECOVERY_FILE_REMOVED, s.files);
	metrics_recovered(RECOVERY_COMMIT_FINISHED, s.finished);
	metrics_recovered(RECOVERY_SEAL_RESUMED, s.resumed);
	metrics_recovered(RECOVERY_FILE_LEFT, s.left + s.fresh);
}
