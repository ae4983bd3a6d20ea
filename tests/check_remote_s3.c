/*
 * check_remote_s3.c — remote.c's S3 tier (remote_s3.c) against a real S3-compatible server:
 * moto's standalone server, started on 127.0.0.1 by the suite ($MOTO_SERVER, else
 * build/venv-moto/bin/moto_server, which `make check` installs). Conditional writes and a
 * race between two writers, a 40 MiB multipart upload in parallel parts read back by ranges,
 * aborted uploads, each kind of failure with its message, a server killed mid-upload, and no
 * credential in a log line or a message. Without moto each test says SKIP.
 */
#include "../daemon/dsckptd.h"
#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)
#define KEY_ID "AKIDCHECKREMOTES3"
#define SECRET "check/remote/s3+SECRETvalue0123456789"
#define TOKEN "TOKENcheckremotes3session"

/* A moto server of the test's own. */
struct moto {
	pid_t pid;
	int port;
	char log[300];
};

static struct moto shared;    /* started by main for the tests that share one */
static char moto_bin[512];
static char err[ERRLEN];

/* The moto_server to run, or NULL (then the tests say SKIP). */
static const char *moto_path(void)
{
	const char *env = getenv("MOTO_SERVER");
	snprintf(moto_bin, sizeof(moto_bin), "%s", env && env[0] ? env :
		 "build/venv-moto/bin/moto_server");
	return access(moto_bin, X_OK) == 0 ? moto_bin : NULL;
}

/* A TCP port nothing listens on now (bound, then closed). */
static int free_port(void)
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
static int moto_start(struct moto *m, int port, int auth_after)
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

/* Kills moto (SIGKILL: a server gone at once, mid-request). */
static void moto_kill(struct moto *m)
{
	if (m->pid > 0) {
		kill(m->pid, SIGKILL);
		waitpid(m->pid, NULL, 0);
		m->pid = 0;
	}
}

/* One request to moto, signed with made-up keys (moto checks signatures only when asked;
 * it routes by the signature's service: "iam" for a path of "/", else "s3"): the status. */
static long raw(int port, const char *method, const char *path, const char *body, char *out,
		size_t outlen);

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

static long raw(int port, const char *method, const char *path, const char *body, char *out,
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
static void make_bucket(int port, const char *bucket)
{
	char path[128];
	snprintf(path, sizeof(path), "/%s", bucket);
	ck_assert_int_eq(raw(port, "PUT", path, NULL, NULL, 0), 200);
}

/* A config for remote_open: moto at port, path addressing, our test credentials. */
static struct config *test_cfg(int port, int virtual_hosted)
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
static struct remote *open_remote(struct config *c, const char *url)
{
	struct remote *r;
	ck_assert_msg(remote_open(c, url, &r, err, sizeof(err)) == 0, "%s", err);
	return r;
}

/* Reads from a memory buffer: an upload's source. */
static int mem_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memcpy(buf, (const char *)arg + off, len);
	return 0;
}

/* Says SKIP and returns from the test when moto is not installed. */
#define NEED_MOTO()                                                                       \
	do {                                                                              \
		if (moto_path() == NULL || shared.pid <= 0) {                             \
			printf("SKIP: %s: no moto_server (make check installs it into "   \
			       "build/venv-moto)\n", __func__);                            \
			return;                                                           \
		}                                                                         \
	} while (0)

