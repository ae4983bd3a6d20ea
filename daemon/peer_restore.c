/*
 * peer_restore.c — a tag this node lacks, found in other nodes' daemons (issue 35 item 6):
 * the copies of it the peers hold, fetched and checked, for pull_peer.c to write into the
 * local tier.
 *
 * Which daemons to ask, with no list written by hand: the hosts of the seal records this
 * node still has of the job (those of the tag's directory, then of the job directory's other
 * tags: the nodes that committed them), the job's nodes its trainers told this daemon
 * (NODES, peer_nodes.c: gathered from the process group), and `peer_hosts` where it is set
 * (an override for a node that has none of the job's directories); then,
 * in turn, the owners of the copies each daemon that answers lists, since a copy's owner is
 * a node of the job that holds copies too, so one daemon of the ring found leads to the
 * others. Each answering with the secret is asked which copies of the job it holds (LIST);
 * it lists only the copies of tags whose seal records name this node's address
 * (peer_member.c), and only those of the restoring user's files (for root, those of the user
 * owning the nearest of the tag's directories here), so that another user's job of the same
 * name, told to run here, is never taken for it. The
 * daemons of a round are asked at once, RESTORE_PARALLEL threads at a time, so a thousand
 * nodes' records cost a few round trips and a daemon that never answers one timeout, not
 * one each.
 *
 * Which copies: this node's own, those whose owner is this node's `host` or a name of one of
 * its addresses (a replacement under the lost node's name, or under a new name at its
 * address): exactly the files of the ranks the lost node held, never other nodes' files,
 * which their own nodes still have. Where this node's ranks were told (a replacement of a
 * new name at a new address, which owns no copy), the files of those ranks, of whichever
 * node's copies hold them (each owner's copy asked for those ranks alone; every rank must be
 * found). Of them the tag asked for, or (none asked) the one of
 * the newest commit, and of that tag only the copies of that commit's run and commit time,
 * so that a copy an earlier run of the job left under the same tag name is never taken
 * (issue 16's run identity). Each is fetched from the first peer that lists it, by its
 * owner, tag, run and commit time (a peer holding only another run's copy under that tag is
 * passed over, and answers nothing else), each owner on a thread of its own, into a store
 * of memory of its own (host_cache_size + replica_cache_size: a replacement's cache is
 * empty), where it is checked against the manifest's checksums as it arrives; a peer that
 * fails mid-way (killed, refused) is followed by the next that lists the copy, and what it
 * sent is dropped.
 *
 * Blocking, on the caller's thread (libuv's threadpool) and the fetch threads it starts.
 */
#include "peer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RESTORE_HOSTS 256        /* daemons asked */
#define RESTORE_OWNERS 64        /* copies fetched for one tag */
#define RESTORE_TAGS 64          /* tag directories of the job read for seal records */
#define RESTORE_ENTRIES 4096     /* entries of the job directory looked at for them */
#define RESTORE_PARALLEL 32      /* daemons asked at once */

/* One daemon asked and what it holds. */
struct restore_host {
	char name[STORE_HOST_MAX];
	struct peer_copies *c;   /* NULL: it did not answer */
};

/* One copy to fetch (a thread). */
struct restore_want {
	struct peer_restore *pr;
	const char *job, *owner;
	const unsigned *ranks;          /* the ranks told (NODES) to fetch; NULL: the copy's all */
	unsigned nranks;
	const struct peer_copy *best;   /* the tag, run and commit wanted */
	struct restore_host *hosts;
	unsigned nhosts;
	struct replica *got;
	int rc;
	char err[512];
};

/* Adds name to hosts (names of 1 to 255 bytes, each once, not this node's own by its name
 * or address). */
static void restore_add(struct restore_host *hosts, unsigned *n, const char *name, size_t len)
{
	if (len == 0 || len >= STORE_HOST_MAX || *n == RESTORE_HOSTS)
		return;
	for (unsigned i = 0; i < *n; i++)
		if (strlen(hosts[i].name) == len && strncmp(hosts[i].name, name, len) == 0)
			return;
	memcpy(hosts[*n].name, name, len);
	hosts[*n].name[len] = '\0';
	if (!peer_member_self(hosts[*n].name))
		(*n)++;
}

/* What restore_hosts' seal records are gathered into. */
struct restore_into {
	struct restore_host *hosts;
	unsigned *n;
};

/* peer_member_hosts' fn: adds a seal record's host to the daemons to ask. */
static int restore_add_host(void *arg, const char *host)
{
	struct restore_into *in = arg;

	restore_add(in->hosts, in->n, host, strlen(host));
	return 0;
}

/* Adds the hosts of the seal records of the job directory's tags (at most RESTORE_TAGS of
 * its first RESTORE_ENTRIES entries). */
