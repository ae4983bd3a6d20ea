/*
 * remote_cap.c — the upload bandwidth cap of a remote tier (upload_max_mib_per_s): a token
 * bucket of bytes shared by every call's threads, so that uploads leave the trainer its
 * network. Below remote_s3_req.c and remote_file.c, which take their bytes from it.
 */
#include "remote_int.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

/* Waits until n more bytes may be uploaded: the bucket refills at r->rate and holds at most
 * a second of it; a caller takes its bytes at once and waits out any debt it leaves. */
void remote_throttle(struct remote *r, size_t n)
{
	struct timespec now;
	double wait;

	if (r->rate <= 0)
		return;
	pthread_mutex_lock(&r->lock);
	clock_gettime(CLOCK_MONOTONIC, &now);
	r->tokens += r->rate * ((double)(now.tv_sec - r->last.tv_sec) +
				(double)(now.tv_nsec - r->last.tv_nsec) / 1e9);
	if (r->tokens > r->rate)
		r->tokens = r->rate;
	r->last = now;
	r->tokens -= (double)n;
	wait = r->tokens < 0 ? -r->tokens / r->rate : 0;
	pthread_mutex_unlock(&r->lock);
	if (wait > 0) {
		struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
}
