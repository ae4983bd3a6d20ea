/*
 * conn.c — a connection to dsckptd: the socket, its references and lock, the daemon's last
 * error message, the HELLO that introduces it, and the host regions registered on it. One
 * request on the wire at a time under the connection's lock, posted requests and the replies'
 * decoding are conn_wire.c's (struct dsckpt_conn, in conn_int.h, is shared by the two).
 * A trainer's connection (dsckpt_identify) and dsckptctl's (lib_conn_ctl_hello) share the
 * HELLO and every request/reply, so both report a failure in the same words.
 *
 * Lock order: the connection lock, then the registry lock of hostmem.c (taken inside
 * lib_conn_use_host and lib_conn_sweep). Never the reverse.
 *
 * A connection is freed when its last reference goes: the user's (dsckpt_close) and one per
 * live save or load, so that dsckpt_save_free and dsckpt_load_free may come after dsckpt_close.
 */
#include "internal.h"
#include "conn_int.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Message of the last failed dsckpt_connect in this thread (there is no connection to hold it). */
static __thread char conn_tls_err[LIB_ERRLEN];
/* This thread's copy of a connection's message, returned by dsckpt_last_error. */
static __thread char conn_tls_copy[LIB_ERRLEN];

/* Stores a connect failure for dsckpt_last_error(NULL) and returns err. */
__attribute__((format(printf, 2, 3)))
static int lib_conn_tls_fail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(conn_tls_err, sizeof(conn_tls_err), fmt, ap);
	va_end(ap);
	return err;
}

/* The default socket: $DSCKPT_SOCKET, the system one if present, a per-user daemon's if
 * present, else the system one. */