static void restore_job_hosts(const char *jobdir, struct restore_into *in)
{
	int fd = open(jobdir, STORE_DIR_FLAGS);
	unsigned tags = 0, seen = 0;
	struct dirent *e;
	DIR *d;

	if (fd < 0)
		return;
	if ((d = fdopendir(fd)) == NULL) {
		close(fd);
		return;
	}
	while (tags < RESTORE_TAGS && seen++ < RESTORE_ENTRIES && (e = readdir(d)) != NULL) {
		char path[PULL_DIR_MAX + 260];
		if (e->d_name[0] == '.' || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", jobdir, e->d_name) >=
			    sizeof(path))
			continue;
		peer_member_hosts(path, restore_add_host, in);
		tags++;
	}
	closedir(d);
}

/* The daemons to ask first: the hosts of the seal records of dir (a tag directory, or with
 * tag "" the job's) and of the job's other tags here, the job's nodes uid told (NODES, with
 * this node's ranks into ranks, their count into *nranks), then peer_hosts; how many. */
static unsigned restore_hosts(const struct config *cfg, const char *dir, const char *job,
			      const char *tag, uid_t uid, struct restore_host *hosts,
			      unsigned *ranks, unsigned *nranks)
{
	char jobdir[PULL_DIR_MAX];
	unsigned n = 0;
	struct restore_into in = { hosts, &n };

	*nranks = peer_nodes_each(job, uid, restore_add_host, &in, ranks);

	if (dir && dir[0] == '/' && strlen(dir) < sizeof(jobdir)) {
		snprintf(jobdir, sizeof(jobdir), "%s", dir);
		if (tag[0]) {
			peer_member_hosts(dir, restore_add_host, &in);
			*strrchr(jobdir, '/') = '\0';
		}
		restore_job_hosts(jobdir, &in);
	}
	for (const char *p = cfg->peer_hosts; p && *p;) {
		size_t len = strcspn(p, ", \t");
		restore_add(hosts, &n, p, len);
		p += len;
		p += strspn(p, ", \t");
	}
	return n;
}

/* Whether e is a copy of best's tag, run and commit. */
static int restore_same(const struct peer_copy *e, const struct peer_copy *best)
{
	return strcmp(e->tag, best->tag) == 0 && strcmp(e->run, best->run) == 0 &&
	       e->created_ns == best->created_ns;
}

/* Fetches one owner's copy from the first daemon that lists it (a thread). */
static void *restore_fetch(void *arg)
{
	struct restore_want *w = arg;

	const char *tag = w->best->tag;

	w->rc = -ENOENT;
	snprintf(w->err, sizeof(w->err), "no peer answering holds %s's copy of %s", w->owner,
		 tag);
	for (unsigned i = 0; i < w->nhosts && w->rc != 0; i++) {
		struct peer_copies *c = w->hosts[i].c;
		struct peer_link *l;
		unsigned k = 0;
		while (c && k < c->n && (strcmp(c->c[k].owner, w->owner) != 0 ||
					 !restore_same(&c->c[k], w->best)))
			k++;
		if (c == NULL || k == c->n)
			continue;  /* none, or only another run's or commit's */
		w->rc = peer_restore_open(w->hosts[i].name, &l, w->err, sizeof(w->err));
		if (w->rc == 0) {
			w->rc = peer_fetch_copy(l, w->job, tag, w->owner, w->best->run,
						w->best->created_ns, w->ranks, w->nranks,
						w->pr->rs, &w->got, w->err, sizeof(w->err));
			peer_link_close(l);
		}
		if (w->rc != 0 && !(w->nranks && w->rc == -ENOENT))
			log_warnx("peer: %s's copy of %s not fetched from %s: %s", w->owner, tag,
				  w->hosts[i].name, w->err);
	}
	return NULL;
}

/* The owners judged so far: whether each is this node. */
struct restore_self {
	const char *owner[RESTORE_HOSTS];
	int yes[RESTORE_HOSTS];
	unsigned n;
};

/* Whether copy e is this node's own: its owner this node's `host` or a name of one of its
 * addresses (each owner resolved once). */
static int restore_mine(struct restore_self *me, const struct peer_copy *e)
{
	unsigned i = 0;

	while (i < me->n && strcmp(me->owner[i], e->owner) != 0)
		i++;
	if (i < me->n)
		return me->yes[i];
	if (me->n == RESTORE_HOSTS)
		return peer_member_self(e->owner);
	me->owner[me->n] = e->owner;
	return me->yes[me->n++] = peer_member_self(e->owner);
}

/* Picks, among this node's own copies (any: the copies of every node, this node's ranks
 * told), the tag (tag, or the newest listed), its run and commit time; 0 or -ENOENT. */
