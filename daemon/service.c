/*
 * service.c — what dsckptd tells systemd it is doing, in sd_notify lines (notify.c sends them;
 * without $NOTIFY_SOCKET all of this is a no-op and no timer runs):
 *
 *   starting   STATUS= of each step; while the host cache is touched, locked and pinned for
 *              CUDA, its progress ("pinning host cache: 12.0 of 64.0 GiB touched") with
 *              EXTEND_TIMEOUT_USEC= at each report (about once a second, each extending by
 *              SERVICE_START_EXTEND_S), so that TimeoutStartSec= covers the steps before the
 *              cache while a cache of hundreds of GiB takes the minutes it needs;
 *   running    READY=1, then a short STATUS= ("3 clients, 2 saves in flight, cache 41% used,
 *              1.2 GiB resident"): a one-second timer composes it and sends it only when it
 *              changed, which rate-limits it to one datagram a second and keeps
 *              `systemctl status` at most a second behind;
 *   reloading  RELOADING=1 with MONOTONIC_USEC= (systemd 253 and later want both), then
 *              READY=1 once the configuration is reloaded or kept;
 *   stopping   STOPPING=1 with STATUS=draining: N flushes, X GiB left; the same timer sends
 *              the line again with EXTEND_TIMEOUT_USEC= (SERVICE_DRAIN_EXTEND_S) each time the
 *              drain made progress, so a drain that moves outlasts TimeoutStopSec= and one
 *              that is stuck does not.
 *
 * Loop thread only (cache_create's progress comes on it too, before the loop runs).
 */
#include "dsckptd.h"

#include <string.h>
#include <time.h>
#include <uv.h>

#define SERVICE_TICK_MS 1000
/* Each start-up progress report (about one a second) gives the start this much more time. */
#define SERVICE_START_EXTEND_S 10
/* cudaHostRegister of the whole cache, one call without progress: 0.23 s for 4 GiB measured
 * on an H200 node; allowed four times that rate, and half a minute more. */
#define SERVICE_CUDA_PIN_BASE_S 30
#define SERVICE_CUDA_PIN_S_PER_GIB 0.25
/* Each time a drain makes progress, it gets this much more time (a stalled disk does not). */
#define SERVICE_DRAIN_EXTEND_S 120

#define USEC_PER_S 1000000ULL

static const struct daemon *daemon_ctx;  /* service_ready's: its loop, its cache */
static uv_timer_t tick;
static int ticking;             /* tick initialized (and running) */
static int draining;
static char last[256];          /* the STATUS= line sent last */
static uint64_t drain_left;     /* bytes left to flush at the last drain report */
static unsigned drain_busy;     /* saves, commits and seals in flight then */

/* "N thing" or "N things" (plural: the suffix, "s" or "es"). */
static const char *service_count(char *buf, size_t len, unsigned n, const char *thing,
				 const char *plural)
{
	snprintf(buf, len, "%u %s%s", n, thing, n == 1 ? "" : plural);
	return buf;
}

/* The binary unit that suits bytes (B to TiB) and its size in bytes. */
static const char *service_unit(uint64_t bytes, double *div)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	unsigned u = 0;

	*div = 1;
	while (u < 4 && bytes >= *div * 1024) {
		*div *= 1024;
		u++;
	}
	return units[u];
}

/* Writes bytes as "1.2 GiB" (one decimal; whole bytes below a KiB). */
static const char *service_size(char *buf, size_t len, uint64_t bytes)
{
	double div;
	const char *unit = service_unit(bytes, &div);

	if (div == 1)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.1f %s", (double)bytes / div, unit);
	return buf;
}

/* Sends STATUS=line (and extra assignments, "" for none) and remembers the line. */
static void service_send(const char *line, const char *extra)
{
	snprintf(last, sizeof(last), "%s", line);
	notify_sendf("%sSTATUS=%s", extra, line);
}

/* The running line: clients, saves in flight, restores (if any), cache use, resident bytes. */
static void service_running_line(char *buf, size_t len)
{
	uint64_t total = cache_total(daemon_ctx->cache), used = cache_used(daemon_ctx->cache);
	char clients[32], saves[32], loads[40] = "", res[32];
	unsigned nloads = load_count();

	if (nloads > 0) {
		loads[0] = ',';
		loads[1] = ' ';
		service_count(loads + 2, sizeof(loads) - 2, nloads, "restore", "s");
	}
	snprintf(buf, len, "%s, %s in flight%s, cache %u%% used, %s resident",
		 service_count(clients, sizeof(clients), conn_count(), "client", "s"),
		 service_count(saves, sizeof(saves), save_inflight(), "save", "s"), loads,
		 total ? (unsigned)(used * 100 / total) : 0,
		 service_size(res, sizeof(res), resident_bytes()));
}

/* The draining line ("draining: 3 flushes, 12.4 GiB left[, 1 commit]"), the bytes left to
 * flush and how many saves, commits and seals are in flight. */
