/* Resolving a dispatched item's inputs (inputs.h). */
#include "worker/inputs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/join.h"
#include "worker/wire.h"

/* A join to carry out once the lock is dropped, or (WAIT set) a mark the
 * lane's stream must wait for first: a tensor a Put is still filling. */
struct wk_join_job {
    wk_item *item;                /* failed when the copy fails */
    void *wait;                   /* the tensor's fill mark; its pin keeps it alive */
    wk_jpart *parts;
    size_t n_parts;
    wk_tview *views;
    uint32_t shard_dim;
    wk_tview out;
    void *dst;
    struct wk_join_job *next;
};

static void job_free(wk_join_job *j)
{
    free(j->parts);
    free(j->views);
    free(j);
}

/* Pins REF into a new slot of IT; an own tensor still being filled adds a
 * wait to *JOBS.  [L]  NULL with *CODE and ERR when the tensor cannot be
 * had. */
static wk_slot *pin_ref(const wk_inputs_env *env, wk_item *it, const wk_ref *ref,
                        wk_join_job **jobs, baton_status *code, char *err, size_t errlen)
{
    wk_slot *s = wk_item_slot_add(it);
    *code = BATON_STATUS_RESOURCE_EXHAUSTED;
    if (!s) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    if (ref->own) {
        wk_tensor *t = wk_store_tensor_find(env->store, ref->id);
        if (!t) {
            *code = BATON_STATUS_NOT_FOUND;
            snprintf(err, errlen, "tensor %llu is not held by worker %s (released or never "
                     "made)", (unsigned long long)ref->id, env->worker);
            return NULL;
        }
        t->pins++;
        s->own = t;
        s->ref = t->ref;
        wk_item_slot_view(s, wk_store_tensor_data(env->store, t));
        if (t->fill && !t->filled) {
            wk_join_job *w = calloc(1, sizeof(*w));
            if (!w) {
                snprintf(err, errlen, "out of host memory");
                return NULL;
            }
            w->item = it;
            w->wait = t->fill;
            w->next = *jobs;
            *jobs = w;
        }
        return s;
    }
    *code = BATON_STATUS_FAILED_PRECONDITION;
    wk_mapping *m = wk_peers_pin(env->peers, ref->owner, ref->pool, err, errlen);
    if (!m)
        return NULL;
    s->map = m;
    s->ref = *ref;
    if (ref->offset > m->size || ref->nbytes > m->size - ref->offset) {
        *code = BATON_STATUS_INVALID_ARGUMENT;
        snprintf(err, errlen, "tensor %llu of worker %u lies outside its pool",
                 (unsigned long long)ref->id, ref->owner);
        return NULL;
    }
    wk_item_slot_view(s, (const uint8_t *)m->base + ref->offset);
    return s;
}

/* Whether the backend cannot read the slot's memory where it lies. */
static bool needs_staging(const wk_inputs_env *env, const wk_slot *s)
{
    if (!s->map)
        return false;
    if (wk_device_space(env->dev) == WK_SPACE_HOST)
        return s->map->cuda_device >= 0;
    return s->map->cuda_device != wk_device_ordinal(env->dev);
}

static int transfer_supported(Baton__V1__TransferKind k)
{
    return k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED ||
           k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL ||
           k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC;
}

/* Resolves input K of IT into it->inputs[k]: in place when it is one
 * tensor, else through a new joined tensor whose copy is queued on JOBS.
 * [L]  Returns 0, or fails the item. */