static int restore_pick(struct restore_host *hosts, unsigned n, const char *tag,
			struct restore_self *me, int any, const struct peer_copy **best)
{
	*best = NULL;
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++) {
			const struct peer_copy *e = &hosts[i].c->c[k];
			if ((tag[0] == '\0' || strcmp(e->tag, tag) == 0) &&
			    (*best == NULL || e->created_ns > (*best)->created_ns) &&
			    (any || restore_mine(me, e)))
				*best = e;
		}
	return *best ? 0 : -ENOENT;
}

/* The owners (this node's names; any: every node's) whose copies of best to fetch, into
 * owners; how many. */
static unsigned restore_owners(struct restore_host *hosts, unsigned n,
			       const struct peer_copy *best, struct restore_self *me, int any,
			       const char **owners)
{
	unsigned m = 0;

	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++) {
			const struct peer_copy *e = &hosts[i].c->c[k];
			unsigned j = 0;
			if (!restore_same(e, best) || !(any || restore_mine(me, e)))
				continue;
			while (j < m && strcmp(owners[j], e->owner) != 0)
				j++;
			if (j == m && m < RESTORE_OWNERS)
				owners[m++] = e->owner;
		}
	return m;
}

/* One host asked for its copies (a thread). */
struct restore_asking {
	struct restore_host *h;
	const char *job, *tag;
	uint32_t uid;          /* whose copies (PEER_ANY_UID: any user's, a restore for root) */
};

/* Asks one host which copies of the job (of the tag) it holds; h->c stays NULL when it
 * does not answer. */
static void *restore_list(void *arg)
{
	struct restore_asking *a = arg;
	struct restore_host *h = a->h;
	struct peer_link *l;
	char err[512];

	if (peer_restore_open(h->name, &l, err, sizeof(err)) != 0) {
		log_info("peer: %s not asked for copies of %s: %s", h->name, a->job, err);
		return NULL;
	}
	if ((h->c = malloc(sizeof(*h->c))) != NULL &&
	    peer_list(l, a->job, a->tag, a->uid, h->c, err, sizeof(err)) != 0) {
		log_info("peer: %s: %s", h->name, err);
		free(h->c);
		h->c = NULL;
	}
	peer_link_close(l);
	return NULL;
}

/* Asks hosts[from, to) at once for uid's copies, RESTORE_PARALLEL threads at a time. */
static void restore_ask_some(struct restore_host *hosts, unsigned from, unsigned to,
			     const char *job, const char *tag, uint32_t uid)
{
	while (from < to) {
		struct restore_asking a[RESTORE_PARALLEL];
		pthread_t th[RESTORE_PARALLEL];
		int started[RESTORE_PARALLEL];
		unsigned k = 0;
		for (; k < RESTORE_PARALLEL && from + k < to; k++) {
			a[k] = (struct restore_asking){ &hosts[from + k], job, tag, uid };
			started[k] = pthread_create(&th[k], NULL, restore_list, &a[k]) == 0;
			if (!started[k])
				restore_list(&a[k]);
		}
		for (unsigned i = 0; i < k; i++)
			if (started[i])
				pthread_join(th[i], NULL);
		from += k;
	}
}

/* Asks the hosts which copies of job (of tag, of uid's files) they hold, all at once, and then, in turn, the
 * owners of the copies listed that were not asked yet; how many hosts were asked in all. */
static unsigned restore_ask(struct restore_host *hosts, unsigned n, const char *job,
			    const char *tag, uint32_t uid)
{
	for (unsigned done = 0; done < n;) {
		unsigned end = n;
		restore_ask_some(hosts, done, end, job, tag, uid);
		for (unsigned i = done; i < end; i++)
			for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++)
				restore_add(hosts, &n, hosts[i].c->c[k].owner,
					    strlen(hosts[i].c->c[k].owner));
		done = end;
	}
	return n;
}

/* Whose copies a restore of dir for uid takes: uid's; for root, those of the user owning
 * the nearest directory of dir that is here (a prolog's pull of a user's job), any user's
 * where that is root's or none is here. */
static uint32_t restore_whose(const char *dir, uid_t uid)
{
	char path[PULL_DIR_MAX];
	struct stat st;
	char *slash;

	if (uid != 0)
		return (uint32_t)uid;
	snprintf(path, sizeof(path), "%s", dir ? dir : "");
	while (path[0]) {
		if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT) == 0)
			return st.st_uid != 0 ? (uint32_t)st.st_uid : PEER_ANY_UID;
		if ((slash = strrchr(path, '/')) == NULL)
			break;
		*slash = '\0';
	}
	return PEER_ANY_UID;
}

/* Frees what the hosts listed. */
static void restore_hosts_free(struct restore_host *hosts, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		free(hosts[i].c);
	free(hosts);
}