const char *dsckpt_default_socket(char *buf, size_t len)
{
	const char *env = getenv("DSCKPT_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
	struct stat st;

	if (!buf || !len)
		return "";
	if (env && *env) {
		snprintf(buf, len, "%s", env);
		return buf;
	}
	if (xdg && xdg[0] == '/' && lstat(DSCKPT_DEFAULT_SOCKET, &st) < 0 && errno == ENOENT &&
	    snprintf(buf, len, "%s/%s", xdg, DSCKPT_USER_SOCKET) < (int)len && lstat(buf, &st) == 0)
		return buf;
	snprintf(buf, len, "%s", DSCKPT_DEFAULT_SOCKET);
	return buf;
}

/* Connects to the daemon. */
int dsckpt_connect(const char *path, dsckpt_conn_t **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char def[PATH_MAX];
	dsckpt_conn_t *c;
	int e;

	if (!out)
		return lib_conn_tls_fail(DSCKPT_EINVAL, "dsckpt_connect: out is NULL");
	*out = NULL;
	if (!path || !*path)
		path = dsckpt_default_socket(def, sizeof(def));
	if (strlen(path) >= sizeof(sa.sun_path))
		return lib_conn_tls_fail(DSCKPT_ENAMETOOLONG,
					 "socket path is longer than %zu bytes: %s",
					 sizeof(sa.sun_path) - 1, path);
	memcpy(sa.sun_path, path, strlen(path) + 1);

	c = calloc(1, sizeof(*c));
	if (!c)
		return lib_conn_tls_fail(DSCKPT_ENOMEM, "out of memory");
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		e = lib_conn_tls_fail(lib_errno(errno), "socket: %s", strerror(errno));
		goto fail_alloc;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = errno, code = (err == EACCES || err == EPERM) ? DSCKPT_EACCES
								      : DSCKPT_ECONNREFUSED;
		struct stat st;
		if (err == ENOENT)
			e = lib_conn_tls_fail(code, "no dsckptd at %s (no such socket)", path);
		else if (code == DSCKPT_EACCES && stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
			struct group g, *found = NULL;
			char names[1024], gname[64];
			if (getgrgid_r(st.st_gid, &g, names, sizeof(names), &found) == 0 && found)
				snprintf(gname, sizeof(gname), "%s", found->gr_name);
			else
				snprintf(gname, sizeof(gname), "%u", (unsigned)st.st_gid);
			e = lib_conn_tls_fail(code, "cannot connect to dsckptd at %s: %s (the socket "
					      "is mode %04o, group %s: its owner and the members "
					      "of group %s may connect)", path, strerror(err),
					      (unsigned)(st.st_mode & 07777), gname, gname);
		} else if (err == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
			e = lib_conn_tls_fail(code, "cannot connect to dsckptd at %s: not a socket "
					      "(a %s)", path, S_ISDIR(st.st_mode) ? "directory"
					      : S_ISREG(st.st_mode) ? "regular file" : "special file");
		else
			e = lib_conn_tls_fail(code, "cannot connect to dsckptd at %s: %s", path,
					      strerror(err));
		goto fail_socket;
	}
	pthread_mutex_init(&c->lock, NULL);
	c->refs = 1;
	c->timeout_ms = -1;
	c->self = "libdsckpt";
	c->next_id = 1;
	memcpy(c->path, path, strlen(path) + 1);
	*out = c;
	return 0;

fail_socket:
	close(c->fd);
fail_alloc:
	free(c);
	return e;
}

/* Takes the connection's lock. */
void lib_conn_lock(dsckpt_conn_t *c)
{
	pthread_mutex_lock(&c->lock);
}

/* Releases the connection's lock. */
void lib_conn_unlock(dsckpt_conn_t *c)
{
	pthread_mutex_unlock(&c->lock);
}

/* Takes a reference for a save or a load. */
void lib_conn_ref(dsckpt_conn_t *c)
{
	lib_conn_lock(c);
	c->refs++;
	lib_conn_unlock(c);
}

/* The connection's pool of staging arenas kept for later saves (lock held). */
struct lib_stages *lib_conn_stage_pool(dsckpt_conn_t *c)
{
	return &c->pool;
}

/* Drops a reference; the last one frees the connection. */
void lib_conn_unref(dsckpt_conn_t *c)
{
	lib_conn_lock(c);
	int last = --c->refs == 0;
	lib_conn_unlock(c);
	if (!last)
		return;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->broken = 1;	/* the daemon dropped the pool's regions with the socket */
	lib_stage_free(c, &c->pool);
	pthread_mutex_destroy(&c->lock);
	lib_cuda_free(c->cuda);
	free(c->regs);
	free(c);
}

/* Closes the socket now (the daemon drops the registrations); saves keep their reference. */
void dsckpt_close(dsckpt_conn_t *c)
{
	if (!c)
		return;
	lib_conn_lock(c);
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->broken = 1;
	snprintf(c->dead, sizeof(c->dead), "connection to dsckptd was closed");
	lib_conn_settle(c);	/* a posted request fails now, its owner told */
	lib_conn_unlock(c);
	lib_conn_unref(c);
}

/* Detailed message of the last failed call, copied for this thread. */
const char *dsckpt_last_error(dsckpt_conn_t *c)
{
	if (!c)
		return conn_tls_err;
	lib_conn_lock(c);
	memcpy(conn_tls_copy, c->err, sizeof(conn_tls_copy));
	lib_conn_unlock(c);
	return conn_tls_copy;
}

/* The code behind the last DSCKPT_EFAILED on c (DSCKPT_ENOSPC, ...), or 0. */
int dsckpt_last_cause(dsckpt_conn_t *c)
{
	if (!c)
		return 0;
	lib_conn_lock(c);
	int cause = c->cause;
	lib_conn_unlock(c);
	return cause;
}

/* Records the code behind the failure just stored with lib_conn_fail (lock held). */
void lib_conn_set_cause(dsckpt_conn_t *c, int cause)
{
	c->cause = cause < 0 ? cause : 0;
}

/* Stores a message for dsckpt_last_error and returns err. */
int lib_conn_fail(dsckpt_conn_t *c, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	c->refused = 0;
	c->cause = 0;
	return err;
}

/* The message of the last failure. */
const char *lib_conn_error(dsckpt_conn_t *c)
{
	return c->err;
}

/* The connection's CUDA state. */
struct lib_cuda **lib_conn_cuda(dsckpt_conn_t *c)
{
	return &c->cuda;
}

/* World size given to dsckpt_identify. */
int lib_conn_world(dsckpt_conn_t *c)
{
	return c->world;
}

/* Whether requests can still go out. */
int lib_conn_alive(dsckpt_conn_t *c)
{
	return !c->broken;
}

/* Unregisters every GPU allocation the connection registered (REGION_DEL each). */
int dsckpt_release_gpu(dsckpt_conn_t *c)
{
	if (!c)
		return DSCKPT_EINVAL;
	lib_conn_lock(c);
	int e = lib_cuda_release(c);
	lib_conn_unlock(c);
	return e;
}

/* Introduces the connection (HELLO) as role; a trainer gives job, rank, world and run (lock
 * held). */
static int lib_conn_hello(dsckpt_conn_t *c, const char *role, const char *job, int rank,
			  int world, const char *run)
{
	char version[PROTO_MAX_STR + 1];
	struct proto_out o;
	struct lib_reply r;
	uint64_t proto, client;
	int e;

	lib_conn_frame(c, &o, PROTO_HELLO);
	msgpack_pack_map(&o.pk, job ? (run && *run ? 6 : 5) : 2);
	proto_kv_str(&o.pk, "role", role);
	if (job) {
		proto_kv_str(&o.pk, "job", job);
		proto_kv_u64(&o.pk, "rank", (uint64_t)rank);
		proto_kv_u64(&o.pk, "world", (uint64_t)world);
		if (run && *run)
			proto_kv_str(&o.pk, "run", run);
	}
	proto_kv_u64(&o.pk, "pid", (uint64_t)getpid());
	if ((e = lib_conn_call(c, &o, NULL, 0, &r)) < 0)
		return e;
	proto_get_str(&r.m, "version", version, PROTO_MAX_STR, 1);
	proto_get_u64(&r.m, "proto", UINT16_MAX, &proto, 1);
	proto_get_u64(&r.m, "client", UINT64_MAX, &client, 1);
	proto_get_u64(&r.m, "max_tensors", UINT32_MAX, &c->max_tensors, 0);
	return lib_reply_end(c, &r, "HELLO");
}

_Static_assert(DSCKPT_RUN_MAX == PROTO_MAX_RUN, "dsckpt.h's run limit is the wire's");

/* Whether s can be a run id: at most PROTO_MAX_RUN bytes of printable ASCII. */
static int lib_run_valid(const char *s)
{
	size_t n = 0;
	for (; s[n]; n++)
		if (s[n] < 0x20 || s[n] > 0x7e || n == PROTO_MAX_RUN)
			return 0;
	return 1;
}

/* Copies the environment's run id into out (room for PROTO_MAX_RUN + 1): the first of
 * $DSCKPT_RUN_ID, $TORCHELASTIC_RUN_ID (but its placeholder "none"), SLURM's job, step and
 * restart count, $PMIX_NAMESPACE and $OMPI_MCA_ess_base_jobid that is set, non-empty and a
 * valid run id; else "" (the unknown run). */
static void lib_run_default(char *out, size_t len)
{
	const char *v, *step, *count;
	char slurm[3 * PROTO_MAX_RUN];

	out[0] = '\0';
	if ((v = getenv("SLURM_JOB_ID")) && *v) {
		step = getenv("SLURM_STEP_ID");
		count = getenv("SLURM_RESTART_COUNT");
		snprintf(slurm, sizeof(slurm), "%s.%s.%s", v, step && *step ? step : "batch",
			 count && *count ? count : "0");
	} else {
		slurm[0] = '\0';
	}
	const char *cands[] = {getenv("DSCKPT_RUN_ID"), getenv("TORCHELASTIC_RUN_ID"), slurm,
			       getenv("PMIX_NAMESPACE"), getenv("OMPI_MCA_ess_base_jobid")};
	for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		v = cands[i];
		if (!v || !*v || !lib_run_valid(v) || (i == 1 && strcmp(v, "none") == 0))
			continue;
		snprintf(out, len, "%s", v);
		return;
	}
}