static int prepare_input(const wk_inputs_env *env, wk_item *it, uint32_t k, wk_join_job **jobs)
{
    const Baton__V1__InputValue *iv = it->disp->d->inputs[k];
    baton_input *in = &it->inputs[k];
    char err[512], msg[768];
    baton_status code = BATON_STATUS_INVALID_ARGUMENT;
    in->name = iv->name;
    in->stream = iv->stream;
    in->final = iv->stream ? iv->final : 1;
    in->chat = iv->chat;
    in->raw = iv->raw;
    size_t n_chunks = 0;
    bool overridden = it->overrides && it->overrides[k];
    for (size_t p = 0; p < iv->n_parts; p++) {
        if (!overridden && !transfer_supported(iv->parts[p]->transfer)) {
            snprintf(err, sizeof(err), "part %zu needs transfer kind %d, which this worker does "
                     "not support (same-host shm only)", p, iv->parts[p]->transfer);
            code = BATON_STATUS_FAILED_PRECONDITION;
            goto fail;
        }
        n_chunks += iv->parts[p]->n_chunks;
    }
    wk_join_job *j = calloc(1, sizeof(*j));
    if (!j || !(j->parts = calloc(iv->n_parts ? iv->n_parts : 1, sizeof(*j->parts))) ||
        !(j->views = calloc(n_chunks ? n_chunks : 1, sizeof(*j->views)))) {
        if (j)
            job_free(j);
        snprintf(err, sizeof(err), "out of host memory");
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        goto fail;
    }
    j->item = it;
    j->n_parts = iv->n_parts;
    j->shard_dim = iv->shard_dim;
    wk_slot *last = NULL;
    bool stage = false;
    size_t at = 0;
    if (overridden) {
        /* A loop-back value replaces whatever the dispatch carried. */
        if (!(last = pin_ref(env, it, it->overrides[k], jobs, &code, err, sizeof(err)))) {
            job_free(j);
            goto fail;
        }
        in->final = 1;
        j->n_parts = 1;
        j->parts[0] = (wk_jpart){j->views, 1};
        j->views[0] = (wk_tview){last->t.dtype, last->t.ndim, {0}, last->t.data,
                                 last->t.nbytes};
        memcpy(j->views[0].dims, last->t.dims, sizeof(j->views[0].dims));
        stage = needs_staging(env, last);
    }
    for (size_t p = 0; !overridden && p < iv->n_parts; p++) {
        j->parts[p].chunks = j->views + at;
        j->parts[p].n = iv->parts[p]->n_chunks;
        for (size_t c = 0; c < iv->parts[p]->n_chunks; c++, at++) {
            wk_ref r;
            if (wk_wire_ref_from_proto(iv->parts[p]->chunks[c], wk_store_self(env->store), &r, err,
                                       sizeof(err)) != 0) {
                code = BATON_STATUS_INVALID_ARGUMENT;
                job_free(j);
                goto fail;
            }
            if (!(last = pin_ref(env, it, &r, jobs, &code, err, sizeof(err)))) {
                job_free(j);
                goto fail;
            }
            j->views[at] = (wk_tview){last->t.dtype, last->t.ndim, {0}, last->t.data,
                                      last->t.nbytes};
            memcpy(j->views[at].dims, last->t.dims, sizeof(j->views[at].dims));
            stage |= needs_staging(env, last);
        }
    }
    bool single = wk_join_is_trivial(j->parts, j->n_parts);
    if (!stage && single) {
        /* One tensor: the backend reads it where it lies, own pool or peer. */
        in->tensor = last->t;
        job_free(j);
        return 0;
    }
    /* A value read by every iteration of a loop (a persisted one, such as
     * a handed-off KV cache) is staged once per request, not per step. */
    bool reuse = stage && single && it->b.depth > 0;
    wk_tensor *have = reuse ? wk_store_staged_find(env->store, it->req, &last->ref) : NULL;
    if (have) {
        wk_slot *s = wk_item_slot_add(it);
        if (!s) {
            snprintf(err, sizeof(err), "out of host memory");
            code = BATON_STATUS_RESOURCE_EXHAUSTED;
            job_free(j);
            goto fail;
        }
        have->pins++;
        s->own = have;
        s->ref = have->ref;
        wk_item_slot_view(s, wk_store_tensor_data(env->store, have));
        in->tensor = s->t;
        job_free(j);
        return 0;
    }
    if (stage && single) {
        /* Staged as it is: a scalar stays a scalar. */
        j->out = j->views[0];
        j->out.data = NULL;
    } else if (wk_join_shape(j->parts, j->n_parts, j->shard_dim, &j->out, err,
                             sizeof(err)) != 0) {
        code = BATON_STATUS_INVALID_ARGUMENT;
        job_free(j);
        goto fail;
    }
    wk_slot *s = wk_item_slot_add(it);
    wk_tensor *t = s ? wk_store_tensor_new(env->store, it->req, j->out.dtype, j->out.ndim,
                                           j->out.dims, true)
                     : NULL;
    if (!t) {
        snprintf(err, sizeof(err), "no room in the pool of worker %s for the %s %llu bytes",
                 env->worker, stage ? "staged" : "joined", (unsigned long long)j->out.nbytes);
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        job_free(j);
        goto fail;
    }
    s->own = t;
    s->ref = t->ref;
    /* A reused copy belongs to the request (freed when it ends), not to
     * this execution. */
    s->created = !(reuse && wk_store_staged_add(it->req, &last->ref, t->ref.id) == 0);
    wk_item_slot_view(s, wk_store_tensor_data(env->store, t));
    j->dst = s->t.data;
    j->next = *jobs;
    *jobs = j;
    in->tensor = s->t;
    return 0;
fail:
    snprintf(msg, sizeof(msg), "node '%s' input '%s': %s", it->b.node_name, iv->name, err);
    wk_item_fail(it, code, msg);
    return -1;
}

