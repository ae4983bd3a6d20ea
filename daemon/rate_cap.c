/*
 * rate_cap.c — a bandwidth cap: a token bucket of bytes shared by every thread that takes
 * from it, so that background traffic leaves the trainer its network. The remote tier's
 * uploads (upload_max_mib_per_s: remote_s3_req.c, remote_file.c) and peer copies' sends
 * (peer_max_mib_per_s: peer_send.c) each take their bytes from one. c->lock guards it.
 */
#include "dsckptd.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct rate_cap {
	pthread_mutex_t lock;
	double rate;              /* bytes per second; 0: no cap */
	double tokens;            /* may go below 0: a debt the next caller waits out */
	double last;              /* now_mono() of the last refill */
};

/* A cap of mib_per_s MiB/s (0: none) for the threads that share it; NULL without memory. */
struct rate_cap *rate_cap_new(double mib_per_s)
{
	struct rate_cap *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	pthread_mutex_init(&c->lock, NULL);
	c->rate = mib_per_s * 1048576.0;
	c->last = now_mono();
	return c;
}

/* Frees a cap no thread takes from any more. NULL is fine. */
void rate_cap_free(struct rate_cap *c)
{
	if (c) {
		pthread_mutex_destroy(&c->lock);
		free(c);
	}
}

/* Waits until n more bytes may go under c (NULL: no cap): the bucket refills at the rate and
 * holds at most a second of it; a caller takes its bytes at once and waits out any debt it
 * leaves. */
void rate_cap_take(struct rate_cap *c, size_t n)
{
	double wait, now;

	if (c == NULL || c->rate <= 0)
		return;
	pthread_mutex_lock(&c->lock);
	now = now_mono();
	c->tokens += c->rate * (now - c->last);
	if (c->tokens > c->rate)
		c->tokens = c->rate;
	c->last = now;
	c->tokens -= (double)n;
	wait = c->tokens < 0 ? -c->tokens / c->rate : 0;
	pthread_mutex_unlock(&c->lock);
	if (wait > 0) {
		struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
}