/* Identifies this process as a trainer rank of the environment's run (HELLO). */
int dsckpt_identify(dsckpt_conn_t *c, const char *job, int rank, int world_size)
{
	return dsckpt_identify_run(c, job, rank, world_size, NULL);
}

/* Identifies this process as a trainer rank of run (NULL: the environment's) (HELLO). */
int dsckpt_identify_run(dsckpt_conn_t *c, const char *job, int rank, int world_size,
			const char *run)
{
	char env[PROTO_MAX_RUN + 1];
	int e;

	if (!c)
		return DSCKPT_EINVAL;
	lib_conn_lock(c);
	if (c->world > 0) {
		e = lib_conn_fail(c, DSCKPT_ESTATE, "dsckpt_identify was already called");
		goto out;
	}
	if (!job || !*job || strlen(job) > PROTO_MAX_NAME) {
		e = lib_conn_fail(c, DSCKPT_EINVAL, "job name must have 1 to %d bytes",
				  PROTO_MAX_NAME);
		goto out;
	}
	if (world_size < 1 || world_size > 65536 || rank < 0 || rank >= world_size) {
		e = lib_conn_fail(c, DSCKPT_EINVAL,
				  "rank %d of world %d: need 0 <= rank < world <= 65536", rank,
				  world_size);
		goto out;
	}
	if (run && !lib_run_valid(run)) {
		e = lib_conn_fail(c, DSCKPT_EINVAL, "a run id has at most %d bytes of printable "
				  "ASCII", PROTO_MAX_RUN);
		goto out;
	}
	if (!run) {
		lib_run_default(env, sizeof(env));
		run = env;
	}
	e = lib_conn_hello(c, "trainer", job, rank, world_size, run);
	if (e == 0) {
		c->world = world_size;
		snprintf(c->run, sizeof(c->run), "%s", run);
	}
out:
	lib_conn_unlock(c);
	return e;
}

