/*
 * peer_restore.c — a tag this node lacks, found in other nodes' daemons (issue 35 item 6):
 * the copies of it the peers hold, fetched and checked, for pull_peer.c to write into the
 * local tier. Which daemons to ask: the hosts named by `peer_hosts` (the cluster's, the same
 * list on every node) and by the seal records of the tag's directory where this node still
 * has one; every one that answers with the secret is asked which copies of the job it holds
 * (LIST).
 *
 * Which copies: the tag asked for, or (none asked) the one of the newest commit among every
 * copy listed; of that tag only the copies of the newest commit's run and commit time, so
 * that a copy an earlier run of the job left under the same tag name is never taken (issue
 * 16's run identity). Of those, the copy this node's host name sent when a peer holds one (a
 * replacement with the lost node's name); else, for a node of a new name that cannot tell
 * which ranks were its, every owner's. Each copy is fetched from the first peer that lists
 * it, by its owner, tag, run and commit time (a peer holding only another run's copy under
 * that tag is passed over, and answers nothing else), each owner on a thread of its own,
 * into a store of memory of its own (host_cache_size + replica_cache_size: a replacement's
 * cache is empty), where it is checked against the manifest's checksums as it arrives; a
 * peer that fails mid-way (killed, refused) is followed by the next that lists the copy, and
 * what it sent is dropped.
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
#include <unistd.h>

#define RESTORE_HOSTS 256        /* daemons asked */
#define RESTORE_OWNERS 64        /* copies fetched for one tag */
#define RESTORE_TIMEOUT_S 30

/* One daemon asked and what it holds. */
struct restore_host {
	char name[STORE_HOST_MAX];
	struct peer_copies *c;   /* NULL: it did not answer */
};

/* One copy to fetch (a thread). */
struct restore_want {
	struct peer_restore *pr;
	const char *job, *owner;
	const struct peer_copy *best;   /* the tag, run and commit wanted */
	struct restore_host *hosts;
	unsigned nhosts;
	struct replica *got;
	int rc;
	char err[512];
};

/* Adds name to hosts (not this node, not twice, names of 1 to 255 bytes). */
static void restore_add(struct restore_host *hosts, unsigned *n, const char *name, size_t len)
{
	if (len == 0 || len >= STORE_HOST_MAX || *n == RESTORE_HOSTS ||
	    (len == strlen(store_host()) && strncmp(name, store_host(), len) == 0))
		return;
	for (unsigned i = 0; i < *n; i++)
		if (strlen(hosts[i].name) == len && strncmp(hosts[i].name, name, len) == 0)
			return;
	memcpy(hosts[*n].name, name, len);
	hosts[(*n)++].name[len] = '\0';
}

/* The daemons to ask: peer_hosts, then the hosts of the seal records in dir (when here). */
static unsigned restore_hosts(const struct config *cfg, const char *dir,
			      struct restore_host *hosts)
{
	unsigned n = 0;
	int fd, dfd;
	DIR *d;
	struct dirent *e;

	for (const char *p = cfg->peer_hosts; p && *p;) {
		size_t len = strcspn(p, ", \t");
		restore_add(hosts, &n, p, len);
		p += len;
		p += strspn(p, ", \t");
	}
	if (dir == NULL || (dfd = open(dir, STORE_DIR_FLAGS)) < 0)
		return n;
	if ((fd = dup(dfd)) >= 0 && (d = fdopendir(fd)) != NULL) {
		while ((e = readdir(d)) != NULL) {
			struct seal_record r;
			char why[128];
			if (seal_record_name(e->d_name) &&
			    seal_record_load(dfd, e->d_name, &r, why, sizeof(why)) == 0) {
				restore_add(hosts, &n, r.host, strlen(r.host));
				seal_record_free(&r);
			}
		}
		closedir(d);
	} else if (fd >= 0) {
		close(fd);
	}
	close(dfd);
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
						w->best->created_ns, w->pr->rs, &w->got, w->err,
						sizeof(w->err));
			peer_link_close(l);
		}
		if (w->rc != 0)
			log_warnx("peer: %s's copy of %s not fetched from %s: %s", w->owner, tag,
				  w->hosts[i].name, w->err);
	}
	return NULL;
}

/* Picks the tag (tag, or the newest listed), its run and commit time from what the hosts
 * listed; 0 or -ENOENT. */
