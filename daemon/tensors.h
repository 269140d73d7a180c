/* The conductor's table of tensors: per (owner worker, id), what a Dispatch
 * must name (pool, offset, dtype, dims) and the inline bytes of a small
 * client-bound value.  An entry is made when a tensor is first reported by
 * its owner (a pass-through output names another worker's tensor) and
 * dropped when it is released.  Releases are batched per worker and held
 * until 64 ids or 1 MiB wait for one worker (tt_flush sends those) or the
 * conductor's next tick (tt_tick sends the rest), one Release message per
 * worker. */
#ifndef BATON_DAEMON_TENSORS_H
#define BATON_DAEMON_TENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/supervisor.h"
#include "proto/baton.pb-c.h"
#include "runtime/runtime.h"

#define TT_MAX_DIMS 8

typedef struct ctensor {
    rt_tensor t;                  /* owner worker and id */
    uint32_t pool;
    uint64_t offset, nbytes;      /* in the owner's pool, bytes */
    Baton__V1__DType dtype;
    uint32_t ndim;
    int64_t dims[TT_MAX_DIMS];
    uint8_t *data;                /* inline copy (client-bound, <= 64 KiB), or NULL; owned */
    size_t ndata;
    bool chat;                    /* a request's messages (InputValue.chat) */
    bool raw;                     /* text without the chat template (InputValue.raw) */
} ctensor;

typedef struct tensor_table tensor_table;

/* Sends its Releases through SUP (borrowed); NULL when out of memory. */
tensor_table *tt_create(supervisor *sup);
void tt_destroy(tensor_table *tt);

/* Records the tensor REF that worker SENDER reported (its owner may be
 * another worker).  Returns the entry, or NULL for a ref that names no
 * worker (logged) or when out of memory. */
ctensor *tt_add(tensor_table *tt, int sender, const Baton__V1__TensorRef *ref);
ctensor *tt_find(const tensor_table *tt, rt_tensor t);
/* Entries in the table: tensors on workers the conductor knows of.  With
 * no request in flight it is 0; anything else is a leak. */
size_t tt_count(const tensor_table *tt);
/* The key of (worker, id), stable while the entry lives. */
uint64_t tt_key(rt_tensor t);
ctensor *tt_find_key(const tensor_table *tt, uint64_t key);
/* Fills a TensorRef naming T; its dims point into T. */
void tt_fill_ref(const ctensor *t, Baton__V1__TensorRef *ref);

/* Forgets T and queues its Release to its owner (unless the owner is down). */
void tt_release(tensor_table *tt, rt_tensor t);
/* Sends the queued Releases of each worker past the hold, one message per
 * worker. */
void tt_flush(tensor_table *tt);
/* Sends every queued Release (the conductor's tick). */
void tt_tick(tensor_table *tt);
/* Whether some Release is held for the next tick. */
bool tt_holding(const tensor_table *tt);
/* Forgets every tensor of lost worker W, and its queued Releases. */
void tt_forget_worker(tensor_table *tt, int w);

#endif
