/* Resolving a dispatched item's inputs: each chunk reference is pinned
 * where it lies (a tensor of the own pool by id, or an offset into a
 * peer's mapped pool), and an input made of several pieces gets a joined
 * tensor in the own pool, whose copy runs after the lock is dropped.  A
 * single piece is handed to the backend in place: zero copy, whichever
 * pool holds it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/join.h"
#include "worker/worker_internal.h"

/* A join to carry out once the lock is dropped. */
struct wk_join_job {
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

/* Pins REF into a new slot of IT.  [L]  NULL with *CODE and ERR when the
 * tensor cannot be had. */
static wk_slot *pin_ref(wk_worker *w, wk_item *it, const wk_ref *ref, baton_status *code,
                        char *err, size_t errlen)
{
    wk_slot *s = wk_slot_add(it);
    *code = BATON_STATUS_RESOURCE_EXHAUSTED;
    if (!s) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    if (ref->own) {
        wk_tensor *t = wk_tensor_find(w, ref->id);
        if (!t) {
            *code = BATON_STATUS_NOT_FOUND;
            snprintf(err, errlen, "tensor %llu is not held by worker %s (released or never "
                     "made)", (unsigned long long)ref->id, w->opt.name);
            return NULL;
        }
        t->pins++;
        s->own = t;
        s->ref = t->ref;
        wk_slot_view(s, wk_tensor_data(w, t));
        return s;
    }
    *code = BATON_STATUS_FAILED_PRECONDITION;
    wk_mapping *m = wk_peers_pin(&w->peers, ref->owner, ref->pool, err, errlen);
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
    wk_slot_view(s, (const uint8_t *)m->base + ref->offset);
    return s;
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
static int prepare_input(wk_worker *w, wk_item *it, uint32_t k, wk_join_job **jobs)
{
    const Baton__V1__InputValue *iv = it->disp->d->inputs[k];
    baton_input *in = &it->inputs[k];
    char err[512], msg[768];
    baton_status code = BATON_STATUS_INVALID_ARGUMENT;
    in->name = iv->name;
    in->stream = iv->stream;
    in->final = iv->stream ? iv->final : 1;
    if (it->overrides && it->overrides[k]) {
        wk_slot *s = pin_ref(w, it, it->overrides[k], &code, err, sizeof(err));
        if (!s)
            goto fail;
        in->tensor = s->t;
        in->final = 1;
        return 0;
    }
    size_t n_chunks = 0;
    for (size_t p = 0; p < iv->n_parts; p++) {
        if (!transfer_supported(iv->parts[p]->transfer)) {
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
    j->n_parts = iv->n_parts;
    j->shard_dim = iv->shard_dim;
    wk_slot *last = NULL;
    size_t at = 0;
    for (size_t p = 0; p < iv->n_parts; p++) {
        j->parts[p].chunks = j->views + at;
        j->parts[p].n = iv->parts[p]->n_chunks;
        for (size_t c = 0; c < iv->parts[p]->n_chunks; c++, at++) {
            wk_ref r;
            if (wk_ref_from_proto(w, iv->parts[p]->chunks[c], &r, err, sizeof(err)) != 0) {
                code = BATON_STATUS_INVALID_ARGUMENT;
                job_free(j);
                goto fail;
            }
            if (!(last = pin_ref(w, it, &r, &code, err, sizeof(err)))) {
                job_free(j);
                goto fail;
            }
            j->views[at] = (wk_tview){last->t.dtype, last->t.ndim, {0}, last->t.data,
                                      last->t.nbytes};
            memcpy(j->views[at].dims, last->t.dims, sizeof(j->views[at].dims));
        }
    }
    if (wk_join_is_trivial(j->parts, j->n_parts)) {
        /* One tensor: the backend reads it where it lies, own pool or peer. */
        in->tensor = last->t;
        job_free(j);
        return 0;
    }
    if (wk_join_shape(j->parts, j->n_parts, j->shard_dim, &j->out, err, sizeof(err)) != 0) {
        code = BATON_STATUS_INVALID_ARGUMENT;
        job_free(j);
        goto fail;
    }
    wk_slot *s = wk_slot_add(it);
    wk_tensor *t = s ? wk_tensor_new(w, it->req, j->out.dtype, j->out.ndim, j->out.dims, true)
                     : NULL;
    if (!t) {
        snprintf(err, sizeof(err), "no room in the pool of worker %s for the joined %llu bytes",
                 w->opt.name, (unsigned long long)j->out.nbytes);
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        job_free(j);
        goto fail;
    }
    s->own = t;
    s->ref = t->ref;
    s->created = true;
    wk_slot_view(s, wk_tensor_data(w, t));
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

/* Sets up IT's inputs and outputs.  [L] */
void wk_item_prepare(wk_worker *w, wk_item *it, wk_join_job **jobs)
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
        if (prepare_input(w, it, k, jobs) != 0)
            return;
}

void wk_join_jobs_run(wk_join_job *jobs)
{
    for (wk_join_job *j = jobs, *nx; j; j = nx) {
        nx = j->next;
        wk_join_copy(j->parts, j->n_parts, j->shard_dim, &j->out, j->dst);
        job_free(j);
    }
}
