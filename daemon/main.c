/*
 * main.c — dsckptd: start-up, signals, reload and the ordered shutdown. It owns the daemon's
 * context (struct daemon, dsckptd.h) and hands it to the modules that keep it; a reload
 * replaces the context's config whole.
 *
 * Start-up: config → into the background unless -d (detach.c: the command returns when the
 * daemon is ready or failed) → the socket's path checked (server_prepare) → locks (one daemon
 * per socket and root), then the pid file → recover leftovers on disk → CUDA probe → host
 * cache (touched, pinned) → engine threads → upload threads → wiring (connections to the
 * request layer, parked requests' ends to their state machines, save levels to commits,
 * seals and uploads, a save's directory to overwrite.c) → socket → READY. Under systemd each step shows in `systemctl
 * status` and the cache's progress extends the start timeout (service.c). Shutdown
 * (SIGTERM/SIGINT): stop accepting, let every accepted save finish flushing and every
 * running commit end (a check handle looks after each loop turn), close connections, stop
 * and join the workers, close every handle, and check uv_loop_close() == 0. A second
 * SIGTERM exits at once.
 */
#include "dsckptd.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* The daemon's context: every module that needs the loop, the current config or the cache is
 * handed it at start-up (dsckptd.h). */
static struct daemon dsckptd = {.gpu_line = "none"};

static char *config_path;	/* absolute: a detached daemon's directory is / */
static uv_signal_t sig_term, sig_int, sig_hup;
static uv_check_t drain_check;  /* active while draining */
static int draining;

/* Prints usage (and, for --help, every configuration option). */
static void usage(FILE *f, int options)
{
	fprintf(f,
		"usage: dsckptd [-c CONFIG] [-n] [-d] [-p PIDFILE] [-l LOGFILE] [-v] [-h]\n"
		"  -c, --config CONFIG  configuration file (default: root's %s, else\n"
		"                       built-in defaults; another user's\n"
		"                       ~/.config/dsckptd/dsckptd.json, else a per-user daemon:\n"
		"                       socket $XDG_RUNTIME_DIR/dsckptd/dsckptd.sock, checkpoints\n"
		"                       under ~/.local/share/dsckpt)\n"
		"  -n, --check          check the configuration, print \"configuration OK\" or the\n"
		"                       errors\n"
		"  -d, --foreground     stay in the foreground (as under systemd); without it the\n"
		"                       command returns once the daemon is ready (status 0) or\n"
		"                       has failed (its errors, status 1)\n"
		"  -p, --pidfile FILE   write the daemon's pid into FILE (removed at exit)\n"
		"  -l, --log FILE       append the log to FILE (opened again on HUP); in the\n"
		"                       background without it, the log goes to syslog\n"
		"  -v, --version        print the version\n"
		"  -h, --help           this help, and every configuration option\n"
		"signals: TERM/INT finish in-flight flushes then exit; HUP reloads the config\n",
		DSCKPTD_DEFAULT_CONFIG);
	if (options) {
		fputc('\n', f);
		config_print_help(f);
	}
}

/* Prints each line of a config's problems as "dsckptd: PATH: problem". */
static void print_config_errors(const char *path, const char *err)
{
	while (*err) {
		size_t n = strcspn(err, "\n");
		fprintf(stderr, "dsckptd: %s: %.*s\n", path, (int)n, err);
		err += n + (err[n] == '\n');
	}
}

/* Closes what is left and leaves; called once nothing is in flight during a drain. */
static void finish(void)
{
	conn_close_all();	/* their loads are cancelled */
	peer_stop();		/* sends and peers' connections broken, threads joined */
	load_cancel_all();
	engine_stop();
	restore_stop();
	upload_stop();		/* its pins of resident files go */
	load_free_all();
	resident_free_all();	/* every kept chunk back before cache_destroy */
	waiter_close();		/* what is still parked: commits, answered ESHUTDOWN */
	seal_free_all();
	save_free_all();
	save_gc_stop();
	service_close();
	uv_close((uv_handle_t *)&drain_check, NULL);
	uv_close((uv_handle_t *)&sig_term, NULL);
	uv_close((uv_handle_t *)&sig_int, NULL);
	uv_close((uv_handle_t *)&sig_hup, NULL);
	uv_stop(dsckptd.loop);
}