static int restore_pick(struct restore_host *hosts, unsigned n, const char *tag,
			const struct peer_copy **best)
{
	*best = NULL;
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++) {
			const struct peer_copy *e = &hosts[i].c->c[k];
			if ((tag[0] == '\0' || strcmp(e->tag, tag) == 0) &&
			    (*best == NULL || e->created_ns > (*best)->created_ns))
				*best = e;
		}
	return *best ? 0 : -ENOENT;
}

/* The owners whose copies of best to fetch (see the top), into owners; how many. */
static unsigned restore_owners(struct restore_host *hosts, unsigned n,
			       const struct peer_copy *best, const char **owners)
{
	unsigned m = 0;

	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++)
			if (restore_same(&hosts[i].c->c[k], best) &&
			    strcmp(hosts[i].c->c[k].owner, store_host()) == 0) {
				owners[0] = store_host();
				return 1;
			}
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; hosts[i].c && k < hosts[i].c->n; k++) {
			const struct peer_copy *e = &hosts[i].c->c[k];
			unsigned j = 0;
			if (!restore_same(e, best))
				continue;
			while (j < m && strcmp(owners[j], e->owner) != 0)
				j++;
			if (j == m && m < RESTORE_OWNERS)
				owners[m++] = e->owner;
		}
	return m;
}

/* Asks the hosts which copies of job (of tag) they hold. */
static void restore_ask(struct restore_host *hosts, unsigned n, const char *job,
			const char *tag)
{
	char err[512];

	for (unsigned i = 0; i < n; i++) {
		struct peer_link *l;
		if (peer_restore_open(hosts[i].name, &l, err, sizeof(err)) != 0) {
			log_info("peer: %s not asked for copies of %s: %s", hosts[i].name, job,
				 err);
			continue;
		}
		if ((hosts[i].c = malloc(sizeof(*hosts[i].c))) != NULL &&
		    peer_list(l, job, tag, hosts[i].c, err, sizeof(err)) != 0) {
			log_info("peer: %s: %s", hosts[i].name, err);
			free(hosts[i].c);
			hosts[i].c = NULL;
		}
		peer_link_close(l);
	}
}

/* Frees what the hosts listed. */
static void restore_hosts_free(struct restore_host *hosts, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		free(hosts[i].c);
	free(hosts);
}

/* Finds job's tag (or its newest) on the peers and fetches its copies (see dsckptd.h). */
int peer_restore(const struct config *cfg, const char *dir, const char *job, const char *tag,
		 int fetch, struct peer_restore *pr, char *err, size_t errlen)
{
	struct restore_host *hosts = calloc(RESTORE_HOSTS, sizeof(*hosts));
	struct restore_want *w = NULL;
	const struct peer_copy *best;
	const char *owners[RESTORE_OWNERS];
	unsigned n, m;
	int rc;

	memset(pr, 0, sizeof(*pr));
	if (hosts == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	if ((n = restore_hosts(cfg, dir, hosts)) == 0) {
		restore_hosts_free(hosts, 0);
		return err_set(err, errlen, ERR_ENOENT, "no peer to ask for %s (no peer_hosts, no "
			       "seal record here)", dir);
	}
	restore_ask(hosts, n, job, tag);
	if (restore_pick(hosts, n, tag, &best) != 0) {
		restore_hosts_free(hosts, n);
		return err_set(err, errlen, ERR_ENOENT, "no peer of the %u asked holds a copy of "
			       "%s%s%s", n, job, tag[0] ? "/" : "", tag);
	}
	snprintf(pr->tag, sizeof(pr->tag), "%s", best->tag);
	pr->created_ns = best->created_ns;
	if (!fetch) {
		restore_hosts_free(hosts, n);
		return 0;
	}
	m = restore_owners(hosts, n, best, owners);
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
		w[i] = (struct restore_want){ pr, job, owners[i], best, hosts, n, NULL, 0, "" };
		started[i] = pthread_create(&th[i], NULL, restore_fetch, &w[i]) == 0;
		if (!started[i])
			restore_fetch(&w[i]);
	}
	rc = 0;
	for (unsigned i = 0; i < m; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		if (w[i].rc != 0 && rc == 0)
			rc = err_set(err, errlen, w[i].rc == -ENOENT ? ERR_ENOENT : ERR_EIO, "%s",
				     w[i].err);
		if (w[i].got)
			pr->copies[pr->n++] = w[i].got;
	}
	free(w);
	restore_hosts_free(hosts, n);
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
