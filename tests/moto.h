/*
 * moto.h — moto's standalone S3 server for the remote tier's suites: started on 127.0.0.1
 * by a test ($MOTO_SERVER, else build/venv-moto/bin/moto_server, which make check installs
 * through tests/remote.mk), dying with the process that started it; and requests to it
 * signed with made-up keys (moto checks signatures only when told to, and routes by the
 * signature's service: "iam" for a path of "/", else "s3").
 */
#ifndef DSCKPT_TESTS_MOTO_H
#define DSCKPT_TESTS_MOTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MIB (1024u * 1024u)
/* The made-up credentials the suites' configs carry (never to be seen in a log). */
#define KEY_ID "AKIDCHECKREMOTES3"
#define SECRET "check/remote/s3+SECRETvalue0123456789"
#define TOKEN "TOKENcheckremotes3session"

struct config;
struct remote;

/* A moto server of the test's own. */
struct moto {
	pid_t pid;
	int port;
	char log[300];
};

/* The moto_server to run, or NULL (then the tests say SKIP). */
const char *moto_path(void);
/* A TCP port nothing listens on now (bound, then closed). */
int free_port(void);
/* Starts moto on port (0: a free one), with IAM authentication after auth_after requests
 * when auth_after >= 0; waits until it answers. 0, or -1 (it did not come up in 120 s). */
int moto_start(struct moto *m, int port, int auth_after);
/* Kills moto (SIGKILL: a server gone at once, mid-request). */
void moto_kill(struct moto *m);
/* One request to moto at port (path with its query; body POSTed when not NULL), its answer
 * into out (bounded; NULL: dropped): the HTTP status, 0 when none came. */
long raw(int port, const char *method, const char *path, const char *body, char *out,
	 size_t outlen);
/* Makes bucket on moto at port (fails the test otherwise). */
void make_bucket(int port, const char *bucket);

/* tests/s3_proxy.py between a daemon and moto: every request forwarded, ListMultipartUploads
 * re-paged (moto ignores max-uploads), a request held on demand. */
struct proxy {
	pid_t pid;
	int port;
	char dir[256];             /* its state: pages.log, hold, held */
};
/* Starts the proxy to moto at upstream, page uploads a listing page; 0, or -1 (it did not
 * come up in 60 s). It dies with the process that started it. */
int proxy_start(struct proxy *p, int upstream, int page);
/* Kills the proxy and removes its directory. */
void proxy_kill(struct proxy *p);
/* Holds each request whose "METHOD path" contains text (NULL: lets them go). */
void proxy_hold(struct proxy *p, const char *text);
/* The request line held now ("" when none was yet), into line (len bytes). */
void proxy_held(const struct proxy *p, char *line, size_t len);
/* How many listing pages the proxy served with a key-marker (pages after the first). */
int proxy_pages_after_first(const struct proxy *p);

/* The moto server a suite's tests share, started by moto_shared_up. */
extern struct moto moto_shared;
/* An unchecked fixture, once before a suite's tests: curl, and moto_shared when moto is
 * installed (the suite fails when it does not start). */
void moto_shared_up(void);
/* Its pair, once after the tests (failed ones too): kills moto_shared, removes its log. */
void moto_shared_down(void);
/* Says SKIP and returns from the test when moto is not installed. */
#define NEED_MOTO()                                                                       \
	do {                                                                              \
		if (moto_path() == NULL || moto_shared.pid <= 0) {                        \
			printf("SKIP: %s: no moto_server (make check installs it into "   \
			       "build/venv-moto)\n", __func__);                           \
			return;                                                           \
		}                                                                         \
	} while (0)


/* ---- what the S3 suites share ---- */

/* A config for remote_open: moto at port, path (or virtual-hosted: localhost) addressing,
 * KEY_ID/SECRET/TOKEN, 4 requests in flight, 5 MiB parts. */
struct config *test_cfg(int port, int virtual_hosted);
/* Opens remote url with c (fails the test otherwise). */
struct remote *open_remote(struct config *c, const char *url);
/* Reads from a memory buffer (arg): an upload's source. */
int mem_read(void *arg, uint64_t off, void *buf, size_t len);
/* Counts uploads a listing finds (and remembers the last). */
struct found {
	int n;
	char key[256], id[1100];
};
/* remote_list_uploads' callback: counts into a struct found. */
int count_upload(void *arg, const char *key, const char *id);
/* How many uploads are open under r (the last in f). */
int open_uploads(struct remote *r, struct found *f);
/* Reads key from r whole (malloc'd, NUL after it) into *len; NULL when it is not there. */
char *remote_read(struct remote *r, const char *key, size_t *len);
/* The keys of a daemon's config for moto at port: the "s3" object (path addressing, KEY_ID
 * and SECRET in a credentials file of mode 0600 made in a new scratch directory), 5 MiB
 * parts, 1 MiB chunks, then extra ("" or keys each ending in ','); into json (len bytes). */
void s3_daemon_json(char *json, size_t len, int port, const char *extra);
/* A remote tier of a daemon suite's own: moto's S3 (a server of its own with bucket "bkt":
 * s3://bkt/pre) or a scratch directory standing for a shared filesystem (file://dir). */
struct tier {
	int s3;
	struct moto moto;          /* s3: the server */
	char dir[256];             /* file: the directory */
	char url[300];
	struct config *cfg;        /* the test's own handle's */
	struct remote *r;          /* the test's own handle on the tier */
};
/* Sets up t (s3, else file) as the daemon's remote (h_root_remote) and the daemon config's
 * keys with extra after them into json (len bytes): t->r, or NULL after SKIP without moto. */
struct remote *tier_up(struct tier *t, int s3, char *json, size_t len, const char *extra);
/* Closes the test's handle, and stops moto or removes the directory. */
void tier_down(struct tier *t);
/* Sends this process's stderr (the log, at debug level) to a new temporary file made from
 * path (a mkstemp template); the saved stderr. */
int capture_begin(char *path);
/* Puts stderr back: what was logged (malloc'd), the file removed. */
char *capture_end(char *path, int saved);

#endif
