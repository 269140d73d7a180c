/* The conductor's tensor table (daemon/tensors.h). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/u64map.h"
#include "common/vec.h"
#include "daemon/tensors.h"

/* Tensor ids to release on one worker, sent as one message. */
typedef struct release_batch {
    uint64_t *ids;                /* owned */
    size_t n, cap;
    uint64_t bytes;               /* the tensors' bytes, summed */
} release_batch;

/* A worker's Releases are held until this many ids or bytes wait, or the
 * next tick: a decode loop frees a token's tensors at every iteration, and
 * a Release each would cost both processes a message per token, for a
 * few bytes of pool held a few milliseconds longer. */
#define RELEASE_HOLD_IDS 64
#define RELEASE_HOLD_BYTES (1u << 20)

struct tensor_table {
    supervisor *sup;              /* borrowed */
    u64map tensors;               /* tt_key -> ctensor (owned) */
    release_batch *releases;      /* per worker */
    size_t n_workers;
    size_t n_held;                /* ids held over every worker's batch */
};

size_t tt_count(const tensor_table *tt)
{
    return tt->tensors.n;
}

uint64_t tt_key(rt_tensor t)
{
    /* Worker ids keep the top byte free (incarnation < 2^16 << 40). */
    uint64_t k = ((uint64_t)(uint32_t)t.worker << 56) ^ t.id;
    return k == 0 || k == UINT64_MAX ? 1 : k;
}

tensor_table *tt_create(supervisor *sup)
{
    tensor_table *tt = calloc(1, sizeof(*tt));
    if (!tt)
        return NULL;
    tt->sup = sup;
    tt->n_workers = sup_n_workers(sup);
    u64map_init(&tt->tensors);
    tt->releases = calloc(tt->n_workers + 1, sizeof(*tt->releases));
    if (!tt->releases) {
        tt_destroy(tt);
        return NULL;
    }
    return tt;
}

static void ctensor_free(ctensor *t)
{
    if (t)
        free(t->data);
    free(t);
}

void tt_destroy(tensor_table *tt)
{
    if (!tt)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&tt->tensors, &pos, &key, &val))
        ctensor_free(val);
    u64map_free(&tt->tensors);
    for (size_t w = 0; tt->releases && w < tt->n_workers; w++)
        free(tt->releases[w].ids);
    free(tt->releases);
    free(tt);
}

/* Keeps the first inline bytes a tensor is reported with. */
static void keep_bytes(ctensor *t, const Baton__V1__TensorRef *ref)
{
    if (t->data || !ref->data.len)
        return;
    t->data = malloc(ref->data.len);
    if (t->data) {
        memcpy(t->data, ref->data.data, ref->data.len);
        t->ndata = ref->data.len;
    }
}