START_TEST(test_conditional_put)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 0);
	make_bucket(shared.port, "cond");
	struct remote *r = open_remote(c, "s3://cond/team/ckpt");
	char e1[REMOTE_ETAG_MAX], e2[REMOTE_ETAG_MAX], buf[16] = "";
	uint64_t size;

	ck_assert_msg(remote_check(r, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_put(r, "job/latest", "tag-1", 5, REMOTE_CREATE, NULL, e1, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_int_gt(strlen(e1), 2);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_CREATE, NULL, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(strstr(err, "precondition failed (HTTP 412)"), "%s", err);
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-X", 5, REMOTE_REPLACE, "\"0000\"",
				    NULL, err, sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_put(r, "job/latest", "tag-2", 5, REMOTE_REPLACE, e1, e2, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_str_ne(e1, e2);
	/* The old etag no longer matches: latest moves only from what the writer saw. */
	ck_assert_int_eq(remote_put(r, "job/latest", "tag-1", 5, REMOTE_REPLACE, e1, NULL, err,
				    sizeof(err)), ERR_EEXIST);
	ck_assert_msg(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(buf, "tag-2");
	ck_assert_msg(remote_head(r, "job/latest", &size, e1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, 5);
	ck_assert_str_eq(e1, e2);
	/* Under the prefix, as the key says. */
	ck_assert_int_eq(raw(shared.port, "GET", "/cond/team/ckpt/job/latest", NULL, buf,
			     sizeof(buf)), 200);
	ck_assert_str_eq(buf, "tag-2");
	ck_assert_msg(remote_delete(r, "job/latest", err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(remote_head(r, "job/latest", &size, NULL, err, sizeof(err)), ERR_ENOENT);
	ck_assert_int_eq(remote_get(r, "job/latest", 0, buf, 5, err, sizeof(err)), ERR_ENOENT);
	/* Keys naming anything outside the prefix are refused before any request. */
	ck_assert_int_eq(remote_put(r, "../x", "a", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_EINVAL);
	ck_assert_int_eq(remote_put(r, "a//b", "a", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_EINVAL);
	remote_close(r);
	config_free(c);
}
END_TEST

/* One of two racing writers. */
struct racer {
	struct remote *r;
	const char *key;
	char data[8];
	pthread_barrier_t *go;
	int rc;
	char err[ERRLEN];
};

/* Writes the racer's data with If-None-Match once both are ready. */
static void *race(void *arg)
{
	struct racer *w = arg;
	pthread_barrier_wait(w->go);
	w->rc = remote_put(w->r, w->key, w->data, 8, REMOTE_CREATE, NULL, NULL, w->err,
			   sizeof(w->err));
	return NULL;
}

START_TEST(test_race_create)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 0);
	make_bucket(shared.port, "race");
	struct remote *r = open_remote(c, "s3://race");

	for (int round = 0; round < 10; round++) {
		pthread_barrier_t go;
		struct racer w[2] = { { .r = r }, { .r = r } };
		pthread_t t[2];
		char key[64], got[9] = "";
		snprintf(key, sizeof(key), "job/tag%d/manifest", round);
		pthread_barrier_init(&go, NULL, 2);
		for (int i = 0; i < 2; i++) {
			w[i].key = key;
			w[i].go = &go;
			snprintf(w[i].data, sizeof(w[i].data), "writer%d", i);
			pthread_create(&t[i], NULL, race, &w[i]);
		}
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&go);
		int won = w[0].rc == 0 ? 0 : 1;
		ck_assert_msg((w[0].rc == 0) + (w[1].rc == 0) == 1, "round %d: %d (%s), %d (%s)",
			      round, w[0].rc, w[0].err, w[1].rc, w[1].err);
		ck_assert_msg(w[!won].rc == ERR_EEXIST, "%s", w[!won].err);
		ck_assert_msg(remote_get(r, key, 0, got, 8, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(memcmp(got, w[won].data, 8) == 0, "round %d: the loser's bytes",
			      round);
	}
	remote_close(r);
	config_free(c);
}
END_TEST

/* Counts uploads a listing finds (and remembers the last). */
struct found {
	int n;
	char key[256], id[1100];
};

/* remote_list_uploads' callback: counts. */
static int count_upload(void *arg, const char *key, const char *id)
{
	struct found *f = arg;
	f->n++;
	snprintf(f->key, sizeof(f->key), "%s", key);
	snprintf(f->id, sizeof(f->id), "%s", id);
	return 0;
}

/* How many uploads are open under r. */
static int open_uploads(struct remote *r, struct found *f)
{
	memset(f, 0, sizeof(*f));
	ck_assert_msg(remote_list_uploads(r, "", count_upload, f, err, sizeof(err)) == 0, "%s",
		      err);
	return f->n;
}

START_TEST(test_multipart_ranges)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 0);
	make_bucket(shared.port, "multi");
	struct remote *r = open_remote(c, "s3://multi/p");
	size_t n = 40 * MIB + 12345;
	char *data = malloc(n), *back = malloc(n);
	struct remote_src src = { mem_read, data, n };
	struct found f;
	uint64_t size;

	h_pattern_fill(data, n, 33);
	struct timespec t0, t1, t2;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_msg(remote_upload(r, "job/t1/rank0.safetensors", &src, err, sizeof(err)) == 0,
		      "%s", err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_msg(remote_head(r, "job/t1/rank0.safetensors", &size, NULL, err,
				  sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(size, n);
	/* moto answers a multipart object's etag as "<md5 of md5s>-<parts>": 9 parts. */
	memset(back, 0, n);
	ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", 0, back, n, err,
				 sizeof(err)) == 0, "%s", err);
	clock_gettime(CLOCK_MONOTONIC, &t2);
	ck_assert_int_eq(h_pattern_diff(back, n, 33), n);
	printf("moto on loopback, 40 MiB in 5 MiB parts, 4 in flight: upload %.0f MB/s, "
	       "ranged read %.0f MB/s\n", n / 1e6 / ((t1.tv_sec - t0.tv_sec) +
						     (t1.tv_nsec - t0.tv_nsec) / 1e9),
	       n / 1e6 / ((t2.tv_sec - t1.tv_sec) + (t2.tv_nsec - t1.tv_nsec) / 1e9));
	static const size_t ranges[][2] = { { 1, 1 }, { 5 * MIB - 3, 7 }, { 17 * MIB + 5, 11 * MIB },
					    { 40 * MIB + 12340, 5 } };
	for (size_t i = 0; i < 4; i++) {
		memset(back, 0, ranges[i][1]);
		ck_assert_msg(remote_get(r, "job/t1/rank0.safetensors", ranges[i][0], back,
					 ranges[i][1], err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(memcmp(back, data + ranges[i][0], ranges[i][1]), 0);
	}
	/* Past the end: a clear error, not short data. */
	ck_assert_int_ne(remote_get(r, "job/t1/rank0.safetensors", n - 2, back, 4, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
	config_free(c);
	free(data);
	free(back);
}
END_TEST

/* A source that fails at its third part. */
static int failing_read(void *arg, uint64_t off, void *buf, size_t len)
{
	memset(buf, 7, len);
	return off >= 10 * MIB ? ERR_EIO : 0;
}

START_TEST(test_abort)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 0);
	make_bucket(shared.port, "abort");
	struct remote *r = open_remote(c, "s3://abort/pre");
	struct remote_src src = { failing_read, NULL, 30 * MIB };
	struct found f;
	char body[4096];
	uint64_t size;

	/* A failed upload aborts its multipart upload: nothing stays open, no object. */
	ck_assert_int_eq(remote_upload(r, "job/t/f", &src, err, sizeof(err)), ERR_EIO);
	ck_assert_msg(strstr(err, "reading the source failed"), "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	ck_assert_int_eq(remote_head(r, "job/t/f", &size, NULL, err, sizeof(err)), ERR_ENOENT);
	/* An upload left open (a daemon killed mid-upload) is found and aborted. */
	ck_assert_int_eq(raw(shared.port, "POST", "/abort/pre/job/t2/g?uploads=", "", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(raw(shared.port, "POST", "/abort/elsewhere?uploads=", "", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(open_uploads(r, &f), 1);  /* not the one outside the prefix */
	ck_assert_str_eq(f.key, "job/t2/g");
	ck_assert_msg(remote_abort(r, f.key, f.id, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	ck_assert_int_eq(remote_abort(r, "job/t2/g", "nosuchid", err, sizeof(err)), ERR_ENOENT);
	remote_close(r);
	config_free(c);
}
END_TEST

START_TEST(test_missing_bucket_unreachable)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 0);
	struct remote *r = open_remote(c, "s3://no-such-bucket/p");
	char buf[4];

	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_ENOENT);
	ck_assert_msg(strstr(err, "bucket 'no-such-bucket' does not exist at 127.0.0.1:") &&
		      strstr(err, "NoSuchBucket"), "%s", err);
	ck_assert(!remote_retryable(ERR_ENOENT));
	ck_assert_int_eq(remote_put(r, "a", "x", 1, REMOTE_ANY, NULL, NULL, err, sizeof(err)),
			 ERR_ENOENT);
	remote_close(r);
	config_free(c);

	c = test_cfg(free_port(), 0);
	r = open_remote(c, "s3://bkt");
	int rc = remote_check(r, err, sizeof(err));
	ck_assert_msg(rc == ERR_EIO && strstr(err, "unreachable") &&
		      strstr(err, "127.0.0.1"), "%d %s", rc, err);
	ck_assert(remote_retryable(rc));
	ck_assert_int_eq(remote_get(r, "k", 0, buf, 4, err, sizeof(err)), ERR_EIO);
	remote_close(r);
	config_free(c);
}
END_TEST

/* The value of XML element tag in s into out. */
static void xml_value(const char *s, const char *tag, char *out, size_t outlen)
{
	char open[64];
	snprintf(open, sizeof(open), "<%s>", tag);
	const char *a = strstr(s, open);
	ck_assert_ptr_nonnull(a);
	a += strlen(open);
	snprintf(out, outlen, "%.*s", (int)(strchr(a, '<') - a), a);
}

START_TEST(test_credentials)
{
	NEED_MOTO();
	struct moto m;
	char body[8192], key[128], secret[128];
	ck_assert_msg(moto_start(&m, 0, 4) == 0, "moto did not start (%s)", m.log);
	/* The first four requests are free: a user with every right, its keys, a bucket. */
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=CreateUser&UserName=u&Version="
			     "2010-05-08", body, sizeof(body)), 200);
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=PutUserPolicy&UserName=u&PolicyName="
			     "all&PolicyDocument=%7B%22Version%22%3A%222012-10-17%22%2C%22Statement"
			     "%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Action%22%3A%22*%22%2C%22"
			     "Resource%22%3A%22*%22%7D%5D%7D&Version=2010-05-08", body,
			     sizeof(body)), 200);
	ck_assert_int_eq(raw(m.port, "POST", "/", "Action=CreateAccessKey&UserName=u&Version="
			     "2010-05-08", body, sizeof(body)), 200);
	xml_value(body, "AccessKeyId", key, sizeof(key));
	xml_value(body, "SecretAccessKey", secret, sizeof(secret));
	make_bucket(m.port, "auth");

	/* Good keys: moto checks curl's signature on every request. */
	struct config *c = test_cfg(m.port, 0);
	free(c->s3_key_id);
	free(c->s3_secret);
	free(c->s3_token);
	c->s3_token = NULL;
	c->s3_key_id = strdup(key);
	c->s3_secret = strdup(secret);
	struct remote *r = open_remote(c, "s3://auth/p");
	char buf[8] = "";
	ck_assert_msg(remote_check(r, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_put(r, "job/t/a", "signed", 6, REMOTE_CREATE, NULL, NULL, err,
				 sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_get(r, "job/t/a", 0, buf, 6, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(buf, "signed");
	remote_close(r);

	/* A wrong secret: refused, and said so. */
	free(c->s3_secret);
	c->s3_secret = strdup(SECRET);
	r = open_remote(c, "s3://auth/p");
	ck_assert_int_eq(remote_check(r, err, sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "access denied (HTTP 403 SignatureDoesNotMatch") &&
		      strstr(err, "credentials_file"), "%s", err);
	ck_assert_msg(!strstr(err, SECRET) && !strstr(err, secret), "%s", err);
	ck_assert(!remote_retryable(ERR_EACCES));
	remote_close(r);
	/* An unknown key id. */
	free(c->s3_key_id);
	c->s3_key_id = strdup(KEY_ID);
	r = open_remote(c, "s3://auth/p");
	ck_assert_int_eq(remote_put(r, "job/t/b", "x", 1, REMOTE_ANY, NULL, NULL, err,
				    sizeof(err)), ERR_EACCES);
	ck_assert_msg(strstr(err, "InvalidAccessKeyId"), "%s", err);
	remote_close(r);
	config_free(c);
	moto_kill(&m);
	unlink(m.log);
}
END_TEST

/* An upload running in a thread. */
struct bg_upload {
	struct remote *r;
	const struct remote_src *src;
	int rc;
	char err[ERRLEN];
};

/* Runs the upload. */
static void *bg_upload_main(void *arg)
{
	struct bg_upload *u = arg;
	u->rc = remote_upload(u->r, "job/t/big", u->src, u->err, sizeof(u->err));
	return NULL;
}

START_TEST(test_server_stopped_mid_upload)
{
	NEED_MOTO();
	struct moto m;
	ck_assert_msg(moto_start(&m, 0, -1) == 0, "moto did not start (%s)", m.log);
	make_bucket(m.port, "stop");
	struct config *c = test_cfg(m.port, 0);
	c->upload_max_mib_per_s = 4;  /* 40 MiB: ten seconds at least */
	struct remote *r = open_remote(c, "s3://stop/p");
	size_t n = 40 * MIB;
	char *data = malloc(n), *back = malloc(n);
	struct remote_src src = { mem_read, data, n };
	struct bg_upload u = { .r = r, .src = &src };
	struct found f;
	pthread_t t;

	h_pattern_fill(data, n, 9);
	pthread_create(&t, NULL, bg_upload_main, &u);
	/* Once the multipart upload exists, the server goes. */
	int seen = 0;
	for (int i = 0; i < 600 && !seen; i++) {
		struct remote *probe = open_remote(c, "s3://stop/p");
		memset(&f, 0, sizeof(f));
		seen = remote_list_uploads(probe, "", count_upload, &f, err, sizeof(err)) == 0 &&
		       f.n > 0;
		remote_close(probe);
		if (!seen)
			h_sleep_ms(50);
	}
	ck_assert_msg(seen, "the upload never started");
	moto_kill(&m);
	pthread_join(t, NULL);
	ck_assert_msg(u.rc != 0 && remote_retryable(u.rc), "%d: %s", u.rc, u.err);
	ck_assert_msg(strstr(u.err, "unreachable"), "%s", u.err);
	printf("server killed mid-upload: %s\n", u.err);

	/* The server back (empty: moto keeps nothing), the same call succeeds. */
	ck_assert_msg(moto_start(&m, m.port, -1) == 0, "moto did not restart (%s)", m.log);
	make_bucket(m.port, "stop");
	c->upload_max_mib_per_s = 0;
	remote_close(r);
	r = open_remote(c, "s3://stop/p");
	ck_assert_msg(remote_upload(r, "job/t/big", &src, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(remote_get(r, "job/t/big", 0, back, n, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(h_pattern_diff(back, n, 9), n);
	ck_assert_int_eq(open_uploads(r, &f), 0);
	remote_close(r);
	config_free(c);
	moto_kill(&m);
	unlink(m.log);
	free(data);
	free(back);
}
END_TEST

/* Sends this process's stderr (the log) to a new temporary file; the saved stderr. */
static int capture_begin(char *path)
{
	int fd = mkstemp(path), saved = dup(2);
	ck_assert_int_ge(fd, 0);
	dup2(fd, 2);
	close(fd);
	log_init("check_remote_s3", LOG_LVL_DEBUG);
	return saved;
}

/* Puts stderr back; what was logged (malloc'd), the file removed. */
static char *capture_end(char *path, int saved)
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

START_TEST(test_virtual_addressing)
{
	NEED_MOTO();
	struct config *c = test_cfg(shared.port, 1);  /* bucket.localhost: curl resolves it */
	make_bucket(shared.port, "virt");
	char logpath[64] = "/tmp/check_remote_s3.log.XXXXXX", buf[4] = "", want[128];
	int saved = capture_begin(logpath);
	struct remote *r = open_remote(c, "s3://virt/a/b");
	int checked = remote_check(r, err, sizeof(err));
	int put = remote_put(r, "k", "abc", 3, REMOTE_ANY, NULL, NULL, err, sizeof(err));
	char *log = capture_end(logpath, saved);
	ck_assert_msg(checked == 0 && put == 0, "%s", err);
	/* The bucket in the host name, the prefix and key in the path. */
	snprintf(want, sizeof(want), "PUT http://virt.localhost:%d/a/b/k: HTTP 200", shared.port);
	ck_assert_msg(strstr(log, want), "%s", log);
	ck_assert_int_eq(raw(shared.port, "GET", "/virt/a/b/k", NULL, buf, sizeof(buf)), 200);
	ck_assert_str_eq(buf, "abc");
	free(log);
	remote_close(r);
	config_free(c);
}
END_TEST

START_TEST(test_no_secret_logged)
{
	NEED_MOTO();
	char logpath[64] = "/tmp/check_remote_s3.log.XXXXXX", big[6 * MIB / 4];
	int saved = capture_begin(logpath);
	struct config *c = test_cfg(shared.port, 0);
	make_bucket(shared.port, "quiet");
	struct remote *r = open_remote(c, "s3://quiet");
	struct remote_src src = { mem_read, big, sizeof(big) };
	char msgs[8][ERRLEN];
	memset(big, 1, sizeof(big));
	remote_check(r, msgs[0], ERRLEN);
	remote_put(r, "a", "x", 1, REMOTE_CREATE, NULL, NULL, msgs[1], ERRLEN);
	remote_put(r, "a", "x", 1, REMOTE_CREATE, NULL, NULL, msgs[2], ERRLEN);
	remote_upload(r, "b", &src, msgs[3], ERRLEN);
	remote_get(r, "nope", 0, big, 1, msgs[4], ERRLEN);
	remote_close(r);
	r = open_remote(c, "s3://missing-bucket");
	remote_check(r, msgs[5], ERRLEN);
	remote_close(r);
	config_free(c);
	c = test_cfg(free_port(), 0);
	r = open_remote(c, "s3://x-y-z");
	remote_check(r, msgs[6], ERRLEN);
	remote_close(r);
	config_free(c);
	char *log = capture_end(logpath, saved);
	ck_assert_msg(strstr(log, "s3: PUT http://127.0.0.1:"), "debug lines missing: %s", log);
	ck_assert_msg(!strstr(log, SECRET) && !strstr(log, TOKEN) && !strstr(log, KEY_ID),
		      "%s", log);
	for (int i = 0; i < 7; i++)
		ck_assert_msg(!strstr(msgs[i], SECRET) && !strstr(msgs[i], TOKEN) &&
			      !strstr(msgs[i], KEY_ID), "%s", msgs[i]);
	free(log);
}
END_TEST

/* Runs dsckptd -n on a config of roots (JSON entries) and an s3 object at port; its exit
 * status, and its output in out. */
static int check_config(const char *dir, const char *roots, int port, char *out, size_t outlen)
{
	char path[400], cred[400], cmd[1200];
	snprintf(cred, sizeof(cred), "%s/cred", dir);
	snprintf(path, sizeof(path), "%s/c.json", dir);
	FILE *f = fopen(cred, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "[default]\naws_access_key_id = " KEY_ID "\naws_secret_access_key = " SECRET
		"\n");
	fclose(f);
	ck_assert_int_eq(chmod(cred, 0600), 0);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\"allowed_roots\": [%s], \"s3\": {\"endpoint\": "
		"\"http://127.0.0.1:%d\", \"addressing\": \"path\", \"credentials_file\": \"%s\"}}",
		roots, port, cred);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s -n -c %s 2>&1", h_bin("dsckptd"), path);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	size_t n = fread(out, 1, outlen - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_dsckptd_check)
{
	NEED_MOTO();
	char dir[256], roots[2048], out[8192];
	h_tmpdir(dir, sizeof(dir));
	make_bucket(shared.port, "good");
	ck_assert_int_eq(mkdir(h_path("%s/shared", dir), 0700), 0);
	for (const char *n = "abcde"; *n; n++)
		ck_assert_int_eq(mkdir(h_path("%s/%c", dir, *n), 0700), 0);
	snprintf(roots, sizeof(roots), "\"%s/a\", {\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}, "
		 "{\"path\": \"%s/e\", \"remote\": \"file://%s/shared\"}", dir, dir, dir, dir);
	ck_assert_msg(check_config(dir, roots, shared.port, out, sizeof(out)) == 0, "%s", out);
	ck_assert_str_eq(out, "configuration OK\n");

	/* A missing bucket, a missing directory: one line each, naming the root. */
	snprintf(roots, sizeof(roots), "{\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}, "
		 "{\"path\": \"%s/c\", \"remote\": \"s3://gone/p\"}, "
		 "{\"path\": \"%s/d\", \"remote\": \"file://%s/nowhere\"}", dir, dir, dir, dir);
	ck_assert_int_eq(check_config(dir, roots, shared.port, out, sizeof(out)), 1);
	ck_assert_msg(strstr(out, h_path("root %s/c: remote 's3://gone/p': bucket check: bucket "
					 "'gone' does not exist", dir)) &&
		      strstr(out, h_path("root %s/d: remote 'file://%s/nowhere': directory", dir,
					 dir)), "%s", out);
	int lines = 0;
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	ck_assert_msg(lines == 2 && !strstr(out, "configuration OK"), "%s", out);

	/* An endpoint where nothing answers. */
	snprintf(roots, sizeof(roots), "{\"path\": \"%s/b\", \"remote\": \"s3://good/p\"}", dir);
	ck_assert_int_eq(check_config(dir, roots, free_port(), out, sizeof(out)), 1);
	ck_assert_msg(strstr(out, "unreachable") && !strstr(out, SECRET), "%s", out);
	h_rm_rf(dir);
}
END_TEST

/* The suite. */
static Suite *suite(void)
{
	Suite *s = suite_create("remote_s3");
	TCase *tc = tcase_create("remote_s3");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_conditional_put);
	tcase_add_test(tc, test_race_create);
	tcase_add_test(tc, test_multipart_ranges);
	tcase_add_test(tc, test_abort);
	tcase_add_test(tc, test_missing_bucket_unreachable);
	tcase_add_test(tc, test_credentials);
	tcase_add_test(tc, test_server_stopped_mid_upload);
	tcase_add_test(tc, test_virtual_addressing);
	tcase_add_test(tc, test_no_secret_logged);
	tcase_add_test(tc, test_dsckptd_check);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	log_init("check_remote_s3", LOG_LVL_ERROR);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (moto_path() != NULL && moto_start(&shared, 0, -1) != 0) {
		fprintf(stderr, "check_remote_s3: %s did not start (log %s)\n", moto_bin,
			shared.log);
		return 1;
	}
	SRunner *sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	moto_kill(&shared);
	unlink(shared.log);
	return failed ? 1 : 0;
}
