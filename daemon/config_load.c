/*
 * config_load.c — the JSON configuration read, parsed and validated by config.c's option
 * table into a fresh struct config (the caller swaps it in), every problem reported at once
 * and each absent key given its default. It and config_remote.c (the remote tier's keys)
 * are the only files that include cJSON.h; the tree is freed as soon as the values are
 * copied out.
 */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_MAX_FILE (1 << 20)
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

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
	cfg->root_remotes = calloc((size_t)n, sizeof(char *));
	if (cfg->allowed_roots == NULL || cfg->root_remotes == NULL) {
		config_err(err, errlen, "out of memory");
		return -1;
	}
	cJSON_ArrayForEach(item, v) {
		const char *name = item->valuestring;
		char *real, *remote = NULL;
		struct stat st;

		i++;
		if (cJSON_IsObject(item)) {
			if (config_root_object(i, item, &name, &remote, err, errlen) != 0) {
				bad = 1;
				continue;
			}
		} else if (!cJSON_IsString(item)) {
			config_err(err, errlen, "option '%s': entry %d: expected a string or an "
				   "object {\"path\", \"remote\"}, got %s", o->name, i,
				   config_json_type(item));
			bad = 1;
			continue;
		}
		if (name[0] != '/') {
			config_err(err, errlen, "option '%s': '%s' is not an absolute path",
				   o->name, name);
			free(remote);
			bad = 1;
			continue;
		}
		if ((real = realpath(name, NULL)) == NULL || stat(real, &st) != 0) {
			if (errno == ENOENT)
				config_err(err, errlen, "option '%s': '%s': No such file or "
					   "directory (create it: mkdir -p %s, or name another "
					   "directory)", o->name, name, name);
			else
				config_err(err, errlen, "option '%s': '%s': %s", o->name, name,
					   strerror(errno));
			free(remote);
			free(real);
			bad = 1;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			config_err(err, errlen, "option '%s': '%s' is not a directory", o->name,
				   name);
			free(remote);
			free(real);
			bad = 1;
			continue;
		}
		cfg->root_remotes[cfg->n_roots] = remote;
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
	case OPT_S3:
		if (!cJSON_IsObject(v)) {
			want = "an object";
			break;
		}
		return config_s3(cfg, o, v, err, errlen);
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
	int seen[CONFIG_MAX_OPTIONS] = { 0 }, failed[CONFIG_MAX_OPTIONS] = { 0 }, sizes_ok = 1;
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
		for (i = 0; i < config_noptions; i++)
			if (strcmp(item->string, config_options[i].name) == 0)
				break;
		if (i == config_noptions) {
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
		} else if (config_set(cfg, &config_options[i], item, err, errlen) != 0) {
			failed[i] = 1;
			bad = 1;
		}
	}
	for (size_t i = 0; i < config_noptions; i++)
		if (!seen[i] && config_set_default(cfg, &config_options[i], err, errlen) != 0)
			bad = 1;
	cJSON_Delete(root);
	/* One message per mistake: what is derived from a value already refused is not checked. */
	for (size_t i = 0; i < config_noptions; i++)
		sizes_ok &= !(failed[i] && (config_options[i].off == OFF(host_cache_gib) ||
					    config_options[i].off == OFF(chunk_bytes) ||
					    config_options[i].off == OFF(max_region_gib)));

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
	if (config_remote_check(cfg, err, errlen) != 0)
		bad = 1;
	if (config_peer_check(cfg, err, errlen) != 0)
		bad = 1;
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
