/*
 * cuda_copier.c — the device part of a copier (source.c), and fences.
 *
 * Streams: every copy (and restore) thread owns a copier, and its copier's device part holds
 * one non-blocking stream per device, made on the first copy touching that device and destroyed
 * with the copier; it is used by that thread alone, so it needs no lock. A read from device d
 * (device → chunk, saves) or a write to it (chunk → device, loads) is queued on the copier's
 * stream on d, which first waits for the piece's fence (an event may be waited for from another
 * device's stream) — once per device per piece. A thread waits for its copies once at the end
 * of each piece (cuda_copier_sync, on every device, even after an error), so each thread has one
 * piece in flight at a time, whatever the devices and the direction.
 *
 * Fences: a client's interprocess event is opened once per connection (cuda_import, loop
 * thread only) with a stream of that client's own that carries the waits, so one client's
 * fence never waits for another client's events; each save's fence is a daemon-owned event
 * recorded on that stream after it waited for the client's latest record.
 */
#include "dsckptd.h"

#ifdef HAVE_CUDA
#include "cuda_int.h"

#include <stdlib.h>
#include <string.h>

/* A copier's device part: its fence and one stream per device (made lazily). */
struct cuda_copier {
	struct cuda_fence *fence;  /* what the next copies wait for, until the sync; NULL: none */
	int ndev;
	struct {
		cudaStream_t stream;
		int fenced;        /* the stream already waits for fence */
	} dev[];
};

/*
 * A client's interprocess event, opened once (the client re-records the same event at every
 * save_end), with a stream of that client's own that carries the waits. Loop thread only.
 */
struct cuda_import {
	uint64_t owner;         /* the connection's id */
	uint8_t handle[64];
	int dev;
	cudaEvent_t event;
	cudaStream_t stream;
	struct cuda_import *next;
};
static struct cuda_import *imports;

