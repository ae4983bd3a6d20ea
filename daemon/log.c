/*
 * log.c — messages to stderr, which is the journal under systemd, and, for a daemon started
 * in the background (detach.c), to a log file or syslog.
 *
 * Each line is written under stderr's stdio lock (the one lock of every sink) so lines from
 * several threads never mix, and with one write(2): stderr is given a buffer, flushed at the
 * end of every line; so is the log file, opened for appending (and opened again on SIGHUP,
 * after logrotate moved it). Until the background daemon is ready its lines go both to the
 * terminal and to the file or syslog; from then on to the file or syslog alone.
 * Under the journal ($JOURNAL_STREAM names our stderr) lines carry a "<N>" syslog priority
 * and no timestamp (journald adds both); elsewhere they start with an ISO 8601 time; syslog
 * gets the message alone, with its priority.
 * Messages often carry client-chosen names, so every message is written escaped: bytes
 * below 0x20, 0x7f and 0x80 and up as \xHH, newline, tab and backslash as \n, \t and \\.
 * A line break in a message (a directory named "a\n...: error: forged") can then never
 * start a line of its own, and the log reads back unambiguously.
 * It keeps the daemon's monotonic clock too (now_mono), below every file that measures time.
 */
#include "dsckptd.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static const char *const log_names[] = { "error", "warn", "info", "debug" };
/* syslog priorities of the levels: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
static const int log_prio[] = { 3, 4, 6, 7 };

/* Longest message written whole; the rest is left off and counted after "...". */
#define LOG_MAX_MSG (64 * 1024)

static char log_prog[64] = "dsckptd";
static atomic_int log_level = LOG_LVL_INFO;
static int log_journal;
static FILE *log_file;             /* the log file (log_open), or NULL */
static char *log_file_path;        /* its absolute path, to open it again */
static int log_syslog;             /* lines go to syslog too */
static int log_quiet;              /* stderr is no longer written (log_detach) */

