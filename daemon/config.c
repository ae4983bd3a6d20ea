/*
 * config.c — the JSON configuration: one table of options drives parsing, defaults,
 * validation and --help. The only file that includes cJSON.h; the tree is freed as soon as
 * the values are copied out. A load builds a fresh struct config; the caller swaps it in.
 */
#include "dsckptd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CONFIG_MAX_FILE (1 << 20)
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* How an option's JSON value is checked and where it is stored in struct config. */
enum opt_type {
	OPT_STRING, /* char *; min..max is the length */
	OPT_OCTAL,  /* unsigned from an octal string; at most max */
	OPT_DIRS,   /* allowed_roots/n_roots: absolute existing directories, min..max of them */
	OPT_NUMBER, /* double */
	OPT_MIB,    /* uint64_t bytes from a number of MiB */
	OPT_UINT,   /* unsigned from an integral number */
	OPT_LEVEL,  /* int from a log level name */
	OPT_BOOL    /* int 0/1 */
};

struct option {
	const char *name;
	enum opt_type type;
	double min, max;
	const char *def; /* the default, written as in the file */
	size_t off;      /* field in struct config */
	const char *help;
};

#define OFF(field) offsetof(struct config, field)

static const struct option options[] = {
	{ "socket", OPT_STRING, 1, sizeof(((struct sockaddr_un *)0)->sun_path) - 1,
	  "\"/run/dsckptd/dsckptd.sock\"", OFF(socket), "path of the Unix socket" },
	{ "host", OPT_STRING, 0, STORE_HOST_MAX - 1, "\"\"", OFF(host),
	  "this node's name, recorded in files as dsckpt.host (one daemon per root on a node); "
	  "\"\": the machine's hostname" },
	{ "socket_mode", OPT_OCTAL, 0, 0777, "\"0660\"", OFF(socket_mode),
	  "permissions of the socket, an octal string" },
	{ "socket_group", OPT_STRING, 0, 255, "\"\"", OFF(socket_group),
	  "group given the socket, whose members may connect with socket_mode 0660 (\"dsckpt\", "
	  "made by the sysusers.d entry); \"\": the daemon's own group" },
	{ "allowed_roots", OPT_DIRS, 1, 64, "[\"/var/lib/dsckpt\"]", OFF(allowed_roots),
	  "absolute existing directories clients may write checkpoints under" },
	{ "host_cache_size", OPT_NUMBER, 1.0 / 1024, 4096, "4", OFF(host_cache_gib),
	  "host cache in GiB, allocated and pinned at start; fractions allowed (0.25)" },
	{ "chunk_size", OPT_MIB, 1, 1024, "64", OFF(chunk_bytes),
	  "copy/flush unit in MiB, rounded down to 4 KiB and to a quarter of the cache" },
	{ "flush_threads", OPT_UINT, 1, 64, "4", OFF(flush_threads),
	  "threads writing the cache to files" },
	{ "copy_threads", OPT_UINT, 0, 64, "0", OFF(copy_threads),
	  "threads copying tensors into the cache; 0: 2 per GPU, at least 4 (2 without a GPU)" },
	{ "restore_threads", OPT_UINT, 0, 64, "0", OFF(restore_threads),
	  "threads filling loads (file or cache → checked → GPU or host); 0: one per CPU, 8 to 32 "
	  "(2 without a GPU)" },
	{ "gpu_checksums", OPT_BOOL, 0, 0, "true", OFF(gpu_checksums),
	  "check loads into GPU memory on the GPU (XXH3 there, once a self-test there passed); "
	  "false hashes every byte on the host as it goes by" },
	{ "keep_resident", OPT_BOOL, 0, 0, "true", OFF(keep_resident),
	  "keep each file just saved in the host cache after it is written, so that a restart "
	  "on this node restores from memory; a save needing the room takes it back" },
	{ "keep_last", OPT_UINT, 0, 100000, "0", OFF(keep_last),
	  "committed checkpoints kept per job (0 = all)" },
	{ "log_level", OPT_LEVEL, 0, 0, "\"info\"", OFF(log_level),
	  "error, warn, info or debug" },
	{ "o_direct", OPT_BOOL, 0, 0, "true", OFF(o_direct),
	  "write files with O_DIRECT where the filesystem allows it" },
	{ "file_mode", OPT_OCTAL, 0, 0666, "\"0600\"", OFF(file_mode),
	  "permissions of the files dsckptd writes (private to their owner by default)" },
	{ "dir_mode", OPT_OCTAL, 0, 0777, "\"0700\"", OFF(dir_mode),
	  "permissions of the directories dsckptd creates (owner read/write/search is added)" },
	{ "max_conns_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_conns_per_user),
	  "connections one user may hold open" },
	{ "max_saves_per_user", OPT_UINT, 1, 1000000, "256", OFF(max_saves_per_user),
	  "saves one user may have begun and not yet durable or failed" },
	{ "max_loads_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_loads_per_user),
	  "loads one user may have begun and not yet finished" },
	{ "max_plans_per_user", OPT_UINT, 1, 1000000, "64", OFF(max_plans_per_user),
	  "save plans one user's open connections may hold" },
	{ "max_regions_per_user", OPT_UINT, 1, 10000000, "4096", OFF(max_regions_per_user),
	  "memory regions (host memfds, GPU handles) the daemon holds open for one user" },
	{ "max_region_gib_per_user", OPT_NUMBER, 0, 1048576, "0", OFF(max_region_gib),
	  "GiB of host memory the daemon maps for one user; 0: the machine's RAM" },
	{ "max_unread_mib_per_user", OPT_MIB, 1, 1048576, "256", OFF(max_unread_bytes),
	  "MiB of unfinished requests and unread replies buffered for one user's connections" },
	{ "max_blob_mib_per_user", OPT_MIB, 1, 1048576, "1024", OFF(max_blob_bytes),
	  "MiB of blobs (.meta contents) held for one user's saves not yet durable" },
	{ "max_held_mib_per_user", OPT_MIB, 1, 1048576, "1024", OFF(max_held_bytes),
	  "MiB of what the daemon decoded and keeps for one user (tensor lists of saves and "
	  "plans, load headers)" },
	{ "max_seals_per_user", OPT_UINT, 1, 1000000, "256", OFF(max_seals_per_user),
	  "sealed tags one user may have the daemon follow (not yet committed or given up)" },
	{ "max_tensors_per_save", OPT_UINT, 1, 16777216, "262144", OFF(max_tensors_per_save),
	  "tensors in one save (a save's header must also fit safetensors' 100 MB limit)" },
	{ "max_recovery_entries_per_user", OPT_UINT, 1, 1000000000, "100000",
	  OFF(max_recovery_entries),
	  "directory entries start-up recovery lists in one user's trees; past it the rest is "
	  "left as it is" },
	{ "max_recovery_mib_per_user", OPT_MIB, 1, 1048576, "256", OFF(max_recovery_bytes),
	  "MiB of manifests, seal records and headers start-up recovery reads in one user's "
	  "trees; past it the rest is left as it is" },
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Appends one problem (a line) to err, truncating safely. */
static void __attribute__((format(printf, 3, 4)))
config_err(char *err, size_t errlen, const char *fmt, ...)
{
	size_t used = strnlen(err, errlen);
	va_list ap;

	if (used + 1 >= errlen)
		return;
	if (used > 0) {
		err[used++] = '\n';
		err[used] = '\0';
	}
	va_start(ap, fmt);
	vsnprintf(err + used, errlen - used, fmt, ap);
	va_end(ap);
}

/* Name of a JSON value's type, for messages. */
static const char *config_json_type(const cJSON *v)
{
	if (cJSON_IsString(v))
		return "a string";
	if (cJSON_IsNumber(v))
		return "a number";
	if (cJSON_IsBool(v))
		return "a boolean";
	if (cJSON_IsArray(v))
		return "an array";
	if (cJSON_IsObject(v))
		return "an object";
	return "null";
}

/* Parses a non-empty string of octal digits ("0660") into *mode; -1 if malformed. */
static int config_octal(const char *s, unsigned *mode)
{
	if (*s == '\0')
		return -1;
	for (*mode = 0; *s != '\0'; s++) {
		if (*s < '0' || *s > '7' || *mode > 07777)
			return -1;
		*mode = *mode * 8 + (unsigned)(*s - '0');
	}
	return 0;
}

/* Checks allowed_roots and stores the realpath of each; 0 or -1 with problems in err. */
static int config_dirs(struct config *cfg, const struct option *o, const cJSON *v, char *err,
		       size_t errlen)
{
	int n = cJSON_GetArraySize(v), bad = 0, i = 0;
	const cJSON *item;

	if (n < o->min || n > o->max) {
		config_err(err, errlen, "option '%s': expected %g to %g directories, got %d",
			   o->name, o->min, o->max, n);
		return -1;
	}
	cfg->allowed_roots = calloc((size_t)n, sizeof(char *));
	if (cfg->allowed_roots == NULL) {
		config_err(err, errlen, "out of memory");
		return -1;
	}
	cJSON_ArrayForEach(item, v) {
		struct stat st;
		char *real;

		i++;
		if (!cJSON_IsString(item)) {
			config_err(err, errlen, "option '%s': entry %d: expected a string, got %s",
				   o->name, i, config_json_type(item));
			bad = 1;
			continue;
		}
		if (item->valuestring[0] != '/') {
			config_err(err, errlen, "option '%s': '%s' is not an absolute path",
				   o->name, item->valuestring);
			bad = 1;
			continue;
		}
		if ((real = realpath(item->valuestring, NULL)) == NULL ||
		    stat(real, &st) != 0) {
			if (errno == ENOENT)
				config_err(err, errlen, "option '%s': '%s': No such file or "
					   "directory (create it: mkdir -p %s, or name another "
					   "directory)", o->name, item->valuestring,
					   item->valuestring);
			else
				config_err(err, errlen, "option '%s': '%s': %s", o->name,
					   item->valuestring, strerror(errno));
			free(real);
			bad = 1;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			config_err(err, errlen, "option '%s': '%s' is not a directory", o->name,
				   item->valuestring);
			free(real);
			bad = 1;
			continue;
		}
		cfg->allowed_roots[cfg->n_roots++] = real;
	}
	return bad ? -1 : 0;
}

/* Whether s is a whole JSON number ("2", "0.25"), as a value mistakenly quoted is. */
static int config_is_number(const char *s)
{
	cJSON *v = cJSON_Parse(s);
	int yes = v != NULL && cJSON_IsNumber(v);

	cJSON_Delete(v);
	return yes;
}

/* Edit distance (insertions, deletions, substitutions) between a and b, cut at 99. */
static unsigned config_distance(const char *a, const char *b)
{
	unsigned row[64], la = (unsigned)strlen(a), lb = (unsigned)strlen(b);

	if (la >= 64 || lb >= 64)
		return 99;
	for (unsigned j = 0; j <= lb; j++)
		row[j] = j;
	for (unsigned i = 1; i <= la; i++) {
		unsigned diag = row[0];
		row[0] = i;
		for (unsigned j = 1; j <= lb; j++) {
			unsigned up = row[j];
			unsigned best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* The option name closest to an unknown key (a few edits away, at most a third of the
 * key), or NULL. */
static const char *config_suggest(const char *key)
{
	unsigned best = 99, limit = (unsigned)strlen(key) / 3;
	const char *name = NULL;

	if (limit < 2)
		limit = 2;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		unsigned d = config_distance(key, options[i].name);
		if (d < best) {
			best = d;
			name = options[i].name;
		}
	}
	return best <= limit ? name : NULL;
}

/* Checks v against option o and stores it in cfg; 0 or -1 with the problem in err. */
static int config_set(struct config *cfg, const struct option *o, const cJSON *v, char *err,
		      size_t errlen)
{
	void *field = (char *)cfg + o->off;
	const char *want = NULL;
	unsigned mode;
	double d;
	int level;

	switch (o->type) {
	case OPT_STRING:
		if (!cJSON_IsString(v)) {
			want = "a string";
			break;
		}
		if (strlen(v->valuestring) < o->min || strlen(v->valuestring) > o->max) {
			config_err(err, errlen, "option '%s': length must be %g to %g", o->name,
				   o->min, o->max);
			return -1;
		}
		if ((*(char **)field = strdup(v->valuestring)) == NULL) {
			config_err(err, errlen, "out of memory");
			return -1;
		}
		return 0;
	case OPT_OCTAL:
		if (!cJSON_IsString(v)) {
			want = "an octal string like \"0660\"";
			break;
		}
		if (config_octal(v->valuestring, &mode) != 0 || mode > o->max) {
			config_err(err, errlen, "option '%s': '%s' is not an octal mode up to %o",
				   o->name, v->valuestring, (unsigned)o->max);
			return -1;
		}
		*(unsigned *)field = mode;
		return 0;
	case OPT_DIRS:
		if (!cJSON_IsArray(v)) {
			want = "an array of directories";
			break;
		}
		return config_dirs(cfg, o, v, err, errlen);
	case OPT_NUMBER:
	case OPT_MIB:
	case OPT_UINT:
		if (!cJSON_IsNumber(v)) {
			want = o->type == OPT_UINT ? "an integer" : "a number";
			break;
		}
		d = v->valuedouble;
		if (!(d >= o->min && d <= o->max)) {
			config_err(err, errlen, "option '%s': %g is out of range [%g, %g]", o->name,
				   d, o->min, o->max);
			return -1;
		}
		if (o->type == OPT_UINT && d != (double)(unsigned)d) {
			config_err(err, errlen, "option '%s': %g is not an integer", o->name, d);
			return -1;
		}
		if (o->type == OPT_NUMBER)
			*(double *)field = d;
		else if (o->type == OPT_MIB)
			*(uint64_t *)field = (uint64_t)(d * MIB);
		else
			*(unsigned *)field = (unsigned)d;
		return 0;
	case OPT_LEVEL:
		if (!cJSON_IsString(v)) {
			want = "a string";
			break;
		}
		if ((level = log_level_parse(v->valuestring)) < 0) {
			config_err(err, errlen,
				   "option '%s': '%s' is not one of error, warn, info, debug",
				   o->name, v->valuestring);
			return -1;
		}
		*(int *)field = level;
		return 0;
	case OPT_BOOL:
		if (!cJSON_IsBool(v)) {
			want = "a boolean";
			break;
		}
		*(int *)field = cJSON_IsTrue(v);
		return 0;
	}
	if (cJSON_IsString(v) && (o->type == OPT_NUMBER || o->type == OPT_MIB ||
				  o->type == OPT_UINT) && config_is_number(v->valuestring))
		config_err(err, errlen, "option '%s': expected %s, got the string \"%s\" (write "
			   "%s without quotes)", o->name, want, v->valuestring, v->valuestring);
	else
		config_err(err, errlen, "option '%s': expected %s, got %s", o->name, want,
			   config_json_type(v));
	return -1;
}

/* Sets option o from its default (text in the table, parsed like the file). */
static int config_set_default(struct config *cfg, const struct option *o, char *err,
			      size_t errlen)
{
	cJSON *v = cJSON_Parse(o->def);
	int rc;

	if (v == NULL) {
		config_err(err, errlen, "out of memory");
		return -1;
	}
	rc = config_set(cfg, o, v, err, errlen);
	cJSON_Delete(v);
	return rc;
}

/* Derives chunk and cache sizes: at least 4 chunks, the cache a whole number of them. */
static int config_sizes(struct config *cfg, char *err, size_t errlen)
{
	uint64_t bytes = (uint64_t)(cfg->host_cache_gib * GIB);
	uint64_t chunk = cfg->chunk_bytes & ~(uint64_t)4095;

	if (chunk > bytes / 4) {
		chunk = (bytes / 4) & ~(uint64_t)4095;
		log_info("chunk_size lowered to %llu KiB so the cache holds 4 chunks",
			 (unsigned long long)chunk / 1024);
	}
	if (chunk < 4096) {
		config_err(err, errlen, "host_cache_size %g GiB is too small for 4 chunks",
			   cfg->host_cache_gib);
		return -1;
	}
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
	/* The cache is touched and locked at start: more than the machine has cannot start. */
	if (bytes > ram) {
		config_err(err, errlen, "host_cache_size %g GiB is more than this machine's %.1f "
			   "GiB of memory", cfg->host_cache_gib, (double)ram / GIB);
		return -1;
	}
	cfg->chunk_bytes = chunk;
	cfg->host_cache_bytes = bytes - bytes % chunk;
	cfg->max_region_bytes = (uint64_t)(cfg->max_region_gib * GIB);
	if (cfg->max_region_bytes == 0)
		cfg->max_region_bytes = ram;
	return 0;
}

/* Reads path into a NUL-terminated malloc'd buffer; NULL with the problem in err. */
static char *config_read(const char *path, size_t *len, char *err, size_t errlen)
{
	struct stat st;
	char *buf = NULL;
	ssize_t n = 0;
	int fd;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		config_err(err, errlen, "%s", strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) != 0) {
		config_err(err, errlen, "%s", strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > CONFIG_MAX_FILE) {
		config_err(err, errlen, "not a regular file of at most %d bytes", CONFIG_MAX_FILE);
		goto fail;
	}
	if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
		config_err(err, errlen, "out of memory");
		goto fail;
	}
	*len = 0;
	while (*len < (size_t)st.st_size &&
	       (n = read(fd, buf + *len, (size_t)st.st_size - *len)) > 0)
		*len += (size_t)n;
	if (n < 0) {
		config_err(err, errlen, "%s", strerror(errno));
		goto fail;
	}
	buf[*len] = '\0';
	close(fd);
	return buf;
fail:
	free(buf);
	close(fd);
	return NULL;
}

/* Parses text into a JSON tree; NULL with the syntax error's line and column in err. */
static cJSON *config_parse(const char *text, size_t len, char *err, size_t errlen)
{
	const char *end = NULL;
	cJSON *root;
	unsigned line = 1, col = 1;

	if (memchr(text, '\0', len) != NULL) {
		config_err(err, errlen, "contains a NUL byte");
		return NULL;
	}
	/* The length includes the NUL so that trailing garbage is an error. */
	root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
	if (root != NULL)
		return root;
	if (end == NULL || end < text || end > text + len) {
		config_err(err, errlen, "cannot parse JSON");
		return NULL;
	}
	for (const char *p = text; p < end; p++) {
		col++;
		if (*p == '\n') {
			line++;
			col = 1;
		}
	}
	config_err(err, errlen, "JSON syntax error at line %u, column %u", line, col);
	return NULL;
}

/* Reads, parses and validates path into a fresh config; -1 with every problem in err. */
int config_load(const char *path, struct config **out, char *err, size_t errlen)
{
	size_t len;
	char *text;
	int rc;

	if (errlen > 0)
		err[0] = '\0';
	*out = NULL;
	if ((text = config_read(path, &len, err, errlen)) == NULL)
		return -1;
	rc = config_load_text(text, len, out, err, errlen);
	free(text);
	return rc;
}

/* Parses and validates len bytes of JSON text into a fresh config; -1 with every problem in
 * err. */
int config_load_text(const char *text, size_t len, struct config **out, char *err,
		     size_t errlen)
{
	int seen[N_OPTIONS] = { 0 }, failed[N_OPTIONS] = { 0 }, sizes_ok = 1;
	struct config *cfg;
	const cJSON *item;
	cJSON *root;
	int bad = 0;

	if (errlen > 0)
		err[0] = '\0';
	*out = NULL;
	root = config_parse(text, len, err, errlen);
	if (root == NULL)
		return -1;
	if (!cJSON_IsObject(root)) {
		config_err(err, errlen, "expected a JSON object, got %s", config_json_type(root));
		goto fail_root;
	}
	if ((cfg = calloc(1, sizeof(*cfg))) == NULL) {
		config_err(err, errlen, "out of memory");
		goto fail_root;
	}
	cfg->refs = 1;

	cJSON_ArrayForEach(item, root) {
		size_t i;
		for (i = 0; i < N_OPTIONS; i++)
			if (strcmp(item->string, options[i].name) == 0)
				break;
		if (i == N_OPTIONS) {
			const char *near = config_suggest(item->string);
			if (near)
				config_err(err, errlen, "unknown option '%s' (did you mean '%s'?)",
					   item->string, near);
			else
				config_err(err, errlen, "unknown option '%s' (dsckptd --help lists "
					   "the options)", item->string);
			bad = 1;
		} else if (seen[i]++) {
			config_err(err, errlen, "duplicate option '%s'", item->string);
			bad = 1;
		} else if (config_set(cfg, &options[i], item, err, errlen) != 0) {
			failed[i] = 1;
			bad = 1;
		}
	}
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (!seen[i] && config_set_default(cfg, &options[i], err, errlen) != 0)
			bad = 1;
	cJSON_Delete(root);
	/* One message per mistake: what is derived from a value already refused is not checked. */
	for (size_t i = 0; i < N_OPTIONS; i++)
		sizes_ok &= !(failed[i] && (options[i].off == OFF(host_cache_gib) ||
					    options[i].off == OFF(chunk_bytes) ||
					    options[i].off == OFF(max_region_gib)));

	for (const char *h = cfg->host; h && *h; h++) {
		if (*h <= ' ' || *h > '~' || *h == '/') {
			config_err(err, errlen, "option 'host': printable ASCII without spaces or '/'");
			bad = 1;
			break;
		}
	}
	cfg->socket_gid = (gid_t)-1;
	if (cfg->socket_group && cfg->socket_group[0]) {
		struct group *g = getgrnam(cfg->socket_group);
		if (g)
			cfg->socket_gid = g->gr_gid;
		else {
			config_err(err, errlen, "option 'socket_group': no group '%s' on this "
				   "machine (make it: groupadd %s, or systemd-sysusers for "
				   "\"dsckpt\")", cfg->socket_group, cfg->socket_group);
			bad = 1;
		}
	}
	if (cfg->socket && cfg->socket[0] != '/') {
		config_err(err, errlen, "option 'socket': '%s' is not an absolute path", cfg->socket);
		bad = 1;
	}
	/* The sizes are checked even after another problem: -n names every one at once. */
	if ((sizes_ok && config_sizes(cfg, err, errlen) != 0) || bad) {
		config_free(cfg);
		return -1;
	}
	*out = cfg;
	return 0;

fail_root:
	cJSON_Delete(root);
	return -1;
}

/* Takes a reference to cfg for work that outlives a reload (loop thread); returns cfg. */
struct config *config_ref(struct config *cfg)
{
	cfg->refs++;
	return cfg;
}

/* Drops a reference (loop thread); the last one frees the config. */
void config_unref(struct config *cfg)
{
	if (cfg && --cfg->refs == 0)
		config_free(cfg);
}

/* Frees a config, whatever its references. */
void config_free(struct config *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < cfg->n_roots; i++)
		free(cfg->allowed_roots[i]);
	free(cfg->allowed_roots);
	free(cfg->socket);
	free(cfg->socket_group);
	free(cfg->host);
	free(cfg);
}

/* Prints every option (name, type, range, default, help) for --help. */
void config_print_help(FILE *f)
{
	fprintf(f, "Configuration (a JSON object; every key is optional):\n");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct option *o = &options[i];
		fprintf(f, "  %-24s ", o->name);
		switch (o->type) {
		case OPT_STRING:
			fprintf(f, "string of %g to %g bytes", o->min, o->max);
			break;
		case OPT_OCTAL:
			fprintf(f, "octal string up to \"%04o\"", (unsigned)o->max);
			break;
		case OPT_DIRS:
			fprintf(f, "array of %g to %g absolute directories", o->min, o->max);
			break;
		case OPT_NUMBER:
		case OPT_MIB:
			fprintf(f, "number in [%g, %g]", o->min, o->max);
			break;
		case OPT_UINT:
			fprintf(f, "integer in [%.0f, %.0f]", o->min, o->max);
			break;
		case OPT_LEVEL:
			fprintf(f, "\"error\", \"warn\", \"info\" or \"debug\"");
			break;
		case OPT_BOOL:
			fprintf(f, "true or false");
			break;
		}
		fprintf(f, ", default %s\n  %-24s %s\n", o->def, "", o->help);
	}
}