/* Makes a copier's device part, one slot per device (*out NULL without any devices). */
int cuda_copier_new(struct cuda_copier **out, char *err, size_t errlen)
{
	int n = gpu_count();
	struct cuda_copier *cc;

	*out = NULL;
	if (n == 0)
		return 0;
	if ((cc = calloc(1, sizeof(*cc) + (size_t)n * sizeof(cc->dev[0]))) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	cc->ndev = n;
	*out = cc;
	return 0;
}

/* Destroys a copier's streams (its reads were synced) and frees it; NULL is fine. */
void cuda_copier_free(struct cuda_copier *cc)
{
	if (cc == NULL)
		return;
	for (int d = 0; d < cc->ndev; d++) {
		if (cc->dev[d].stream && cudaSetDevice(d) == cudaSuccess)
			cudaStreamDestroy(cc->dev[d].stream);
	}
	free(cc);
}

/* Orders cc's next copies, on whichever devices they touch, after the fence (until the sync):
 * each device's stream waits for it before its first copy. */
void cuda_copier_fence(struct cuda_copier *cc, struct cuda_fence *f)
{
	if (cc == NULL)
		return;
	cc->fence = f;
	for (int d = 0; d < cc->ndev; d++)
		cc->dev[d].fenced = 0;
}

/* Makes dev current on this thread and returns cc's stream for it (made lazily), ordered after
 * cc's fence. */
int cuda_copier_stream(struct cuda_copier *cc, int dev, cudaStream_t *out, char *err,
		       size_t errlen)
{
	cudaError_t e;

	if (cc == NULL || dev < 0 || dev >= cc->ndev)
		return err_set(err, errlen, ERR_ENOCUDA, "CUDA not available to this copier");
	if ((e = cudaSetDevice(dev)) != cudaSuccess)
		return cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
	if (cc->dev[dev].stream == NULL) {
		double t = now_mono();
		if ((e = cudaStreamCreateWithFlags(&cc->dev[dev].stream, cudaStreamNonBlocking)) !=
		    cudaSuccess) {
			cc->dev[dev].stream = NULL;
			return cuda_fail(err, errlen, ERR_EIO, "cudaStreamCreateWithFlags", e);
		}
		log_debug("copier: its stream on device %d made in %.2f ms", dev,
			  (now_mono() - t) * 1e3);
	}
	if (cc->fence && !cc->dev[dev].fenced) {
		if ((e = cudaStreamWaitEvent(cc->dev[dev].stream, cc->fence->event, 0)) !=
		    cudaSuccess)
			return cuda_fail(err, errlen, ERR_EIO, "cudaStreamWaitEvent", e);
		cc->dev[dev].fenced = 1;
	}
	*out = cc->dev[dev].stream;
	return 0;
}

/* Waits for every copy cc queued, on every device (one wait per piece, not one per tensor),
 * and drops its fence. */
int cuda_copier_sync(struct cuda_copier *cc, char *err, size_t errlen)
{
	cudaError_t e;
	int rc = 0;

	if (cc == NULL)
		return 0;
	cc->fence = NULL;
	for (int d = 0; d < cc->ndev; d++) {
		cc->dev[d].fenced = 0;
		/* Every stream is waited for, even after an error: no copy is left in flight. */
		if (cc->dev[d].stream && (e = cudaStreamSynchronize(cc->dev[d].stream)) !=
		    cudaSuccess && rc == 0)
			rc = cuda_fail(err, errlen, ERR_EIO, "cudaMemcpyAsync", e);
	}
	return rc;
}

/* Finds or opens owner's import of an event handle on dev into *out; negative ERR_E* with
 * err on failure. */
static int cuda_import_get(uint64_t owner, int dev, const uint8_t handle[64],
			   struct cuda_import **out, char *err, size_t errlen)
{
	struct cuda_import *im;
	cudaIpcEventHandle_t h;
	cudaError_t e;
	int rc;

	for (im = imports; im; im = im->next) {
		if (im->owner == owner && im->dev == dev && !memcmp(im->handle, handle, 64)) {
			*out = im;
			return 0;
		}
	}
	if ((im = calloc(1, sizeof(*im))) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	im->owner = owner;
	im->dev = dev;
	memcpy(im->handle, handle, 64);
	memcpy(&h, handle, sizeof(h));
	double t0 = now_mono();
	if ((e = cudaSetDevice(dev)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto fail;
	}
	if ((e = cudaIpcOpenEventHandle(&im->event, h)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EINVAL, "cudaIpcOpenEventHandle", e);
		goto fail;
	}
	if ((e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaStreamCreateWithFlags", e);
		cudaEventDestroy(im->event);
		goto fail;
	}
	im->next = imports;
	imports = im;
	*out = im;
	log_debug("cuda: client %llu's event opened on device %d, with its stream, in %.2f ms",
		  (unsigned long long)owner, dev, (now_mono() - t0) * 1e3);
	return 0;
fail:
	free(im);
	return rc;
}

/* Closes a client's imported events (the connection is gone). */
void cuda_fence_forget(uint64_t owner)
{
	for (struct cuda_import **p = &imports; *p;) {
		struct cuda_import *im = *p;
		if (im->owner != owner) {
			p = &im->next;
			continue;
		}
		*p = im->next;
		cudaSetDevice(im->dev);
		cudaStreamDestroy(im->stream);	/* queued work still completes */
		cudaEventDestroy(im->event);
		free(im);
	}
}

/* Orders a daemon-owned fence after the latest record of owner's interprocess event, as of
 * now (so later re-records by the client do not matter). */
int cuda_fence_import(uint64_t owner, const uint8_t uuid[16], const uint8_t handle[64],
		      struct cuda_fence **out, char *err, size_t errlen)
{
	struct cuda_import *im = NULL;
	struct cuda_fence *f;
	cudaError_t e;
	int dev, rc;

	*out = NULL;
	if ((rc = cuda_device(uuid, &dev, err, errlen)) < 0)
		return rc;
	if ((rc = cuda_import_get(owner, dev, handle, &im, err, errlen)) < 0)
		return rc;
	if ((f = calloc(1, sizeof(*f))) == NULL)
		return err_set(err, errlen, ERR_ENOMEM, "out of memory");
	f->dev = dev;
	if ((e = cudaSetDevice(dev)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaSetDevice", e);
		goto fail_free;
	}
	if ((e = cudaStreamWaitEvent(im->stream, im->event, 0)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaStreamWaitEvent", e);
		goto fail_free;
	}
	if ((e = cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaEventCreateWithFlags", e);
		goto fail_free;
	}
	if ((e = cudaEventRecord(f->event, im->stream)) != cudaSuccess) {
		rc = cuda_fail(err, errlen, ERR_EIO, "cudaEventRecord", e);
		cudaEventDestroy(f->event);
		goto fail_free;
	}
	*out = f;
	return 0;

fail_free:
	free(f);
	return rc;
}

/* Frees a fence. */
void cuda_fence_free(struct cuda_fence *f)
{
	cudaError_t e;

	if (f == NULL)
		return;
	if ((e = cudaEventDestroy(f->event)) != cudaSuccess)
		log_warnx("cudaEventDestroy: %s", cudaGetErrorName(e));
	free(f);
}

#else /* !HAVE_CUDA */

#define NOCUDA "CUDA not available: built without CUDA"

/* Without CUDA a copier has no device part. */
int cuda_copier_new(struct cuda_copier **out, char *err, size_t errlen)
{
	*out = NULL;
	return 0;
}

/* Without CUDA there is no device part to free. */
void cuda_copier_free(struct cuda_copier *cc)
{
}

/* Without CUDA no fence exists to wait for. */
void cuda_copier_fence(struct cuda_copier *cc, struct cuda_fence *f)
{
}

/* Without CUDA no copy is ever queued. */
int cuda_copier_sync(struct cuda_copier *cc, char *err, size_t errlen)
{
	return 0;
}

/* Without CUDA no event was ever imported. */
void cuda_fence_forget(uint64_t owner)
{
}

/* Without CUDA no event can be imported. */
int cuda_fence_import(uint64_t owner, const uint8_t uuid[16], const uint8_t handle[64],
		      struct cuda_fence **out, char *err, size_t errlen)
{
	*out = NULL;
	return err_set(err, errlen, ERR_ENOCUDA, NOCUDA);
}

/* Frees a fence: there are none without CUDA. */
void cuda_fence_free(struct cuda_fence *f)
{
}

#endif /* HAVE_CUDA */
