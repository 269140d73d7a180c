/* The worker's own pool segment (CPU workers): a POSIX shm segment named
 * "/baton-<run id>-<worker>", created exclusively with mode 0600, sized and
 * mapped once.  The name stays until the worker exits (peers open it by
 * name, at any time); then the worker unlinks it, and the conductor
 * unlinks the same name when it sees the worker die, so that a SIGKILL
 * leaves nothing behind in /dev/shm.  The peers' segments, opened here
 * read-only, are peers.h's business. */
#ifndef BATON_WORKER_SEGMENT_H
#define BATON_WORKER_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wk_segment {
    char name[256];      /* shm name, "/baton-<run>-<worker>" */
    void *base;          /* the mapping, read-write */
    uint64_t size;       /* bytes */
    bool linked;         /* the name still exists (we have not unlinked it) */
} wk_segment;

/* Writes the segment name for RUN_ID and WORKER into BUF.  Both must be
 * non-empty and made of [A-Za-z0-9._-].  Returns 0 or BT_EINVAL. */
int wk_segment_name(char *buf, size_t len, const char *run_id, const char *worker);

/* Creates, sizes and maps the segment.  A segment of the same name left by
 * an earlier incarnation of this worker (the conductor normally unlinks
 * it) is replaced.  Returns 0, or BT_EINVAL (a bad name) or BT_EIO with
 * the reason in ERR. */
int wk_segment_create(wk_segment *s, const char *run_id, const char *worker, uint64_t bytes,
                      char *err, size_t errlen);
/* Unlinks the name (idempotent; async-signal-safe). */
void wk_segment_unlink(wk_segment *s);
/* Unmaps and unlinks. */
void wk_segment_destroy(wk_segment *s);

#endif
