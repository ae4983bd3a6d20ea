/*
 * moto.c — moto's standalone S3 server and what the S3 suites share (see moto.h).
 */
#include "moto.h"

#include <arpa/inet.h>
#include <check.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "../daemon/dsckptd.h"

static char moto_bin[512];

/* The moto_server to run, or NULL (then the tests say SKIP). */
const char *moto_path(void)
{
	const char *env = getenv("MOTO_SERVER");
	snprintf(moto_bin, sizeof(moto_bin), "%s", env && env[0] ? env :
		 "build/venv-moto/bin/moto_server");
	return access(moto_bin, X_OK) == 0 ? moto_bin : NULL;
}

/* A TCP port nothing listens on now (bound, then closed). */
int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0)
		return -1;
	close(fd);
	return ntohs(a.sin_port);
}

/* Whether something accepts connections on port. */
static int port_open(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Starts moto on port (0: a free one), with IAM authentication after auth_after requests
 * when auth_after >= 0; waits until it answers. 0, or -1 (it did not come up in 120 s). */
int moto_start(struct moto *m, int port, int auth_after)
{
	char portstr[16];
	m->port = port ? port : free_port();
	snprintf(portstr, sizeof(portstr), "%d", m->port);
	snprintf(m->log, sizeof(m->log), "/tmp/check_remote_s3.moto.%d.log", m->port);
	if ((m->pid = fork()) == 0) {
		int fd = open(m->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		/* It dies with whoever started it, a test that failed half-way too. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(127);
		if (auth_after >= 0) {
			char n[16];
			snprintf(n, sizeof(n), "%d", auth_after);
			setenv("INITIAL_NO_AUTH_ACTION_COUNT", n, 1);
		}
		execl(moto_bin, moto_bin, "-H", "127.0.0.1", "-p", portstr, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1200; i++) {
		if (port_open(m->port))
			return 0;
		if (waitpid(m->pid, NULL, WNOHANG) == m->pid)
			return -1;
		h_sleep_ms(100);
	}
	return -1;
}

/* Starts tests/s3_proxy.py on a free port, to moto at upstream, page uploads a page. */
int proxy_start(struct proxy *p, int upstream, int page)
{
	char port[16], up[16], pg[16];

	h_tmpdir(p->dir, sizeof(p->dir));
	p->port = free_port();
	snprintf(port, sizeof(port), "%d", p->port);
	snprintf(up, sizeof(up), "%d", upstream);
	snprintf(pg, sizeof(pg), "%d", page);
	if ((p->pid = fork()) == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(127);
		execl("/usr/bin/python3", "python3", "tests/s3_proxy.py", port, up, p->dir, pg,
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 600; i++) {
		if (port_open(p->port))
			return 0;
		if (waitpid(p->pid, NULL, WNOHANG) == p->pid)
			return -1;
		h_sleep_ms(100);
	}
	return -1;
}

/* Kills the proxy and removes its directory. */
void proxy_kill(struct proxy *p)
{
	if (p->pid > 0) {
		kill(p->pid, SIGKILL);
		waitpid(p->pid, NULL, 0);
		p->pid = 0;
	}
	h_rm_rf(p->dir);
}

/* Holds each request whose "METHOD path" contains text (NULL: lets them go). */
void proxy_hold(struct proxy *p, const char *text)
{
	char path[300], tmp[310];

	snprintf(path, sizeof(path), "%s/hold", p->dir);
	if (!text) {
		unlink(path);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	ck_assert_int_eq(rename(tmp, path), 0);
}

/* The request line held now ("" when none was yet). */
void proxy_held(const struct proxy *p, char *line, size_t len)
{
	char path[300];
	size_t n;

	snprintf(path, sizeof(path), "%s/held", p->dir);
	char *text = h_read_file(path, &n);
	snprintf(line, len, "%s", text ? text : "");
	free(text);
}

/* How many listing pages the proxy served with a key-marker. */
int proxy_pages_after_first(const struct proxy *p)
{
	char path[300];
	size_t n;
	int pages = 0;

	snprintf(path, sizeof(path), "%s/pages.log", p->dir);
	char *text = h_read_file(path, &n);
	for (const char *l = text; l && (l = strstr(l, "key-marker=")) != NULL; l++)
		pages += l[strlen("key-marker=")] != ' ';
	free(text);
	return pages;
}

/* Kills moto (SIGKILL: a server gone at once, mid-request). */
void moto_kill(struct moto *m)
{
	if (m->pid > 0) {
		kill(m->pid, SIGKILL);
		waitpid(m->pid, NULL, 0);
		m->pid = 0;
	}
}

/* Writes the body of a raw request into a bounded buffer. */
static size_t raw_write(char *d, size_t s, size_t n, void *arg)
{
	char **o = arg;
	size_t len = s * n, have = strlen(o[0]);
	size_t room = (size_t)(o[1] - o[0]) - have - 1;
	memcpy(o[0] + have, d, len < room ? len : room);
	o[0][have + (len < room ? len : room)] = '\0';
	return len;
}

/* One request to moto, signed with made-up keys (see moto.h): the status. */
long raw(int port, const char *method, const char *path, const char *body, char *out,
	 size_t outlen)
{
	char url[1024], tmp[8192] = "";
	char *o[2] = { out ? out : tmp, out ? out + outlen : tmp + sizeof(tmp) };
	long status = 0;
	CURL *h = curl_easy_init();
	o[0][0] = '\0';
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	struct curl_slist *hdr = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_AWS_SIGV4, strcmp(path, "/") == 0 ? "aws:amz:us-east-1:iam" :
			 "aws:amz:us-east-1:s3");
	curl_easy_setopt(h, CURLOPT_USERPWD, "AKIDRAW:raw");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	if (body)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, raw_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, o);
	if (curl_easy_perform(h) == CURLE_OK)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(h);
	curl_slist_free_all(hdr);
	return status;
}

/* Makes bucket on moto at port. */
void make_bucket(int port, const char *bucket)
{
	char path[128];
	snprintf(path, sizeof(path), "/%s", bucket);
	ck_assert_int_eq(raw(port, "PUT", path, NULL, NULL, 0), 200);
}

struct moto moto_shared;

/* curl, and the suite's shared moto when moto is installed. */
void moto_shared_up(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (moto_path() != NULL)
		ck_assert_msg(moto_start(&moto_shared, 0, -1) == 0, "%s did not start (log %s)",
			      moto_path(), moto_shared.log);
}

/* Kills the shared moto and removes its log. */
void moto_shared_down(void)
{
	moto_kill(&moto_shared);
	unlink(moto_shared.log);
}

/* A config for remote_open: moto at port, path addressing, our test credentials. */
struct config *test_cfg(int port, int virtual_hosted)
{
	struct config *c = calloc(1, sizeof(*c));
	char ep[64];
	snprintf(ep, sizeof(ep), "http://%s:%d", virtual_hosted ? "localhost" : "127.0.0.1",
		 port);
	c->refs = 1;
	c->s3_endpoint = strdup(ep);
	c->s3_region = strdup("us-east-1");
	c->s3_credentials_file = strdup("");
	c->s3_virtual = virtual_hosted;
	c->s3_key_id = strdup(KEY_ID);
	c->s3_secret = strdup(SECRET);
	c->s3_token = strdup(TOKEN);
	c->upload_concurrency = 4;
	c->upload_part_bytes = 5 * MIB;
	c->file_mode = 0600;
	c->dir_mode = 0700;
	return c;
}

/* Opens remote url against moto at port. */
struct remote *open_remote(struct config *c, const char *url)
{
	char err[ERRLEN];
	struct remote *r;
	ck_assert_msg(remote_open(c, url, &r, err, sizeof(err)) == 0, "%s", err);
	return r;
}

/* Reads from a memory buffer: an upload's source. */
int mem_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memcpy(buf, (const char *)arg + off, len);
	return 0;
}


/* remote_list_uploads' callback: counts. */
int count_upload(void *arg, const char *key, const char *id)
{
	struct found *f = arg;
	f->n++;
	snprintf(f->key, sizeof(f->key), "%s", key);
	snprintf(f->id, sizeof(f->id), "%s", id);
	return 0;
}

/* How many uploads are open under r. */
int open_uploads(struct remote *r, struct found *f)
{
	char err[ERRLEN];
	memset(f, 0, sizeof(*f));
	ck_assert_msg(remote_list_uploads(r, "", count_upload, f, err, sizeof(err)) == 0, "%s",
		      err);
	return f->n;
}

/* Reads key from r whole (malloc'd, NUL after it); NULL when it is not there. */
char *remote_read(struct remote *r, const char *key, size_t *len)
{
	char err[ERRLEN];
	uint64_t size;

	if (remote_head(r, key, &size, NULL, err, sizeof(err)) < 0)
		return NULL;
	char *buf = malloc(size + 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_msg(remote_get(r, key, 0, buf, size, err, sizeof(err)) == 0, "%s", err);
	buf[size] = '\0';
	*len = size;
	return buf;
}

/* The keys of a daemon's config for moto at port (moto.h), extra after them, into json. */
void s3_daemon_json(char *json, size_t len, int port, const char *extra)
{
	char dir[256], creds[300];

	h_tmpdir(dir, sizeof(dir));
	snprintf(creds, sizeof(creds), "%s/creds", dir);
	FILE *f = fopen(creds, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n", KEY_ID,
		SECRET);
	fclose(f);
	ck_assert_int_eq(chmod(creds, 0600), 0);
	ck_assert_int_lt(snprintf(json, len, "\"s3\": {\"endpoint\": \"http://127.0.0.1:%d\", "
				  "\"region\": \"us-east-1\", \"addressing\": \"path\", "
				  "\"credentials_file\": \"%s\"}, \"upload_part_size\": 5, "
				  "\"chunk_size\": 1, %s", port, creds, extra ? extra : ""),
			 (int)len);
}

/* Sets up tier t as the daemon's remote, its config keys into json; t->r or NULL (SKIP). */
struct remote *tier_up(struct tier *t, int s3, char *json, size_t len, const char *extra)
{
	memset(t, 0, sizeof(*t));
	t->s3 = s3;
	if (!s3) {
		h_tmpdir(t->dir, sizeof(t->dir));
		snprintf(t->url, sizeof(t->url), "file://%s", t->dir);
		snprintf(json, len, "\"chunk_size\": 1, %s", extra);
		t->cfg = test_cfg(1, 0);
	} else {
		if (!moto_path()) {
			printf("SKIP: no moto_server (make moto, or $MOTO_SERVER)\n");
			return NULL;
		}
		ck_assert_int_eq(moto_start(&t->moto, 0, -1), 0);
		make_bucket(t->moto.port, "bkt");
		snprintf(t->url, sizeof(t->url), "s3://bkt/pre");
		s3_daemon_json(json, len, t->moto.port, extra);
		t->cfg = test_cfg(t->moto.port, 0);
	}
	h_root_remote = t->url;
	return t->r = open_remote(t->cfg, t->url);
}

/* Closes the test's handle, and stops moto or removes the directory. */
void tier_down(struct tier *t)
{
	remote_close(t->r);
	config_free(t->cfg);
	t->r = NULL;
	t->cfg = NULL;
	if (t->s3)
		moto_kill(&t->moto);
	else
		h_rm_rf(t->dir);
}

/* Sends this process's stderr (the log) to a new temporary file; the saved stderr. */
int capture_begin(char *path)
{
	int fd = mkstemp(path), saved = dup(2);
	ck_assert_int_ge(fd, 0);
	dup2(fd, 2);
	close(fd);
	log_init("check_remote_s3", LOG_LVL_DEBUG);
	return saved;
}

/* Puts stderr back; what was logged (malloc'd), the file removed. */
char *capture_end(char *path, int saved)
{
	size_t len;
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	log_init("check_remote_s3", LOG_LVL_ERROR);
	char *log = h_read_file(path, &len);
	unlink(path);
	ck_assert_ptr_nonnull(log);
	return log;
}