void wk_inputs_prepare(const wk_inputs_env *env, wk_item *it, wk_join_job **jobs)
{
    const Baton__V1__Dispatch *d = it->disp->d;
    size_t ni = d->n_inputs, no = d->n_outputs;
    it->inputs = calloc(ni ? ni : 1, sizeof(*it->inputs));
    it->outputs = calloc(no ? no : 1, sizeof(*it->outputs));
    it->results = calloc(no ? no : 1, sizeof(*it->results));
    it->chunk_next = calloc(no ? no : 1, sizeof(*it->chunk_next));
    it->stream_closed = calloc(no ? no : 1, sizeof(*it->stream_closed));
    if (!it->inputs || !it->outputs || !it->results || !it->chunk_next || !it->stream_closed) {
        wk_item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return;
    }
    for (size_t o = 0; o < no; o++)
        it->outputs[o] = (baton_output){d->outputs[o]->name, d->outputs[o]->stream,
                                        d->outputs[o]->client};
    it->b.outputs = it->outputs;
    it->b.n_outputs = (uint32_t)no;
    it->b.inputs = it->inputs;
    it->b.n_inputs = (uint32_t)ni;
    for (uint32_t k = 0; k < ni; k++)
        if (prepare_input(env, it, k, jobs) != 0)
            return;
}

typedef struct copy_arg {
    wk_device *dev;
    void *stream;
    char err[256];
} copy_arg;

static int device_copy(void *arg, void *dst, const void *src, uint64_t n)
{
    copy_arg *a = arg;
    return wk_device_copy_async(a->dev, a->stream, dst, src, n, a->err, sizeof(a->err));
}

void wk_inputs_run_joins(const wk_inputs_env *env, wk_join_job *jobs, void *stream)
{
    copy_arg a = {env->dev, stream, ""};
    wk_join_job *done = NULL;
    int rc = 0;
    bool copies = false;
    /* Fills first: the copies below and the backend after read those
     * tensors on this stream.  The host does not wait for them. */
    for (wk_join_job *j = jobs; j && !rc; j = j->next)
        if (j->wait)
            rc = wk_device_mark_wait(env->dev, stream, j->wait, a.err, sizeof(a.err));
    for (wk_join_job *j = jobs, *nx; j; j = nx) {
        nx = j->next;
        if (!rc && !j->wait) {
            copies = true;
            if ((rc = wk_join_copy(j->parts, j->n_parts, j->shard_dim, &j->out, j->dst,
                                   device_copy, &a)) == 0)
                wk_device_count_staged(env->dev, j->out.nbytes);
        }
        j->next = done;
        done = j;
    }
    /* The copies are queued on the lane's stream; the backend reads the
     * tensors after this returns. */
    if (!rc && copies)
        rc = wk_device_sync(env->dev, stream, a.err, sizeof(a.err));
    for (wk_join_job *j = done, *nx; j; j = nx) {
        nx = j->next;
        if (rc) {
            char msg[384];
            snprintf(msg, sizeof(msg), "node '%s': staging an input failed: %s",
                     j->item->b.node_name, a.err);
            wk_item_fail(j->item, BATON_STATUS_INTERNAL, msg);
        }
        job_free(j);
    }
}
