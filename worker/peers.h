/* The cache of peers' pools opened here: CPU workers' shm segments mapped
 * read-only, and GPU workers' CUDA slabs opened from their IPC handles
 * (through device.h).
 *
 * Peers' pools are mapped read-only, once per (peer, pool, incarnation),
 * and the mapping is cached: opening costs about a millisecond and must
 * not sit on the per-request path.  A mapping is pinned while an execution
 * reads through it, so that a Peers message marking the peer down never
 * unmaps memory under a running kernel; the unmap happens at the last
 * unpin.
 *
 * Every pool is opened when the Peers message arrives, never on the
 * request path: a GPU worker opens the CUDA pools of its local peers on
 * the same GPU, and any worker the CUDA pools (on another GPU, or any for
 * a CPU worker) of the peers named in Peers.reads_from, those whose
 * tensors the deployment's graphs can bring to it.  The others stay
 * closed: opening a pool of another GPU creates a CUDA context there
 * (hundreds of megabytes per process on a real one), which a worker that
 * never reads that GPU should not pay.  The opens run under the worker's
 * lock when the Peers message comes (once per peer incarnation, before any
 * request can point at that peer's pool), so a first open of another GPU,
 * which creates a context there, holds the lanes up once.  A read the
 * graphs did not foresee still works, by an open on its request's path,
 * counted apart (ipc_opens_on_request).
 *
 * Not thread-safe: the worker's lock serializes every call. */
#ifndef BATON_WORKER_PEERS_H
#define BATON_WORKER_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/baton.pb-c.h"
#include "worker/device.h"

typedef struct wk_mapping {
    uint32_t peer, pool;
    uint64_t incarnation;
    const void *base;    /* the peer's pool: a read-only shm mapping, or its CUDA slab */
    uint64_t size;
    int cuda_device;     /* GPU of a CUDA pool (base is device memory); -1 for shm */
    uint32_t pins;       /* executions reading through it now */
    bool stale;          /* the peer is gone or re-registered: unmap at pins == 0 */
    struct wk_mapping *next;
} wk_mapping;

typedef struct wk_peer wk_peer;

typedef struct wk_peers {
    wk_peer *peers;      /* from the last Peers message */
    size_t n;
    wk_mapping *maps;    /* cached mappings */
    char hostname[256];  /* ours: a peer elsewhere cannot be mapped */
    wk_device *dev;      /* opens CUDA pools; borrowed */
    uint64_t ipc_opens_ahead;      /* CUDA pools opened when a Peers message came */
    uint64_t ipc_opens_on_request; /* CUDA pools opened by wk_peers_pin, on a request's path */
} wk_peers;

void wk_peers_init(wk_peers *ps, const char *hostname, wk_device *dev);
/* Unmaps everything; every mapping must be unpinned. */
void wk_peers_destroy(wk_peers *ps);

/* Takes in a Peers message: remembers every peer's pools, marks stale the
 * mappings of peers that are down or have a new incarnation, and maps the
 * pools of peers that are up on this host (all but SELF; CUDA pools on
 * this worker's GPU, and those of the peers in MSG->reads_from).  A
 * failure to map is logged and retried on first use.  Returns 0 or
 * BT_ENOMEM. */
int wk_peers_update(wk_peers *ps, const Baton__V1__Peers *msg, uint32_t self);

/* Returns the mapping of pool POOL of peer PEER, pinned, mapping it when
 * needed; NULL with the reason in ERR when it cannot be had. */
wk_mapping *wk_peers_pin(wk_peers *ps, uint32_t peer, uint32_t pool, char *err, size_t errlen);
void wk_peers_unpin(wk_peers *ps, wk_mapping *m);
/* The bytes [OFFSET, OFFSET + NBYTES) of pool POOL of peer PEER through a
 * mapping already open here, or NULL (none open, or out of range);
 * *DEVICE tells whether they are device memory.  Nothing is pinned: the
 * caller holds the lock across its use. */
const void *wk_peers_bytes(const wk_peers *ps, uint32_t peer, uint32_t pool, uint64_t offset,
                           uint64_t nbytes, bool *device);

#endif
