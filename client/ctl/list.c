/* list.c — `dsckptctl list ROOT`: the checkpoint tags under a directory, read from disk; for
 * an incomplete tag, how many ranks sealed it (its SEAL.<host>.json records) and which not;
 * which tiers hold each tag: the local files, the daemon's host cache (resident, when the
 * daemon answers), the root's remote tier (a committed tag's REMOTE.json) and other nodes'
 * daemons (peers the daemon sent this node's files of the tag to, when it answers). */
#include "ctl.h"

#include "../../format/format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIST_MAX_DEPTH 8   /* levels of directories below ROOT searched */
#define LATEST_MAX 4096    /* longest `latest` file read */

/* One checkpoint tag directory. */
struct tag {
	char *path;          /* relative to ROOT; "." for ROOT itself */
	const char *state;   /* "committed", "incomplete" or "corrupt" */
	unsigned files;      /* its .safetensors and .meta files (what a manifest lists) */
	uint64_t bytes;      /* their total size */
	int latest;          /* <job>/latest names it */
	char *created;       /* the manifest's creation time, or NULL */
	unsigned world;      /* from its seal records; 0 when it has none */
	unsigned sealed;     /* ranks they name */
	char missing[96];    /* the first ranks not sealed, "2, 5, ..." */
	uint8_t *have;       /* world entries: the ranks sealed (--json lists the others) */
	int resident;        /* the daemon keeps files of it in its cache */
	int remote;          /* committed and in its root's remote tier (REMOTE.json) */
	char *peers;         /* the peers holding this node's files of it (the daemon's word) */
};

/* Every tag found. */
struct tags {
	struct tag *v;
	size_t n, cap;
	const char *root;
	int asked;           /* the daemon said which tags are resident */
};

/* Whether name ends with suffix (and has something before it). */
static int ends_with(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);
	return n > k && strcmp(name + n - k, suffix) == 0;
}

/* Whether the `latest` file beside tag directory fd names the tag name. */
static int is_latest(int fd, const char *name)
{
	char buf[LATEST_MAX + 1], why[200];

	/* fd was opened without following links, so .. is its real parent. */
	int lf = userfile_open(fd, "../" FMT_LATEST, UINT64_MAX, 0, NULL, why, sizeof(why));
	if (lf < 0)
		return 0;
	ssize_t n = read(lf, buf, LATEST_MAX);
	close(lf);
	if (n <= 0)
		return 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r'))
		n--;
	buf[n] = 0;
	return strcmp(buf, name) == 0;
}

/* Reads the seal record fd/name into r (0, or -1 with why). A daemon writes a record under its
 * name holding its job directory's lock (a flock): one that does not read whole is read again
 * once that lock is free (waiting 2 s at most: its owner may hold it). */
