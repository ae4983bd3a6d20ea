/*
 * metrics_save.c — the observer of save levels (save_observe) that feeds metrics.c: each
 * level a save reaches is counted, and its time from ACCEPTED observed. Loop thread only.
 * It lives apart from metrics.c, which depends on nothing, because it reads saves (save.c).
 */
#include "dsckptd.h"

/* save_change_cb: counts a save's new level and observes how long it took from ACCEPTED. */
void metrics_on_save(struct save *s)
{
	struct save_view v;

	save_view(s, &v);
	switch (v.level) {
	case LEVEL_SNAPSHOT:
		metrics_add(METRIC_SAVES_SNAPSHOTTED, 1);
		metrics_observe(METRIC_SNAPSHOT_S, v.age_s);
		break;
	case LEVEL_DURABLE:
		metrics_add(METRIC_SAVES_DURABLE, 1);
		metrics_observe(METRIC_FLUSH_S, v.age_s);
		break;
	case LEVEL_COMMITTED:
		metrics_add(METRIC_SAVES_COMMITTED, 1);
		metrics_observe(METRIC_COMMIT_S, v.age_s);
		break;
	case LEVEL_FAILED:
		metrics_fail(METRIC_SAVES_FAILED, v.code);
		break;
	}
}