ctensor *tt_add(tensor_table *tt, int sender, const Baton__V1__TensorRef *ref)
{
    /* A pass-through output (echo) names a tensor another worker owns: the
     * owner, not the sender, holds it and gets its Release. */
    if (ref->owner >= tt->n_workers || ref->id == 0) {
        bt_warn("worker %s sent a tensor with owner %u, which is no worker",
                sup_worker_get(tt->sup, sender)->cfg->name, ref->owner);
        return NULL;
    }
    rt_tensor id = {ref->id, (int32_t)ref->owner};
    uint64_t key = tt_key(id);
    ctensor *t = u64map_get(&tt->tensors, key);
    if (t) {
        /* Its owner says where it lies: an input placed early was entered
         * before its worker knew the offset (it answers only a failure),
         * and a node that passes it through reports it here. */
        if ((uint32_t)sender == ref->owner) {
            t->pool = ref->pool;
            t->offset = ref->offset;
        }
        keep_bytes(t, ref);
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->t = id;
    t->pool = ref->pool;
    t->offset = ref->offset;
    t->nbytes = ref->nbytes;
    t->dtype = ref->dtype;
    t->ndim = ref->n_dims > TT_MAX_DIMS ? TT_MAX_DIMS : (uint32_t)ref->n_dims;
    for (uint32_t d = 0; d < t->ndim; d++)
        t->dims[d] = ref->dims[d];
    keep_bytes(t, ref);
    if (u64map_put(&tt->tensors, key, t) < 0) {
        ctensor_free(t);
        return NULL;
    }
    return t;
}

ctensor *tt_find_key(const tensor_table *tt, uint64_t key)
{
    return u64map_get(&tt->tensors, key);
}

ctensor *tt_find(const tensor_table *tt, rt_tensor t)
{
    return tt_find_key(tt, tt_key(t));
}

void tt_fill_ref(const ctensor *t, Baton__V1__TensorRef *r)
{
    baton__v1__tensor_ref__init(r);
    r->owner = (uint32_t)t->t.worker;
    r->pool = t->pool;
    r->offset = t->offset;
    r->nbytes = t->nbytes;
    r->dtype = t->dtype;
    r->n_dims = t->ndim;
    r->dims = (int64_t *)t->dims;
    r->id = t->t.id;
}

void tt_release(tensor_table *tt, rt_tensor t)
{
    ctensor *ct = u64map_del(&tt->tensors, tt_key(t));
    uint64_t nbytes = ct ? ct->nbytes : 0;
    ctensor_free(ct);
    if (t.worker < 0 || (size_t)t.worker >= tt->n_workers ||
        sup_worker_get(tt->sup, t.worker)->state == SUP_DOWN)
        return;
    release_batch *b = &tt->releases[t.worker];
    if (BT_RESERVE(b->ids, b->n, b->cap, 64) < 0) {
        bt_error("out of memory: tensor %llu on worker %s not released",
                 (unsigned long long)t.id, sup_worker_get(tt->sup, t.worker)->cfg->name);
        return;
    }
    b->ids[b->n++] = t.id;
    b->bytes += nbytes;
    tt->n_held++;
}

/* Sends the held Releases of each worker, all of them or those past the
 * hold.  At the tick they are deferred (daemon/workers.h): they ride with
 * the next message to their worker, or go at a later tick. */
static void send_releases(tensor_table *tt, bool all)
{
    for (size_t w = 0; w < tt->n_workers; w++) {
        release_batch *b = &tt->releases[w];
        if (!b->n || (!all && b->n < RELEASE_HOLD_IDS && b->bytes < RELEASE_HOLD_BYTES))
            continue;
        Baton__V1__Release rel = BATON__V1__RELEASE__INIT;
        rel.n_tensor_ids = b->n;
        rel.tensor_ids = b->ids;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE;
        m.release = &rel;
        if (sup_worker_get(tt->sup, (int)w)->state != SUP_DOWN)
            (all ? sup_send_deferred : sup_send)(tt->sup, (int)w, &m);
        tt->n_held -= b->n;
        b->n = 0;
        b->bytes = 0;
    }
}

void tt_flush(tensor_table *tt)
{
    send_releases(tt, false);
}

void tt_tick(tensor_table *tt)
{
    send_releases(tt, true);
}

bool tt_holding(const tensor_table *tt)
{
    return tt->n_held > 0;
}

void tt_forget_worker(tensor_table *tt, int worker)
{
    size_t pos = 0, n = 0;
    uint64_t key;
    void *val;
    uint64_t *doomed = malloc((tt->tensors.n + 1) * sizeof(*doomed));
    if (doomed) {
        while (u64map_next(&tt->tensors, &pos, &key, &val))
            if (((ctensor *)val)->t.worker == worker)
                doomed[n++] = key;
        for (size_t i = 0; i < n; i++)
            ctensor_free(u64map_del(&tt->tensors, doomed[i]));
        free(doomed);
    }
    tt->n_held -= tt->releases[worker].n;
    tt->releases[worker].n = 0;
    tt->releases[worker].bytes = 0;
}