static void service_drain_line(char *buf, size_t len, uint64_t *left, unsigned *busy)
{
	unsigned flushes = save_inflight(), commits = commit_running() + seal_running();
	char nflushes[32], ncommits[40] = "", size[32];
	struct save_view v;

	*left = 0;
	for (struct save *s = save_next(NULL); s; s = save_next(s)) {
		save_view(s, &v);
		if ((v.level == LEVEL_ACCEPTED || v.level == LEVEL_SNAPSHOT) &&
		    v.bytes_total > v.bytes_flushed)
			*left += v.bytes_total - v.bytes_flushed;
	}
	*busy = flushes + commits;
	if (commits > 0) {
		ncommits[0] = ',';
		ncommits[1] = ' ';
		service_count(ncommits + 2, sizeof(ncommits) - 2, commits, "commit", "s");
	}
	snprintf(buf, len, "draining: %s, %s left%s",
		 service_count(nflushes, sizeof(nflushes), flushes, "flush", "es"),
		 service_size(size, sizeof(size), *left), ncommits);
}

/* While draining: the line again, with a longer stop timeout when the drain moved. */
static void service_drain_tick(void)
{
	char line[sizeof(last)], extend[64];
	unsigned busy;
	uint64_t left;

	service_drain_line(line, sizeof(line), &left, &busy);
	if (left < drain_left || busy < drain_busy) {
		snprintf(extend, sizeof(extend), "EXTEND_TIMEOUT_USEC=%llu\n",
			 SERVICE_DRAIN_EXTEND_S * USEC_PER_S);
		service_send(line, extend);
	} else if (strcmp(line, last) != 0) {
		service_send(line, "");
	}
	drain_left = left;
	drain_busy = busy;
}

/* Once a second: the running or draining line, sent when it changed. */
static void on_tick(uv_timer_t *t)
{
	char line[sizeof(last)];

	if (draining) {
		service_drain_tick();
		return;
	}
	service_running_line(line, sizeof(line));
	if (strcmp(line, last) != 0)
		service_send(line, "");
}

/* STATUS= of a start-up step (no progress to report within it). */
void service_status(const char *what)
{
	service_send(what, "");
}

/* cache_progress_fn: "pinning host cache: 12.0 of 64.0 GiB touched", with more time. */
void service_cache_progress(const char *step, uint64_t done, uint64_t total)
{
	char line[sizeof(last)], extend[64];
	double div;
	const char *unit = service_unit(total, &div);

	snprintf(line, sizeof(line), "pinning host cache: %.1f of %.1f %s %s",
		 (double)done / div, (double)total / div, unit, step);
	snprintf(extend, sizeof(extend), "EXTEND_TIMEOUT_USEC=%llu\n",
		 SERVICE_START_EXTEND_S * USEC_PER_S);
	service_send(line, extend);
}

/* Says the cache is being pinned for CUDA (one call, no progress), with time for it. */
void service_cuda_pin(uint64_t bytes)
{
	double s = SERVICE_CUDA_PIN_BASE_S + SERVICE_CUDA_PIN_S_PER_GIB * (double)(bytes >> 30);
	char line[sizeof(last)], extend[64], size[32];

	snprintf(line, sizeof(line), "pinning host cache: %s for CUDA",
		 service_size(size, sizeof(size), bytes));
	snprintf(extend, sizeof(extend), "EXTEND_TIMEOUT_USEC=%llu\n",
		 (unsigned long long)(s * USEC_PER_S));
	service_send(line, extend);
}

/* READY=1 with the running line; starts the one-second refresh (under systemd only). */
void service_ready(const struct daemon *d)
{
	char line[sizeof(last)];

	daemon_ctx = d;
	service_running_line(line, sizeof(line));
	service_send(line, "READY=1\n");
	if (!notify_wanted())
		return;
	uv_timer_init(daemon_ctx->loop, &tick);
	uv_timer_start(&tick, on_tick, SERVICE_TICK_MS, SERVICE_TICK_MS);
	ticking = 1;
}

/* RELOADING=1, stamped with CLOCK_MONOTONIC as systemd 253 and later want it. */
void service_reloading(void)
{
	struct timespec ts;
	char stamp[80];

	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(stamp, sizeof(stamp), "RELOADING=1\nMONOTONIC_USEC=%llu\n",
		 (unsigned long long)ts.tv_sec * USEC_PER_S +
			 (unsigned long long)ts.tv_nsec / 1000);
	service_send("reloading the configuration", stamp);
}

/* READY=1 again after a reload (kept or replaced), with the running line. */
void service_reloaded(void)
{
	char line[sizeof(last)];

	service_running_line(line, sizeof(line));
	service_send(line, "READY=1\n");
}

/* STOPPING=1 with the draining line and time for the drain; the tick reports it from now on. */
void service_stopping(void)
{
	char line[sizeof(last)], extend[96];

	draining = 1;
	service_drain_line(line, sizeof(line), &drain_left, &drain_busy);
	snprintf(extend, sizeof(extend), "STOPPING=1\nEXTEND_TIMEOUT_USEC=%llu\n",
		 SERVICE_DRAIN_EXTEND_S * USEC_PER_S);
	service_send(line, extend);
}

/* The drain is over: says so and closes the timer (shutdown). */
void service_close(void)
{
	service_send("stopping: every save flushed", "");
	if (ticking)
		uv_close((uv_handle_t *)&tick, NULL);
	ticking = 0;
}
