/* The deadlines of requests in flight: a min-heap of (time, request key).
 *
 * Entries are never removed when a request ends early; they are skipped
 * when they come due (the owner checks the key is still live with that
 * deadline), which keeps the common path, a request that ends before its
 * deadline, free of heap work.  dl_compact keeps the stale entries from
 * piling up when clients ask for long timeouts. */
#ifndef BATON_DAEMON_DEADLINES_H
#define BATON_DAEMON_DEADLINES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dl_entry {
    uint64_t at_ms;               /* monotonic ms */
    uint64_t key;                 /* the owner's request key */
} dl_entry;

typedef struct dl_heap {
    dl_entry *v;                  /* owned; a min-heap on at_ms */
    size_t n, cap;
} dl_heap;

/* Whether the entry (KEY, AT_MS) still belongs to a live request. */
typedef bool (*dl_live_fn)(void *arg, uint64_t key, uint64_t at_ms);

void dl_init(dl_heap *h);
void dl_free(dl_heap *h);
/* Adds an entry; 0 or BT_ENOMEM. */
int dl_push(dl_heap *h, uint64_t at_ms, uint64_t key);
/* The earliest deadline (maybe of a request that ended), or UINT64_MAX. */
uint64_t dl_next(const dl_heap *h);
/* Takes the earliest entry due at NOW_MS into *OUT; false when none is. */
bool dl_pop_due(dl_heap *h, uint64_t now_ms, dl_entry *out);
/* Drops stale entries once they outnumber LIVE twice over (plus slack). */
void dl_compact(dl_heap *h, size_t live, dl_live_fn is_live, void *arg);

#endif