/* While draining, after every loop turn: finishes once no save, commit or load's parse is in
 * flight. */
static void on_drain_check(uv_check_t *h)
{
	if (save_inflight() == 0 && commit_running() == 0 && seal_running() == 0 &&
	    load_parsing() == 0 && prefetch_running() == 0) {
		uv_check_stop(h);
		log_info("all saves finished; exiting");
		finish();
	}
}

/* copy_threads 0 ("auto"): two copies in flight per GPU, at least four with a GPU (one H200
 * needs four to reach its PCIe limit), two without one. */
static unsigned copy_threads_for(unsigned configured)
{
	int gpus = gpu_count();

	if (configured)
		return configured;
	if (gpus == 0)
		return 2;
	return gpus > 32 ? 64 : gpus < 2 ? 4 : 2 * (unsigned)gpus;
}

/* restore_threads 0 ("auto"): with a GPU one per CPU, 8 to 32 (a restore's reads, checksums
 * and host-to-device copies run on all of them: the trainer waits for it), two without. */
static unsigned restore_threads_for(unsigned configured)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	if (configured)
		return configured;
	if (gpu_count() == 0)
		return 2;
	return cpus < 8 ? 8 : cpus > 32 ? 32 : (unsigned)cpus;
}

/*
 * Raises the descriptor limit to its hard maximum (the unit sets it): each user's regions and
 * saves hold descriptors, bounded per user by the quota limits, so that one user's share never
 * runs the daemon out of them for everyone.
 */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			log_warn("raising the descriptor limit");
	}
}

/* Loads the config again; a bad one keeps the old. */
static void reload(void)
{
	char err[4096], line[8192];
	struct config *n;
	size_t k = 0;

	if (config_path == NULL) {
		log_info("running on built-in defaults, without a configuration file: nothing to "
			 "reload");
		return;
	}
	if (config_load(config_path, &n, err, sizeof(err)) < 0) {
		/* One log line: the problems joined by "; " (a newline would be written "\n"). */
		for (const char *p = err; *p && k + 3 < sizeof(line); p++) {
			if (*p == '\n') {
				line[k++] = ';';
				line[k++] = ' ';
			} else {
				line[k++] = *p;
			}
		}
		line[k] = '\0';
		log_error("reload of %s failed; keeping the old configuration: %s", config_path,
			  line);
		return;
	}
	n->copy_threads = copy_threads_for(n->copy_threads);
	if (lock_roots(n, err, sizeof(err)) < 0) {
		log_error("reload of %s failed; keeping the old configuration: %s", config_path,
			  err);
		config_free(n);
		return;
	}
	/* What was built from these at start-up stays: say so and keep the running values. */
	struct config *old = dsckptd.config;
	if (strcmp(n->socket, old->socket) != 0 || n->socket_mode != old->socket_mode ||
	    strcmp(n->socket_group, old->socket_group) != 0 ||
	    n->host_cache_bytes != old->host_cache_bytes ||
	    n->chunk_bytes != old->chunk_bytes || n->flush_threads != old->flush_threads ||
	    n->copy_threads != old->copy_threads || strcmp(n->host, old->host) != 0)
		log_warnx("socket, socket_mode, socket_group, host, host_cache_size, chunk_size and "
			  "thread counts take effect at the next start");
	free(n->socket);
	n->socket = strdup(old->socket);
	n->socket_mode = old->socket_mode;
	free(n->socket_group);
	n->socket_group = strdup(old->socket_group);
	n->socket_gid = old->socket_gid;
	n->host_cache_gib = old->host_cache_gib;
	n->host_cache_bytes = old->host_cache_bytes;
	n->chunk_bytes = old->chunk_bytes;
	n->flush_threads = old->flush_threads;
	n->copy_threads = old->copy_threads;
	free(n->host);
	n->host = strdup(old->host);
	/* Work that reads the old one (a commit in the threadpool) holds a reference to it. */
	config_unref(old);
	dsckptd.config = n;	/* every module reads the current one through the context */
	log_set_level(n->log_level);
	resident_init(dsckptd.cache, n->keep_resident);	/* files saved from now on */
	quota_set_limits(n);
	log_info("configuration reloaded from %s (%zu allowed roots, keep_last %u, log %s)",
		 config_path, n->n_roots, n->keep_last, log_level_name(n->log_level));
}

