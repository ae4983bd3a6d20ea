/*
 * config_remote.c — the remote tier's configuration (DESIGN.md §9): a root given as
 * {"path": DIR, "remote": URL}, where URL is s3://bucket/prefix or file:///dir; the "s3"
 * object (endpoint, region, addressing, credentials_file); and the credentials file, read
 * here so that `dsckptd -n` and a reload refuse a bad one. That file must be owned by the
 * daemon's user and private to it (what systemd's LoadCredential= makes); it is opened as a
 * file of a user-writable tree is (format/userfile.c: no FIFO, no link, bounded), and its
 * values never reach a message. Beside config_load.c, the one other file that includes
 * cJSON.h.
 */
#include "config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CREDENTIALS_MAX (64 * 1024)
#define ENDPOINT_MAX 512

/* Whether s is a path of segments of [A-Za-z0-9._-], none empty, "." or ".." (a key
 * prefix, a directory); a leading '/' is the caller's to strip. */
static int config_clean_path(const char *s)
{
	const char *seg = s;

	for (const char *p = s;; p++) {
		if (*p == '/' || *p == '\0') {
			size_t n = (size_t)(p - seg);
			if (n == 0 || (n == 1 && seg[0] == '.') ||
			    (n == 2 && seg[0] == '.' && seg[1] == '.'))
				return 0;
			if (*p == '\0')
				return 1;
			seg = p + 1;
		} else if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-') {
			return 0;
		}
	}
}

/* Checks a remote URL (s3://bucket[/prefix] or file:///dir); NULL, or what is wrong. */
static const char *config_remote_url(const char *url)
{
	if (strncmp(url, "s3://", 5) == 0) {
		const char *b = url + 5, *slash = strchr(b, '/');
		size_t n = slash ? (size_t)(slash - b) : strlen(b);
		if (n < 3 || n > 63 || !isalnum((unsigned char)b[0]) ||
		    !isalnum((unsigned char)b[n - 1]))
			return "a bucket name is 3 to 63 characters, starting and ending with a "
			       "letter or digit";
		for (size_t i = 0; i < n; i++)
			if (!islower((unsigned char)b[i]) && !isdigit((unsigned char)b[i]) &&
			    b[i] != '-' && b[i] != '.')
				return "a bucket name has lower-case letters, digits, '-' and '.'";
		if (slash && !config_clean_path(slash + 1))
			return "the prefix after the bucket must be names of letters, digits, "
			       "'.', '_' and '-' between single '/' (no '.', '..' or trailing '/')";
		return NULL;
	}
	if (strncmp(url, "file://", 7) == 0) {
		if (url[7] != '/' || !config_clean_path(url + 8))
			return "file:// takes an absolute directory of names of letters, digits, "
			       "'.', '_' and '-' (file:///shared/ckpt)";
		if (strlen(url + 7) >= 1024)
			return "the directory's name is too long";
		return NULL;
	}
	return "expected s3://bucket/prefix or file:///directory";
}

/* Entry i of allowed_roots given as an object: its path and its checked remote. */
int config_root_object(int i, const void *item, const char **path, char **remote, char *err,
		       size_t errlen)
{
	const cJSON *v, *p = NULL, *r = NULL;
	const char *why;
	int bad = 0;

	*remote = NULL;
	cJSON_ArrayForEach(v, (const cJSON *)item) {
		if (strcmp(v->string, "path") == 0 && p == NULL)
			p = v;
		else if (strcmp(v->string, "remote") == 0 && r == NULL)
			r = v;
		else {
			config_err(err, errlen, "option 'allowed_roots': entry %d: unexpected key "
				   "'%s' (an entry takes \"path\" and \"remote\", once each)", i,
				   v->string);
			bad = 1;
		}
	}
	if (p == NULL || !cJSON_IsString(p)) {
		config_err(err, errlen, "option 'allowed_roots': entry %d: \"path\" must be a "
			   "string, the root's directory", i);
		return -1;
	}
	if (r != NULL && !cJSON_IsString(r)) {
		config_err(err, errlen, "option 'allowed_roots': entry %d: \"remote\" must be a "
			   "string (s3://bucket/prefix or file:///directory)", i);
		return -1;
	}
	if (r != NULL && (why = config_remote_url(r->valuestring)) != NULL) {
		config_err(err, errlen, "option 'allowed_roots': entry %d: remote '%s': %s", i,
			   r->valuestring, why);
		return -1;
	}
	if (bad)
		return -1;
	if (r != NULL && (*remote = strdup(r->valuestring)) == NULL) {
		config_err(err, errlen, "out of memory");
		return -1;
	}
	*path = p->valuestring;
	return 0;
}

