/* The worker's tensor table and request records: every tensor of the own
 * pool, by id, and per request key what the worker holds for it.
 *
 * Every function here runs under the worker's lock (marked [L] in the
 * worker's headers): the store is the state the lanes, the I/O thread and
 * the comm thread share, and the one lock keeps the invariants that span
 * it and the queues above it simple.  The store takes no lock itself.
 *
 * Tensor ids are (incarnation << 40) | counter, the counter starting at 1:
 * unique for the worker's lifetime and never reused by a restarted worker,
 * so a Release or Fetch that names a tensor of a dead incarnation can only
 * miss, never hit the wrong tensor. */
#ifndef BATON_WORKER_STORE_H
#define BATON_WORKER_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "worker/device.h"
#include "worker/pool.h"

/* Where a tensor lives, as the wire names it. */
typedef struct wk_ref {
    bool own;                     /* in this worker's pool (owner = self) */
    uint32_t owner;               /* worker index when !own */
    uint32_t pool;
    uint64_t offset, nbytes;      /* bytes */
    uint64_t id;
    baton_dtype dtype;
    uint32_t ndim;
    int64_t dims[BATON_MAX_DIMS];
} wk_ref;

typedef struct wk_request wk_request;

/* A tensor in the own pool. */
typedef struct wk_tensor {
    wk_ref ref;                   /* ref.own is true */
    wk_pool_blk *blk;
    wk_request *req;              /* the request it belongs to */
    uint32_t pins;                /* readers and writers now (executions, sends, copies) */
    bool released;                /* out of the table; freed when pins drops to 0 */
    void *fill;                   /* a mark after the copy that fills it (a Put on a GPU
                                     worker), which readers on the device wait for; owned,
                                     freed with the tensor; NULL: written already */
    bool filled;                  /* FILL is known reached: readers need not wait */
    struct wk_tensor *prev, *next; /* in req->tensors */
} wk_tensor;

/* A copy the worker keeps for a request's loop iterations (a value staged
 * across devices, or pulled from another host): the source tensor (owner,
 * id; ids are never reused, so the pair names fixed bytes) and the own
 * tensor holding its copy. */
typedef struct wk_staged {
    uint32_t owner;
    uint64_t src_id;
    uint64_t id;                  /* own tensor; looked up, so a release is noticed */
} wk_staged;

/* Per request key: what the worker holds for it.  Made on the first Put or
 * Dispatch, freed by wk_store_request_gc once nothing is held any more (no
 * tensor, item, session or chain), so a request that ends leaves no
 * record.  The store owns the record and its tensors; the lists of items,
 * sessions and chains belong to the modules named, which keep them
 * (under the lock) and which the store reads only to tell whether the
 * record is still in use. */
struct wk_request {
    uint64_t key;
    wk_tensor *tensors;           /* store */
    struct wk_item *items;        /* item.c: its queued and running items */
    size_t n_items;               /* item.c */
    size_t n_running;             /* executor.c: items a lane runs now */
    struct wk_session *sessions;  /* executor.c: backend sessions open for it */
    struct wk_chain *chains;      /* runahead.c: its run-ahead windows */
    bool closed;                  /* SessionClose seen; waits for running items */
    wk_staged *staged;            /* store: copies kept for loop iterations; owned */
    size_t n_staged, cap_staged;
};

typedef struct wk_store wk_store;

/* A store over the pool of DEV (borrowed; outlives the store), whose
 * tensor ids carry INCARNATION, and which takes SELF as its index until
 * wk_store_set_self says otherwise.  0 or BT_ENOMEM. */
int wk_store_create(wk_device *dev, uint64_t incarnation, uint32_t self, wk_store **out);
/* Frees the records and the allocator (the pool's memory is the
 * device's).  NULL is a no-op. */
void wk_store_destroy(wk_store *s);

/* This worker's index (TensorRef.owner of its tensors), which a Peers
 * message may change. */
uint32_t wk_store_self(const wk_store *s);
void wk_store_set_self(wk_store *s, uint32_t self);
/* Live tensors (in the table). */
uint32_t wk_store_n_tensors(const wk_store *s);
void wk_store_pool_stats(const wk_store *s, wk_pool_stats *out);

/* The record of KEY, made when CREATE; NULL when there is none or it
 * cannot be made (memory, or a key the table cannot hold). */
wk_request *wk_store_request(wk_store *s, uint64_t key, bool create);
/* Frees REQ when it holds nothing any more.  NULL is a no-op. */
void wk_store_request_gc(wk_store *s, wk_request *req);
/* Releases every tensor of REQ. */
void wk_store_request_release_all(wk_store *s, wk_request *req);
/* Walks the records: *POS starts at 0; false at the end.  The record must
 * not be freed during the walk. */
bool wk_store_request_next(wk_store *s, size_t *pos, wk_request **out);

/* Allocates a tensor of REQ: dtype and dims as given, a fresh id, pinned
 * once when PIN.  NULL when the pool is full or the shape is invalid. */
wk_tensor *wk_store_tensor_new(wk_store *s, wk_request *req, baton_dtype dtype, uint32_t ndim,
                               const int64_t *dims, bool pin);
/* Gives T the id the conductor chose for it (Put.tensor_id).  0, or
 * BT_EEXIST when that id is taken or invalid. */
int wk_store_tensor_rekey(wk_store *s, wk_tensor *t, uint64_t id);
/* The live tensor ID, or NULL. */
wk_tensor *wk_store_tensor_find(wk_store *s, uint64_t id);
/* Takes ID out of the table and frees it now, or at its last unpin.
 * Unknown ids are ignored.  Does not collect the request record. */
void wk_store_tensor_release(wk_store *s, uint64_t id);
void wk_store_tensor_unpin(wk_store *s, wk_tensor *t);
/* T's element 0 (device memory on a GPU worker). */
void *wk_store_tensor_data(const wk_store *s, const wk_tensor *t);

/* The own tensor holding REQ's copy of the tensor REF names, or NULL. */
wk_tensor *wk_store_staged_find(wk_store *s, const wk_request *req, const wk_ref *ref);
/* Remembers that own tensor ID holds REQ's copy of REF.  0 or BT_ENOMEM. */
int wk_store_staged_add(wk_request *req, const wk_ref *ref, uint64_t id);

/* A block of NBYTES of the pool outside the tensor table (a
 * tensor-parallel follower's scratch, which no id names), its element 0 in
 * *DATA; NULL when the pool is full. */
wk_pool_blk *wk_store_block_alloc(wk_store *s, uint64_t nbytes, void **data);
void wk_store_block_free(wk_store *s, wk_pool_blk *blk);

#endif