/* The daemon's max_tensors_per_save, as HELLO said (0 before). */
int64_t dsckpt_max_tensors(dsckpt_conn_t *c)
{
	return c ? (int64_t)c->max_tensors : 0;
}

/* Fails (DSCKPT_ELIMIT, naming the daemon's limit) when what of n tensors in all is more than
 * a save may hold; 0 otherwise (lock held). */
int lib_conn_check_tensors(dsckpt_conn_t *c, const char *what, size_t n)
{
	if (!c->max_tensors || n <= c->max_tensors)
		return 0;
	return lib_conn_fail(c, DSCKPT_ELIMIT, "%s of %zu tensors: the daemon's "
			     "max_tensors_per_save is %" PRIu64 " (no tensor was sent)", what, n,
			     c->max_tensors);
}

/* The run this connection identified with ("" unknown, or not yet identified). */
const char *dsckpt_run(dsckpt_conn_t *c)
{
	return c ? c->run : "";
}

/* Sets the longest wait for a reply and returns the one before (lock held). */
int lib_conn_timeout(dsckpt_conn_t *c, int timeout_ms)
{
	int old = c->timeout_ms;

	c->timeout_ms = timeout_ms;
	return old;
}

/* Introduces the connection as dsckptctl (HELLO as "ctl"), replies awaited timeout_ms. */
int lib_conn_ctl_hello(dsckpt_conn_t *c, int timeout_ms)
{
	lib_conn_lock(c);
	c->self = "dsckptctl";
	c->timeout_ms = timeout_ms;
	int e = lib_conn_hello(c, "ctl", NULL, 0, 0, NULL);
	lib_conn_unlock(c);
	return e;
}