/* Whether $JOURNAL_STREAM ("dev:ino") names the file our stderr is connected to. */
static int log_stderr_is_journal(void)
{
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (e == NULL || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
		return 0;
	if (fstat(STDERR_FILENO, &st) != 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Sets the program name and threshold; messages go to stderr (the journal under systemd). */
void log_init(const char *prog, int level)
{
	static char buf[8192];

	setvbuf(stderr, buf, _IOFBF, sizeof(buf));
	snprintf(log_prog, sizeof(log_prog), "%s", prog);
	log_journal = log_stderr_is_journal();
	log_set_level(level);
}

/* Changes the threshold at run time (SIGHUP reload); out-of-range values are clamped. */
void log_set_level(int level)
{
	if (level < LOG_LVL_ERROR)
		level = LOG_LVL_ERROR;
	if (level > LOG_LVL_DEBUG)
		level = LOG_LVL_DEBUG;
	atomic_store_explicit(&log_level, level, memory_order_relaxed);
}

/* Parses "error" … "debug"; -1 if unknown. */
int log_level_parse(const char *s)
{
	for (int i = LOG_LVL_ERROR; i <= LOG_LVL_DEBUG; i++)
		if (strcmp(s, log_names[i]) == 0)
			return i;
	return -1;
}

/* Name of a level ("?" if out of range). */
const char *log_level_name(int level)
{
	if (level < LOG_LVL_ERROR || level > LOG_LVL_DEBUG)
		return "?";
	return log_names[level];
}

/* Whether messages of level are currently written. */
static int log_enabled(int level)
{
	return level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

/* Writes len bytes of s escaped to f, so one message is always one unambiguous line. */
static void log_put_escaped(FILE *f, const char *s, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t run = 0;	/* start of the bytes not yet written that need no escape */

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[4] = { '\\', 0, 0, 0 };
		size_t n = 2;

		if (c >= 0x20 && c < 0x7f && c != '\\')
			continue;
		fwrite(s + run, 1, i - run, f);
		run = i + 1;
		if (c == '\n')
			esc[1] = 'n';
		else if (c == '\t')
			esc[1] = 't';
		else if (c == '\\')
			esc[1] = '\\';
		else {
			esc[1] = 'x';
			esc[2] = hex[c >> 4];
			esc[3] = hex[c & 0xf];
			n = 4;
		}
		fwrite(esc, 1, n, f);
	}
	fwrite(s + run, 1, len - run, f);
}

/*
 * Formats fmt into buf (size bytes) or, when it does not fit, into a malloc'd buffer of at
 * most LOG_MAX_MSG bytes; returns the text (free it if it is not buf), its length in *len and
 * in *cut how many bytes were left off (0 when whole).
 */
static char *log_format(char *buf, size_t size, size_t *len, size_t *cut, const char *fmt,
			va_list ap)
{
	va_list ap2;
	char *big;
	int n;

	va_copy(ap2, ap);
	n = vsnprintf(buf, size, fmt, ap);
	*cut = 0;
	if (n < 0) {
		va_end(ap2);
		*len = (size_t)snprintf(buf, size, "(unprintable log message: %s)", fmt);
		if (*len >= size)
			*len = size - 1;
		return buf;
	}
	if ((size_t)n < size) {
		va_end(ap2);
		*len = (size_t)n;
		return buf;
	}
	*len = (size_t)n < LOG_MAX_MSG ? (size_t)n : LOG_MAX_MSG;
	*cut = (size_t)n - *len;
	if ((big = malloc(*len + 1)) == NULL) {
		/* keep what fitted in buf */
		*cut += *len - (size - 1);
		*len = size - 1;
		va_end(ap2);
		return buf;
	}
	vsnprintf(big, *len + 1, fmt, ap2);
	va_end(ap2);
	return big;
}

/* Writes message, "...(N more bytes)" when cut, and ": estr" (when not NULL), escaped, to f. */
static void log_put_body(FILE *f, const char *msg, size_t len, size_t cut, const char *estr)
{
	log_put_escaped(f, msg, len);
	if (cut)
		fprintf(f, "...(%zu more bytes)", cut);
	if (estr != NULL) {
		fputs(": ", f);
		log_put_escaped(f, estr, strlen(estr));
	}
}

/* Writes one whole line to f: the prefix (journal's priority, or a timestamp and who), the
 * body, a newline; then flushes it. */
static void log_put_line(FILE *f, int journal, int level, const char *msg, size_t len,
			 size_t cut, const char *estr)
{
	char tbuf[64];

	if (journal) {
		fprintf(f, "<%d>%s: ", log_prio[level], log_names[level]);
	} else {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		localtime_r(&ts.tv_sec, &tm);
		strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
		fprintf(f, "%s.%03ld", tbuf, ts.tv_nsec / 1000000);
		strftime(tbuf, sizeof(tbuf), "%z", &tm);
		fprintf(f, "%s %s[%ld]: %s: ", tbuf, log_prog, (long)getpid(), log_names[level]);
	}
	log_put_body(f, msg, len, cut, estr);
	fputc('\n', f);
	fflush(f);
}

/* Sends the body to syslog at the level's priority. */
static void log_put_syslog(int level, const char *msg, size_t len, size_t cut,
			   const char *estr)
{
	char *body = NULL;
	size_t blen = 0;
	FILE *f = open_memstream(&body, &blen);

	if (f == NULL)
		return;
	log_put_body(f, msg, len, cut, estr);
	if (fclose(f) == 0)
		syslog(log_prio[level], "%s: %s", log_names[level], body);
	free(body);
}

/* Writes one line to every sink: prefix, message, and ": strerror(err)" when err is not 0,
 * all escaped. */
static void log_vwrite(int level, int err, const char *fmt, va_list ap)
{
	char ebuf[128], mbuf[1024];
	const char *estr = err ? strerror_r(err, ebuf, sizeof(ebuf)) : NULL;
	size_t len, cut;
	char *msg = log_format(mbuf, sizeof(mbuf), &len, &cut, fmt, ap);

	flockfile(stderr);
	if (!log_quiet)
		log_put_line(stderr, log_journal, level, msg, len, cut, estr);
	if (log_file != NULL)
		log_put_line(log_file, 0, level, msg, len, cut, estr);
	if (log_syslog)
		log_put_syslog(level, msg, len, cut, estr);
	funlockfile(stderr);
	if (msg != mbuf)
		free(msg);
}

/* Opens path (absolute: the daemon leaves its directory) for appending, mode 0640; from now
 * on every line goes there too. 0, or -1 with err. */
int log_open(const char *path, char *err, size_t errlen)
{
	char *abs = strdup(path);
	FILE *f;

	if (abs == NULL)
		return err_set(err, errlen, -1, "out of memory");
	int fd = open(abs, O_WRONLY | O_APPEND | O_CREAT | O_NOCTTY | O_CLOEXEC, 0640);
	if (fd < 0 || (f = fdopen(fd, "a")) == NULL) {
		err_set(err, errlen, -1, "log file %s: %s", abs, strerror(errno));
		if (fd >= 0)
			close(fd);
		free(abs);
		return -1;
	}
	flockfile(stderr);
	if (log_file)
		fclose(log_file);
	free(log_file_path);
	log_file = f;
	log_file_path = abs;
	funlockfile(stderr);
	return 0;
}

/* Opens the log file again by its path (SIGHUP: logrotate moved it); a failure keeps the old
 * one and is logged. */
void log_reopen(void)
{
	char err[512], *path;

	if (log_file_path == NULL)
		return;
	if ((path = strdup(log_file_path)) == NULL)
		return;
	if (log_open(path, err, sizeof(err)) < 0)
		log_warnx("%s; still writing to the file that was open", err);
	free(path);
}

/* From now on lines go to syslog (facility daemon) too. */
void log_to_syslog(void)
{
	openlog(log_prog, LOG_PID | LOG_NDELAY, LOG_DAEMON);
	log_syslog = 1;
}

/* Stops writing to stderr (a background daemon once ready: its terminal is not its log). */
void log_detach(void)
{
	flockfile(stderr);
	log_quiet = 1;
	funlockfile(stderr);
}

/* Where lines go besides stderr: the log file's path, "syslog", or NULL for stderr alone. */
const char *log_target(void)
{
	return log_file_path ? log_file_path : log_syslog ? "syslog" : NULL;
}

/* Defines a logging function for level that appends strerror(errno) when with_errno. */
#define LOG_FUNC(fname, level, with_errno)                          \
	void fname(const char *fmt, ...)                            \
	{                                                           \
		int saved = errno;                                  \
		va_list ap;                                         \
		if (!log_enabled(level))                            \
			return;                                     \
		va_start(ap, fmt);                                  \
		log_vwrite(level, (with_errno) ? saved : 0, fmt, ap); \
		va_end(ap);                                         \
		errno = saved;                                      \
	}

/* Logs at error level. */
LOG_FUNC(log_error, LOG_LVL_ERROR, 0)
/* Logs a warning followed by ": strerror(errno)"; errno is preserved. */
LOG_FUNC(log_warn, LOG_LVL_WARN, 1)
/* Logs a warning. */
LOG_FUNC(log_warnx, LOG_LVL_WARN, 0)
/* Logs at info level. */
LOG_FUNC(log_info, LOG_LVL_INFO, 0)
/* Logs at debug level (a single atomic load when debug is off). */
LOG_FUNC(log_debug, LOG_LVL_DEBUG, 0)

/* Writes the words naming a uid in a message, "uid 1002 (alice)" (the name when the system
 * knows it), into buf and returns buf. */
char *log_uid(unsigned uid, char *buf, size_t len)
{
	struct passwd pw, *found = NULL;
	char names[1024];

	if (getpwuid_r((uid_t)uid, &pw, names, sizeof(names), &found) == 0 && found)
		snprintf(buf, len, "uid %u (%s)", uid, found->pw_name);
	else
		snprintf(buf, len, "uid %u", uid);
	return buf;
}

/* Seconds on the monotonic clock (a log line's durations, a save's ages). */
double now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}