static int load_record(int fd, const char *name, struct seal_record *r, char *why,
		       size_t whylen)
{
	int job, rc = seal_record_load(fd, name, r, why, whylen);

	if (rc == 0 || (job = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return rc;
	for (int i = 0; i < 200; i++) {
		if (flock(job, LOCK_SH | LOCK_NB) == 0) {
			rc = seal_record_load(fd, name, r, why, whylen);
			flock(job, LOCK_UN);
			break;
		}
		usleep(10000);
	}
	close(job);
	return rc;
}

/* Reads the seal records of tag directory fd into t: the world size, how many ranks they
 * name, and the first missing ones. Records of one run combine (as the daemons' do): those
 * of the run of the newest record. */
static void tag_seals(int fd, struct tag *t)
{
	char why[200], *run = NULL;
	uint8_t *have = NULL;
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own offset */
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *e;
	struct timespec newest = {0, 0};

	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	for (int pass = 0; pass < 2; pass++, rewinddir(d)) {
		while ((e = readdir(d))) {
			struct seal_record r;
			struct stat st;
			if (!seal_record_name(e->d_name))
				continue;
			if (load_record(fd, e->d_name, &r, why, sizeof(why)) < 0) {
				if (pass)
					out_err("%s/%s: %s", t->path, e->d_name, why);
				continue;
			}
			if (pass == 0 && fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    (!run || st.st_mtim.tv_sec > newest.tv_sec ||
			     (st.st_mtim.tv_sec == newest.tv_sec &&
			      st.st_mtim.tv_nsec > newest.tv_nsec))) {
				free(run);
				run = strdup(r.run);
				newest = st.st_mtim;
			}
			if (pass == 1 && run && strcmp(r.run, run) == 0 && !have &&
			    (have = calloc(r.world, 1)))
				t->world = r.world;
			for (unsigned i = 0; pass == 1 && have && r.world == t->world &&
			     strcmp(r.run, run) == 0 && i < r.nranks; i++) {
				t->sealed += !have[r.ranks[i]];
				have[r.ranks[i]] = 1;
			}
			seal_record_free(&r);
		}
	}
	free(run);
	closedir(d);
	size_t n = 0;
	unsigned shown = 0;
	for (unsigned r = 0; have && r < t->world && n + 16 < sizeof(t->missing); r++) {
		if (!have[r]) {
			n += (size_t)snprintf(t->missing + n, sizeof(t->missing) - n, "%s%u",
					      n ? ", " : "", r);
			shown++;
		}
	}
	if (shown < t->world - t->sealed)
		snprintf(t->missing + n, sizeof(t->missing) - n, ", ...");
	t->have = have;
}

/* Records directory fd (path rel, base name name) as a tag. */
static int tag_add(struct tags *out, int fd, const char *rel, const char *name, unsigned files,
		   uint64_t bytes, int partial)
{
	char why[300];
	int present;

	if (out->n == out->cap) {
		size_t cap = out->cap ? 2 * out->cap : 16;
		struct tag *v = realloc(out->v, cap * sizeof(*v));
		if (!v)
			return -1;
		out->v = v;
		out->cap = cap;
	}
	struct tag *t = &out->v[out->n];
	memset(t, 0, sizeof(*t));
	if (!(t->path = strdup(rel)))
		return -1;
	out->n++;
	t->files = files;
	t->bytes = bytes;
	t->latest = is_latest(fd, name);
	struct manifest *m = manifest_load(fd, &present, why, sizeof(why));
	if (m) {
		t->created = m->created ? strdup(m->created) : NULL;
		manifest_free(m);
	}
	t->state = partial || !present ? "incomplete" : m ? "committed" : "corrupt";
	t->remote = m && !partial && faccessat(fd, FMT_REMOTE, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
	if (!present)
		tag_seals(fd, t);
	return 0;
}

/* Searches directory fd (taken over), at path rel and depth, for tags; -1 when out of memory. */
static int walk(struct tags *out, int fd, const char *rel, const char *name, unsigned depth)
{
	DIR *d = fdopendir(fd);
	struct dirent *e;
	unsigned files = 0;
	uint64_t bytes = 0;
	int tag = 0, partial = 0, rc = 0;

	if (!d) {
		out_err("cannot read %s/%s: %s", out->root, rel, strerror(errno));
		close(fd);
		return 0;
	}
	while (rc == 0 && (e = readdir(d))) {
		struct stat st;
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
		    tagdir_hidden(e->d_name))   /* an overwrite's staging directory */
			continue;
		if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			out_err("cannot stat %s/%s/%s: %s", out->root, rel, e->d_name,
				strerror(errno));
			continue;
		}
		if (S_ISREG(st.st_mode)) {
			/* FILES counts what a manifest lists (the tensors and their .meta), not the
			 * manifest itself or the seal records; SIZE is everything on disk. */
			files += ends_with(e->d_name, FMT_SAFETENSORS) || ends_with(e->d_name, FMT_META);
			bytes += (uint64_t)st.st_size;
			partial |= ends_with(e->d_name, FMT_PARTIAL);
			tag |= ends_with(e->d_name, FMT_SAFETENSORS) ||
			       ends_with(e->d_name, FMT_PARTIAL) ||
			       strcmp(e->d_name, FMT_MANIFEST) == 0;
		} else if (S_ISDIR(st.st_mode) && depth < LIST_MAX_DEPTH) {
			char *sub = NULL;
			int sfd = openat(fd, e->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sfd < 0) {
				out_err("cannot open %s/%s/%s: %s", out->root, rel, e->d_name,
					strerror(errno));
				continue;
			}
			if (strcmp(rel, ".") == 0 ? !(sub = strdup(e->d_name))
						  : asprintf(&sub, "%s/%s", rel, e->d_name) < 0) {
				close(sfd);
				rc = -1;
				break;
			}
			rc = walk(out, sfd, sub, e->d_name, depth + 1);
			free(sub);
		}
	}
	if (rc == 0 && tag)
		rc = tag_add(out, fd, rel, name, files, bytes, partial);
	closedir(d);
	return rc;
}

/* Orders tags by path, numbers by value (step5 before step10: strverscmp). */
static int tag_cmp(const void *a, const void *b)
{
	return strverscmp(((const struct tag *)a)->path, ((const struct tag *)b)->path);
}

/* The tags as one JSON object: {"root": ..., "tags": [...]}. */
static cJSON *list_json(const struct tags *tags)
{
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddStringToObject(doc, "root", tags->root);
	cJSON *a = cJSON_AddArrayToObject(doc, "tags");
	for (size_t i = 0; i < tags->n; i++) {
		const struct tag *t = &tags->v[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "path", t->path);
		cJSON_AddStringToObject(o, "state", t->state);
		cJSON_AddNumberToObject(o, "files", t->files);
		cJSON_AddNumberToObject(o, "bytes", (double)t->bytes);
		cJSON_AddBoolToObject(o, "latest", t->latest);
		if (t->created)
			cJSON_AddStringToObject(o, "created", t->created);
		else
			cJSON_AddNullToObject(o, "created");
		if (t->world) {
			cJSON_AddNumberToObject(o, "sealed", t->sealed);
			cJSON_AddNumberToObject(o, "world", t->world);
			cJSON *miss = cJSON_AddArrayToObject(o, "missing");
			for (unsigned r = 0; miss && r < t->world; r++)
				if (!t->have[r])
					cJSON_AddItemToArray(miss, cJSON_CreateNumber(r));
		}
		if (tags->asked)
			cJSON_AddBoolToObject(o, "resident", t->resident);
		cJSON_AddBoolToObject(o, "remote", t->remote);
		cJSON *tiers = cJSON_AddArrayToObject(o, "tiers");
		if (t->resident)
			cJSON_AddItemToArray(tiers, cJSON_CreateString("cache"));
		cJSON_AddItemToArray(tiers, cJSON_CreateString("local"));
		if (t->remote)
			cJSON_AddItemToArray(tiers, cJSON_CreateString("remote"));
		if (t->peers) {
			cJSON_AddItemToArray(tiers, cJSON_CreateString("peers"));
			cJSON_AddStringToObject(o, "peers", t->peers);
		}
		cJSON_AddItemToArray(a, o);
	}
	return doc;
}

/* Prints the tags as a table, or adds their JSON object to the array docs (--json). */
static int list_print(const struct tags *tags, cJSON *docs)
{
	if (docs) {
		cJSON *doc = list_json(tags);
		if (!doc) {
			out_err("out of memory");
			return CTL_FAIL;
		}
		cJSON_AddItemToArray(docs, doc);
		return CTL_OK;
	}
	if (tags->n == 0) {
		printf("no checkpoints under %s\n", tags->root);
		return CTL_OK;
	}
	struct table *tb = table_new(7, "PATH", "STATE", "FILES", "SIZE", "CREATED", "LATEST",
				     "TIERS");
	table_right(tb, 2);
	table_right(tb, 3);
	for (size_t i = 0; i < tags->n; i++) {
		const struct tag *t = &tags->v[i];
		char files[16], size[32], state[160], tiers[32];
		snprintf(files, sizeof(files), "%u", t->files);
		if (t->world && t->sealed < t->world)
			snprintf(state, sizeof(state), "%s: sealed %u/%u, missing %s", t->state,
				 t->sealed, t->world, t->missing);
		else if (t->world)
			snprintf(state, sizeof(state), "%s: sealed %u/%u", t->state, t->sealed,
				 t->world);
		else
			snprintf(state, sizeof(state), "%s", t->state);
		snprintf(tiers, sizeof(tiers), "%slocal%s%s", t->resident ? "cache " : "",
			 t->remote ? " remote" : "", t->peers ? " peers" : "");
		table_row(tb, t->path, state, files, out_bytes(t->bytes, size, sizeof(size)),
			  t->created ? t->created : "-", t->latest ? "latest" : "", tiers);
		if (t->peers)
			table_note(tb, "peer copies: %s", t->peers);
	}
	table_print(tb, stdout);
	return CTL_OK;
}

/* Marks the tags whose files the daemon keeps in its cache, and those whose files peers
 * hold (real: ROOT's real path), when it answers; a daemon that does not (none running here)
 * leaves the listing as it was. */
static void list_mark_resident(const struct ctl *ctl, struct tags *tags, const char *real)
{
	struct ctl_resident *res;
	struct ctl_held *held;
	long nheld, n = query_residents(ctl, &res, &held, &nheld);

	if (n < 0)
		return;
	tags->asked = 1;
	for (size_t i = 0; i < tags->n; i++) {
		struct tag *t = &tags->v[i];
		char *abs = NULL;
		if (strcmp(t->path, ".") == 0 ? !(abs = strdup(real))
					      : asprintf(&abs, "%s/%s", real, t->path) < 0)
			continue;
		for (long k = 0; k < n && !t->resident; k++)
			t->resident = strcmp(res[k].dir, abs) == 0;
		for (long k = 0; k < nheld && !t->peers; k++)
			if (strcmp(held[k].dir, abs) == 0)
				t->peers = strdup(held[k].peers);
		free(abs);
	}
	query_residents_free(res, n);
	query_held_free(held, nheld);
}

/* Lists the checkpoint tags under root (a table, or its JSON object added to docs). */
static int list_root(const struct ctl *ctl, const char *root, cJSON *docs)
{
	struct tags tags = {.root = root};
	char real[PATH_MAX];
	int rc = CTL_FAIL;

	int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		out_err("cannot open %s: %s", root, strerror(errno));
		return CTL_FAIL;
	}
	/* ROOT's own name, in case ROOT is itself a tag that <job>/latest names. */
	if (!realpath(root, real))
		snprintf(real, sizeof(real), "%s", root);
	if (walk(&tags, fd, ".", basename(real), 0) != 0) {
		out_err("out of memory");
		goto out;
	}
	if (tags.n)
		qsort(tags.v, tags.n, sizeof(*tags.v), tag_cmp);
	list_mark_resident(ctl, &tags, real);
	rc = list_print(&tags, docs);
out:
	for (size_t i = 0; i < tags.n; i++) {
		free(tags.v[i].path);
		free(tags.v[i].created);
		free(tags.v[i].have);
		free(tags.v[i].peers);
	}
	free(tags.v);
	return rc;
}

/* Lists the checkpoint tags under ctl->arg, or, without it, under every allowed root of the
 * daemon that answers (a table per root; with --json one object per root, in an array when
 * the daemon has several). */
int list_run(struct ctl *ctl)
{
	char **roots = NULL;
	long n = 1;
	int rc = CTL_OK;

	if (!ctl->arg && (n = query_roots(ctl, &roots)) < 0)
		return CTL_FAIL;
	cJSON *docs = ctl->json ? cJSON_CreateArray() : NULL;
	for (long i = 0; i < n; i++) {
		if (i > 0 && !docs)
			putchar('\n');
		if (!ctl->arg && !docs)
			printf("%s:\n", roots[i]);
		if (list_root(ctl, ctl->arg ? ctl->arg : roots[i], docs) != CTL_OK)
			rc = CTL_FAIL;
	}
	query_roots_free(roots, ctl->arg ? 0 : n);
	if (!docs)
		return rc;
	if (rc != CTL_OK) {
		cJSON_Delete(docs);
		return rc;
	}
	cJSON *doc = cJSON_GetArraySize(docs) == 1 ? cJSON_DetachItemFromArray(docs, 0) : docs;
	if (doc != docs)
		cJSON_Delete(docs);
	return out_json(doc);
}