/* The one signal switch. */
static void on_signal(uv_signal_t *h, int signum)
{
	switch (signum) {
	case SIGHUP:
		service_reloading();
		log_reopen();
		reload();
		service_reloaded();
		break;
	case SIGTERM:
	case SIGINT:
		if (draining) {
			log_warnx("second %s: exiting now; partial files are cleaned at the next start",
				  strsignal(signum));
			_exit(1);
		}
		draining = 1;
		service_stopping();
		log_info("%s: no new clients; finishing %u saves in flight", strsignal(signum),
			 save_inflight() + commit_running());
		server_stop();
		uv_check_start(&drain_check, on_drain_check);
		on_drain_check(&drain_check);
		break;
	}
}

int main(int argc, char **argv)
{
	char err[4096];
	int check_only = 0, foreground = 0, opt;
	const char *config_arg = NULL, *pid_arg = NULL, *log_arg = NULL;
	char *pid_abs = NULL, *found = NULL, say[1024] = "";
	struct timespec ts;

	static const struct option longs[] = {
		{"config", required_argument, NULL, 'c'},
		{"check", no_argument, NULL, 'n'},
		{"foreground", no_argument, NULL, 'd'},
		{"pidfile", required_argument, NULL, 'p'},
		{"log", required_argument, NULL, 'l'},
		{"version", no_argument, NULL, 'v'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	opterr = 0;	/* our own words, named "dsckptd" however it was started */
	while ((opt = getopt_long(argc, argv, ":c:ndp:l:vh", longs, NULL)) != -1) {
		switch (opt) {
		case 'c': config_arg = optarg; break;
		case 'n': check_only = 1; break;
		case 'd': foreground = 1; break;
		case 'p': pid_arg = optarg; break;
		case 'l': log_arg = optarg; break;
		case 'v': printf("dsckptd %s\n", DSCKPTD_VERSION); return 0;
		case 'h': usage(stdout, 1); return 0;
		case ':':
			fprintf(stderr, "dsckptd: %s needs an argument\n", argv[optind - 1]);
			usage(stderr, 0);
			return 2;
		default:
			fprintf(stderr, "dsckptd: unknown option '%s'\n", argv[optind - 1]);
			usage(stderr, 0);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "dsckptd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr, 0);
		return 2;
	}
	log_init("dsckptd", LOG_LVL_INFO);
	int loaded = config_arg ? config_load(config_arg, &dsckptd.config, err, sizeof(err)) :
		userconf_load(&dsckptd.config, &found, say, sizeof(say), err, sizeof(err));
	if (!config_arg)
		config_arg = found;
	int from_file = config_arg != NULL;
	if (loaded < 0) {
		print_config_errors(config_arg ? config_arg : "built-in defaults", err);
		free(found);
		return 1;
	}
	if (say[0])
		log_info("%s", say);
	if (check_only) {
		/* The file is good; each root's remote tier must also answer. */
		int unreachable = remote_check_roots(dsckptd.config, err, sizeof(err)) != 0 ||
				  peer_check(dsckptd.config, err, sizeof(err)) != 0;
		if (unreachable)
			print_config_errors(config_arg ? config_arg : "built-in defaults", err);
		else
			printf("configuration OK\n");
		config_free(dsckptd.config);
		free(found);
		return unreachable;
	}
	log_set_level(dsckptd.config->log_level);
	/* Paths given relative to where dsckptd was started: a reload and a log file opened
	 * again on SIGHUP find them from /. */
	config_path = from_file ? detach_abspath(config_arg) : NULL;
	free(found);
	pid_abs = pid_arg ? detach_abspath(pid_arg) : NULL;
	char *log_abs = log_arg ? detach_abspath(log_arg) : NULL;
	int bad = (from_file && !config_path) || (pid_arg && !pid_abs) || (log_arg && !log_abs);
	if (!bad && log_abs && log_open(log_abs, err, sizeof(err)) < 0) {
		fprintf(stderr, "dsckptd: %s\n", err);
		bad = 1;
	}
	free(log_abs);
	if (bad) {
		if ((from_file && !config_path) || (pid_arg && !pid_abs))
			fprintf(stderr, "dsckptd: out of memory\n");
		goto fail_args;
	}
	if (!foreground) {
		if (!log_arg)
			log_to_syslog();
		if (detach_start(err, sizeof(err)) < 0) {
			log_error("%s; not starting", err);
			goto fail_args;
		}
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	dsckptd.start_time = ts.tv_sec + ts.tv_nsec / 1e9;
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	quota_set_limits(dsckptd.config);
	/* Commits run in libuv's threadpool, one per user at a time (commit.c's, and seal.c's
	 * for the commits of sealed tags): room for 16 users' commits at once instead of 4. */
	setenv("UV_THREADPOOL_SIZE", "16", 0);

	if (dsckptd.config->host[0])
		store_set_host(dsckptd.config->host);
	/* A socket path another user could take is refused, and one daemon per socket and per
	 * root: a second one touches nothing, not even the cache. */
	if (server_prepare(&dsckptd, err, sizeof(err)) < 0 ||
	    lock_socket(dsckptd.config, err, sizeof(err)) < 0 ||
	    lock_roots(dsckptd.config, err, sizeof(err)) < 0) {
		log_error("%s; not starting", err);
		goto fail_locks;
	}
	/* Written once the socket's lock is ours: a second daemon never overwrites it. */
	if (pid_abs && pidfile_write(pid_abs, err, sizeof(err)) < 0) {
		log_error("%s; not starting", err);
		goto fail_locks;
	}
	/* Peer copies (with a peer_secret_file): before any other thread, as UCX reads its
	 * environment; their sends start at the first COMMITTED. */
	if (peer_start(dsckptd.config, err, sizeof(err)) < 0) {
		log_error("%s; not starting", err);
		goto fail_locks;
	}
	dsckptd.loop = uv_default_loop();
	/* The context to the modules that keep it (seal.c's first: recovery resumes seals). */
	seal_init(&dsckptd);
	commit_init(&dsckptd);
	tensors_init(&dsckptd);
	query_init(&dsckptd);
	save_marks_init(&dsckptd);
	service_status("recovering what an interrupted daemon left under the allowed roots");
	recover_run(dsckptd.config, seal_resume);
	service_status("probing CUDA");
	dsckptd.gpu_line = gpu_init();
	dsckptd.config->copy_threads = copy_threads_for(dsckptd.config->copy_threads);
	if (cache_create(dsckptd.config->host_cache_bytes, dsckptd.config->chunk_bytes,
			 service_cache_progress, &dsckptd.cache, err, sizeof(err)) < 0) {
		log_error("host cache: %s", err);
		goto fail_locks;
	}
	if (gpu_count() > 0)
		service_cuda_pin(cache_total(dsckptd.cache));
	gpu_register_host(cache_base(dsckptd.cache), cache_total(dsckptd.cache));
	if (dsckptd.config->gpu_checksums)
		gpu_digest_prepare();
	resident_init(dsckptd.cache, dsckptd.config->keep_resident);
	if (save_engine_start(&dsckptd, err, sizeof(err)) < 0 ||
	    save_gc_start(&dsckptd, err, sizeof(err)) < 0) {
		log_error("engine: %s", err);
		goto fail_cache;
	}
	dsckptd.config->restore_threads = restore_threads_for(dsckptd.config->restore_threads);
	prefetch_start(&dsckptd);
	if (load_start(&dsckptd, dsckptd.config->restore_threads, err, sizeof(err)) < 0) {
		log_error("restore threads: %s", err);
		goto fail_engine;
	}
	if (upload_start(&dsckptd, err, sizeof(err)) < 0) {
		log_error("uploads: %s", err);
		goto fail_restore;
	}
	/* The wiring: frames go up to the request layer; the ends of parked requests to their
	 * state machines; save levels to commits, seals, uploads and metrics; SAVE_BEGIN past
	 * the seals. */
	conn_init(dsckptd.loop, request_dispatch, request_conn_gone);
	request_init(&dsckptd);
	if (waiter_init(dsckptd.loop) < 0) {
		log_error("out of memory");
		goto fail_restore;
	}
	waiter_handle(WAITER_SAVE, wait_end, 0);
	waiter_handle(WAITER_LOAD, load_wait_end, 0);
	waiter_handle(WAITER_COMMIT, commit_wait_end, 1);	/* a commit goes on without its client */
	save_observe(commit_on_save);
	save_observe(seal_on_save);
	save_observe(upload_on_save);
	save_observe(metrics_on_save);
	save_observe(peer_on_save);
	if (peer_wire(dsckptd.loop, err, sizeof(err)) < 0) {	/* copies sent: REPLICATED */
		log_error("peer copies: %s", err);
		goto fail_restore;
	}
	save_open_with(overwrite_save_dir, seal_dirs_dropped);
	uv_check_init(dsckptd.loop, &drain_check);
	/* Signals before the socket: a client may connect (and a TERM come) as soon as it
	 * listens, and a TERM then must drain, not kill (libuv queues it until uv_run). */
	uv_signal_init(dsckptd.loop, &sig_term);
	uv_signal_init(dsckptd.loop, &sig_int);
	uv_signal_init(dsckptd.loop, &sig_hup);
	uv_signal_start(&sig_term, on_signal, SIGTERM);
	uv_signal_start(&sig_int, on_signal, SIGINT);
	uv_signal_start(&sig_hup, on_signal, SIGHUP);
	if (server_start(err, sizeof(err)) < 0) {
		log_error("%s", err);
		goto fail_restore;
	}

	log_info("dsckptd %s ready on %s: cache %.2f GiB in %llu MiB chunks (touched in %.0f ms), "
		 "%u copy + %u flush + %u restore threads, CUDA: %s", DSCKPTD_VERSION,
		 dsckptd.config->socket, cache_total(dsckptd.cache) / 1073741824.0,
		 (unsigned long long)(cache_chunk(dsckptd.cache) >> 20),
		 cache_touch_ms(dsckptd.cache), dsckptd.config->copy_threads,
		 dsckptd.config->flush_threads, dsckptd.config->restore_threads, dsckptd.gpu_line);
	if (!foreground)
		log_info("pid %d; the log goes to %s from now on", (int)getpid(), log_target());
	service_ready(&dsckptd);
	detach_ready();
	uv_run(dsckptd.loop, UV_RUN_DEFAULT);

	uv_run(dsckptd.loop, UV_RUN_NOWAIT);	/* let the close callbacks run */
	int rc = uv_loop_close(dsckptd.loop);
	if (rc != 0)
		log_error("event loop still had handles at exit: %s", uv_strerror(rc));
	gpu_unregister_host(cache_base(dsckptd.cache));
	cache_destroy(dsckptd.cache);
	config_unref(dsckptd.config);
	pidfile_remove();
	lock_release();
	log_info("stopped");
	free(config_path);
	free(pid_abs);
	return rc == 0 ? 0 : 1;

fail_restore:
	upload_stop();
	restore_stop();
fail_engine:
	engine_stop();
	resident_free_all();
fail_cache:
	cache_destroy(dsckptd.cache);
fail_locks:
	peer_stop();
	pidfile_remove();
	lock_release();
fail_args:
	config_free(dsckptd.config);
	free(config_path);
	free(pid_abs);
	return 1;
}