/* Whether the copies fetched hold a file of each of the n ranks told (and one copy at
 * least): 0, or ERR_ENOENT with err naming a rank none holds. */
static int restore_covered(const struct peer_restore *pr, const unsigned *ranks, unsigned n,
			   char *err, size_t errlen)
{
	const char *text;
	size_t len;
	unsigned nfiles;

	if (pr->n == 0)
		return err_set(err, errlen, ERR_ENOENT, "no copy fetched");
	for (unsigned k = 0; k < n; k++) {
		int found = 0;
		for (unsigned c = 0; c < pr->n && !found; c++) {
			replica_id(pr->copies[c], &text, &len, &nfiles);
			for (unsigned i = 0; i < nfiles && !found; i++)
				found = replica_file(pr->copies[c], i)->rank == ranks[k];
		}
		if (!found)
			return err_set(err, errlen, ERR_ENOENT, "rank %u of %s: no peer answering "
				       "holds its files", ranks[k], pr->tag);
	}
	return 0;
}

/* Finds job's tag (or its newest) on the peers and fetches its copies (see dsckptd.h). */
int peer_restore(const struct config *cfg, const char *dir, const char *job, const char *tag,
		 uid_t uid, int fetch, struct peer_restore *pr, char *err, size_t errlen)
{
	struct restore_host *hosts = calloc(RESTORE_HOSTS, sizeof(*hosts));
	struct restore_want *w = NULL;
	const struct peer_copy *best;
	const char *owners[RESTORE_OWNERS];
	struct restore_self *me;
	unsigned n, m, ranks[PEER_NODES_MAX_RANKS], nranks;
	int rc;

	memset(pr, 0, sizeof(*pr));
	if (hosts == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((n = restore_hosts(cfg, dir, job, tag, uid, hosts, ranks, &nranks)) == 0) {
		restore_hosts_free(hosts, 0);
		return err_set(err, errlen, ERR_ENOENT, "no peer to ask for %s (no seal record of "
			       "the job here, no nodes told, no peer_hosts)", dir);
	}
	n = restore_ask(hosts, n, job, tag, restore_whose(dir, uid));
	if ((me = calloc(1, sizeof(*me))) == NULL) {
		restore_hosts_free(hosts, n);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	if (restore_pick(hosts, n, tag, me, nranks > 0, &best) != 0) {
		free(me);
		restore_hosts_free(hosts, n);
		return err_set(err, errlen, ERR_ENOENT, "no peer of the %u asked holds a copy of "
			       "%s%s%s %s", n, job, tag[0] ? "/" : "", tag, nranks ? "listed to "
			       "this node (are the job's other nodes told it runs here?)" :
			       "sent by this node (its host or a name of its address)");
	}
	snprintf(pr->tag, sizeof(pr->tag), "%s", best->tag);
	pr->created_ns = best->created_ns;
	if (!fetch) {
		free(me);
		restore_hosts_free(hosts, n);
		return 0;
	}
	m = restore_owners(hosts, n, best, me, nranks > 0, owners);
	free(me);
	if ((w = calloc(m, sizeof(*w))) == NULL ||
	    replica_store_open(cfg->host_cache_bytes + cfg->replica_cache_bytes, NULL, &pr->rs,
			       err, errlen) != 0) {
		free(w);
		restore_hosts_free(hosts, n);
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	}
	pthread_t th[RESTORE_OWNERS];
	int started[RESTORE_OWNERS];
	for (unsigned i = 0; i < m; i++) {
		w[i] = (struct restore_want){ pr, job, owners[i], nranks ? ranks : NULL, nranks,
					      best, hosts, n, NULL, 0, "" };
		started[i] = pthread_create(&th[i], NULL, restore_fetch, &w[i]) == 0;
		if (!started[i])
			restore_fetch(&w[i]);
	}
	rc = 0;
	for (unsigned i = 0; i < m; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		if (w[i].rc != 0 && rc == 0 && !(nranks && w[i].rc == -ENOENT))
			rc = err_set(err, errlen, w[i].rc == -ENOENT ? ERR_ENOENT : ERR_EIO, "%s",
				     w[i].err);
		if (w[i].got)
			pr->copies[pr->n++] = w[i].got;
	}
	free(w);
	restore_hosts_free(hosts, n);
	if (rc == 0)
		rc = restore_covered(pr, ranks, nranks, err, errlen);
	if (rc != 0)
		peer_restore_free(pr);
	return rc;
}

/* Drops the copies a restore fetched and their store. */
void peer_restore_free(struct peer_restore *pr)
{
	for (unsigned i = 0; i < pr->n; i++)
		replica_put(pr->copies[i]);
	replica_store_close(pr->rs);
	memset(pr, 0, sizeof(*pr));
}