/* Stores a copy of s in *field; -1 with err without memory. */
static int config_dup(char **field, const char *s, char *err, size_t errlen)
{
	free(*field);
	if ((*field = strdup(s)) == NULL) {
		config_err(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* Checks an endpoint: "" or http(s)://host[:port] with no path; NULL or what is wrong. */
static const char *config_endpoint(const char *s)
{
	const char *host;

	if (s[0] == '\0')
		return NULL;
	if (strncmp(s, "https://", 8) == 0)
		host = s + 8;
	else if (strncmp(s, "http://", 7) == 0)
		host = s + 7;
	else
		return "expected \"\" (AWS) or http(s)://host[:port]";
	if (host[0] == '\0' || strlen(s) > ENDPOINT_MAX)
		return "expected http(s)://host[:port], at most 512 characters";
	for (const char *p = host; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr(".-:[]", *p))
			return "expected http(s)://host[:port] with no path, user or query";
	return NULL;
}

/* The "s3" object into cfg, every absent key its default. */
int config_s3(struct config *cfg, const struct option *o, const void *obj, char *err,
	      size_t errlen)
{
	const cJSON *v;
	const char *why;
	int bad = 0;

	if (config_dup(&cfg->s3_endpoint, "", err, errlen) != 0 ||
	    config_dup(&cfg->s3_region, "us-east-1", err, errlen) != 0 ||
	    config_dup(&cfg->s3_credentials_file, "", err, errlen) != 0)
		return -1;
	cfg->s3_virtual = 1;
	cJSON_ArrayForEach(v, (const cJSON *)obj) {
		const char *k = v->string, *s = cJSON_IsString(v) ? v->valuestring : NULL;
		if (strcmp(k, "endpoint") == 0 || strcmp(k, "region") == 0 ||
		    strcmp(k, "addressing") == 0 || strcmp(k, "credentials_file") == 0) {
			if (s == NULL) {
				config_err(err, errlen, "option '%s': '%s' must be a string",
					   o->name, k);
				bad = 1;
				continue;
			}
		} else {
			config_err(err, errlen, "option '%s': unknown key '%s' (it takes endpoint, "
				   "region, addressing, credentials_file)", o->name, k);
			bad = 1;
			continue;
		}
		if (strcmp(k, "endpoint") == 0) {
			if ((why = config_endpoint(s)) != NULL) {
				config_err(err, errlen, "option '%s': endpoint '%s': %s", o->name, s,
					   why);
				bad = 1;
			} else if (config_dup(&cfg->s3_endpoint, s, err, errlen) != 0)
				return -1;
		} else if (strcmp(k, "region") == 0) {
			size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-");
			if (n == 0 || s[n] != '\0' || n > 64) {
				config_err(err, errlen, "option '%s': region '%s' is not a region name "
					   "like \"us-east-1\"", o->name, s);
				bad = 1;
			} else if (config_dup(&cfg->s3_region, s, err, errlen) != 0)
				return -1;
		} else if (strcmp(k, "addressing") == 0) {
			if (strcmp(s, "virtual") != 0 && strcmp(s, "path") != 0) {
				config_err(err, errlen, "option '%s': addressing '%s' is not "
					   "\"virtual\" or \"path\"", o->name, s);
				bad = 1;
			}
			cfg->s3_virtual = strcmp(s, "path") != 0;
		} else {
			if (s[0] != '\0' && s[0] != '/') {
				config_err(err, errlen, "option '%s': credentials_file '%s' is not an "
					   "absolute path", o->name, s);
				bad = 1;
			} else if (config_dup(&cfg->s3_credentials_file, s, err, errlen) != 0)
				return -1;
		}
	}
	return bad ? -1 : 0;
}

/* Copies the value of "key = value" into *field when key is name; whether it was. */
static int config_ini_value(const char *key, const char *value, const char *name, char **field)
{
	if (strcmp(key, name) != 0)
		return 0;
	if (*field) {
		explicit_bzero(*field, strlen(*field));
		free(*field);
	}
	*field = strdup(value);
	return 1;
}

/* Parses the [default] section of AWS shared-credentials text (modified in place) into cfg. */
static void config_ini(struct config *cfg, char *text)
{
	int in_default = 0;

	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char *end = line + strlen(line), *eq;
		while (isspace((unsigned char)*line))
			line++;
		while (end > line && isspace((unsigned char)end[-1]))
			*--end = '\0';
		if (*line == '#' || *line == ';' || *line == '\0')
			continue;
		if (*line == '[') {
			in_default = strcmp(line, "[default]") == 0;
			continue;
		}
		if (!in_default || (eq = strchr(line, '=')) == NULL)
			continue;
		char *k = line, *val = eq + 1, *kend = eq;
		while (kend > k && isspace((unsigned char)kend[-1]))
			kend--;
		*kend = '\0';
		while (isspace((unsigned char)*val))
			val++;
		if (!config_ini_value(k, val, "aws_access_key_id", &cfg->s3_key_id) &&
		    !config_ini_value(k, val, "aws_secret_access_key", &cfg->s3_secret))
			config_ini_value(k, val, "aws_session_token", &cfg->s3_token);
	}
}

/* Reads the credentials file (owned by us, private) into cfg; 0 or -1 with err. */
static int config_credentials(struct config *cfg, char *err, size_t errlen)
{
	const char *path = cfg->s3_credentials_file;
	char why[256];
	struct stat st;
	size_t len;
	int e;

	int fd = userfile_open(AT_FDCWD, path, CREDENTIALS_MAX, 0, &st, why, sizeof(why));
	if (fd < 0) {
		config_err(err, errlen, "option 's3': credentials_file '%s': %s", path, why);
		return -1;
	}
	close(fd);
	/* Checked on what was opened; read again below by the same safe open. */
	if (st.st_uid != geteuid()) {
		config_err(err, errlen, "option 's3': credentials_file '%s' is owned by uid %u, "
			   "not by the daemon's uid %u (chown it to the daemon's user)", path,
			   (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (st.st_mode & 077) {
		config_err(err, errlen, "option 's3': credentials_file '%s' has mode %04o: group "
			   "or others may read or write it (chmod 600 %s)", path,
			   (unsigned)(st.st_mode & 07777), path);
		return -1;
	}
	char *text = userfile_read(AT_FDCWD, path, CREDENTIALS_MAX, 0, &len, &e, why,
				   sizeof(why));
	if (text == NULL) {
		config_err(err, errlen, "option 's3': credentials_file '%s': %s", path, why);
		return -1;
	}
	config_ini(cfg, text);
	explicit_bzero(text, len);
	free(text);
	if (cfg->s3_key_id == NULL || cfg->s3_secret == NULL || !cfg->s3_key_id[0] ||
	    !cfg->s3_secret[0]) {
		config_err(err, errlen, "option 's3': credentials_file '%s' has no "
			   "aws_access_key_id and aws_secret_access_key in [default]", path);
		return -1;
	}
	return 0;
}

/* What holds across keys: s3:// remotes need credentials, which are read. */
int config_remote_check(struct config *cfg, char *err, size_t errlen)
{
	const char *s3_root = NULL;

	for (size_t i = 0; i < cfg->n_roots; i++)
		if (cfg->root_remotes[i] && strncmp(cfg->root_remotes[i], "s3://", 5) == 0)
			s3_root = cfg->root_remotes[i];
	/* The "s3" object refused: it said why already. */
	if (cfg->s3_credentials_file == NULL)
		return s3_root ? -1 : 0;
	if (cfg->s3_credentials_file[0] != '\0')
		return config_credentials(cfg, err, errlen);
	if (s3_root) {
		config_err(err, errlen, "option 's3': the remote '%s' needs credentials_file "
			   "(the AWS shared-credentials format, [default])", s3_root);
		return -1;
	}
	return 0;
}

/* The index of the allowed root of cfg that path (absolute, canonical) lies in or below, or
 * -1; with its remote ("s3://…", "file://…" or NULL) in *remote when remote is not NULL. */
int config_root_of(const struct config *cfg, const char *path, const char **remote)
{
	for (size_t i = 0; i < cfg->n_roots; i++) {
		const char *root = cfg->allowed_roots[i];
		size_t n = strlen(root);
		if (strncmp(path, root, n) != 0 ||
		    (path[n] != '/' && path[n] != '\0' && !(n == 1 && root[0] == '/')))
			continue;
		if (remote)
			*remote = cfg->root_remotes ? cfg->root_remotes[i] : NULL;
		return (int)i;
	}
	if (remote)
		*remote = NULL;
	return -1;
}