/* Starts a host memfd's REGION_ADD frame. */
static void region_add_frame(dsckpt_conn_t *c, struct proto_out *o, uint64_t region,
			     uint64_t size)
{
	lib_conn_frame(c, o, PROTO_REGION_ADD);
	msgpack_pack_map(&o->pk, 3);
	proto_kv_u64(&o->pk, "region", region);
	proto_kv_str(&o->pk, "kind", "host");
	proto_kv_u64(&o->pk, "size", size);
}

/* Registers a host memfd as a region (REGION_ADD), awaited. */
int lib_conn_region_add(dsckpt_conn_t *c, uint64_t region, int fd, uint64_t size)
{
	struct proto_out o;

	region_add_frame(c, &o, region, size);
	return lib_conn_region_send(c, NULL, &o, &fd, 1, region);
}

/* Unregisters a region (REGION_DEL). */
int lib_conn_region_del(dsckpt_conn_t *c, uint64_t region)
{
	struct proto_out o;

	lib_conn_frame(c, &o, PROTO_REGION_DEL);
	msgpack_pack_map(&o.pk, 1);
	proto_kv_u64(&o.pk, "region", region);
	return lib_conn_call_empty(c, &o, NULL, 0, "REGION_DEL");
}

/* Index in c->regs where region is or would go. */
static size_t lib_conn_reg_search(dsckpt_conn_t *c, uint64_t region)
{
	size_t lo = 0, hi = c->nregs;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (c->regs[mid].region < region)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Registers a dsckpt_host_alloc block unless it already is (posted into the open batch). */
int lib_conn_use_host(dsckpt_conn_t *c, const struct lib_hostref *h)
{
	size_t at = lib_conn_reg_search(c, h->region);
	int e;

	if (at < c->nregs && c->regs[at].region == h->region)
		return 0;
	struct lib_hostref *regs = lib_grow(c->regs, &c->capregs, c->nregs, sizeof(*regs));
	if (!regs)
		return lib_conn_fail(c, DSCKPT_ENOMEM, "out of memory");
	c->regs = regs;
	int fd = lib_host_dup(h);
	if (fd == DSCKPT_ENOENT)
		return lib_conn_fail(c, DSCKPT_EINVAL, "host memory freed while being added");
	if (fd < 0)
		return lib_conn_fail(c, fd, "cannot duplicate a host memory fd: %s",
				     dsckpt_strerror(fd));
	struct proto_out o;
	region_add_frame(c, &o, h->region, h->size);
	e = lib_conn_region_send(c, c->batch, &o, &fd, 1, h->region);
	close(fd);
	if (e < 0)
		return e;
	memmove(c->regs + at + 1, c->regs + at, (c->nregs - at) * sizeof(*c->regs));
	c->regs[at] = *h;
	c->nregs++;
	return 0;
}

/* Drops region from the registered host blocks, if there. */
void lib_conn_forget_host(dsckpt_conn_t *c, uint64_t region)
{
	size_t at = lib_conn_reg_search(c, region);

	if (at == c->nregs || c->regs[at].region != region)
		return;
	c->nregs--;
	memmove(c->regs + at, c->regs + at + 1, (c->nregs - at) * sizeof(*c->regs));
}

/* Unregisters the blocks freed since the last sweep. */
int lib_conn_sweep(dsckpt_conn_t *c)
{
	uint64_t gen = lib_host_generation();
	size_t i = 0;

	if (gen == c->swept_gen)
		return 0;
	while (i < c->nregs) {
		if (lib_host_alive(&c->regs[i])) {
			i++;
			continue;
		}
		int e = lib_conn_region_del(c, c->regs[i].region);
		if (e < 0)
			return e;
		c->nregs--;
		memmove(c->regs + i, c->regs + i + 1, (c->nregs - i) * sizeof(*c->regs));
	}
	c->swept_gen = gen;
	return 0;
}
