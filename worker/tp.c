/* Tensor-parallel groups: the leader's steps, mirrored on the followers.
 *
 * A model with tp N is loaded on N workers, one shard per rank, and its
 * ranks meet in collectives (an all-reduce per layer) that only complete
 * when every rank calls them with the same shapes in the same order.  The
 * conductor dispatches the model's nodes to rank 0 alone, so rank 0 decides
 * every batch: before each execute() it describes the step (the sessions it
 * closed, then each item's request key, inputs by value, outputs and
 * sampling) in a TpStep, which the conductor relays to the other ranks.  A
 * follower runs the same step through the same backend on its own lane,
 * with a ctx of its own (below) that keeps its outputs to itself: only the
 * leader reports.  Steps keep their order on the way (one lane runs a model
 * at a time, the I/O thread sends events in order, and ZeroMQ keeps each
 * pipe's order), which is what makes the ranks' sequences of collectives
 * equal.
 *
 * What a step carries is small for the models this serves (prompts and
 * token ids); inputs are copied by value rather than shared by reference so
 * that a follower never reads memory the leader has already freed.  A step
 * whose inputs exceed TP_MAX_INPUT_BYTES is refused on the leader. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/join.h"
#include "worker/worker_internal.h"

#define TP_MAX_INPUT_BYTES (64ull << 20)

/* --- leader ----------------------------------------------------------------- */

/* The protobuf-c structures of one step, freed together. */
typedef struct tp_msg {
    Baton__V1__TpStep step;
    Baton__V1__TpItem *items, **itemp;
    Baton__V1__TpInput *ins, **inp;
    Baton__V1__Tensor *vals;
    Baton__V1__OutputSpec *outs, **outp;
    Baton__V1__Sampling *samp;
    uint32_t *iters;
    int64_t *dims;
    uint8_t **bytes;              /* per input: the host copy */
    size_t n_ins;
} tp_msg;

static void tp_msg_free(tp_msg *t)
{
    for (size_t i = 0; t->bytes && i < t->n_ins; i++)
        free(t->bytes[i]);
    free(t->bytes);
    free(t->items);
    free(t->itemp);
    free(t->ins);
    free(t->inp);
    free(t->vals);
    free(t->outs);
    free(t->outp);
    free(t->samp);
    free(t->iters);
    free(t->dims);
}

static void fail_all(baton_ctx *ctx, baton_item *const *run, size_t n, baton_status code,
                     const char *why)
{
    for (size_t i = 0; i < n; i++) {
        char msg[512];
        snprintf(msg, sizeof(msg), "node '%s': %s", run[i]->node_name, why);
        ctx->fail(ctx, run[i], code, msg);
    }
}

_Noreturn void wk_tp_broken(const char *model, const char *why)
{
    bt_error("model %s: %s; this rank cannot follow its tensor-parallel group, exiting so "
             "that the group is restarted", model, why);
    _exit(WK_EXIT_GROUP_BROKEN);
}

/* Packs STEP into a WorkerMessage and hands it to the I/O thread.  0 or -1
 * (out of memory). */
static int post(wk_worker *w, Baton__V1__TpStep *step)
{
    Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
    wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_TP_STEP;
    wm.tp_step = step;
    wk_event *ev = calloc(1, sizeof(*ev));
    size_t len = baton__v1__worker_message__get_packed_size(&wm);
    uint8_t *buf = ev ? malloc(len ? len : 1) : NULL;
    if (!buf) {
        free(ev);
        return -1;
    }
    baton__v1__worker_message__pack(&wm, buf);
    ev->kind = WK_EV_SEND;
    ev->bytes = buf;
    ev->len = len;
    pthread_mutex_lock(&w->lock);
    wk_event_push(w, ev);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int wk_tp_lead(wk_worker *w, baton_ctx *ctx, wk_model *m, const uint64_t *closed,
               size_t n_closed, baton_item *const *run, size_t n)
{
    tp_msg t = {0};
    char why[384] = "out of memory describing the step for the other ranks";
    baton_status code = BATON_STATUS_RESOURCE_EXHAUSTED;
    size_t n_ins = 0, n_outs = 0, n_iter = 0, n_dims = 0;
    uint64_t in_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        n_ins += run[i]->n_inputs;
        n_outs += run[i]->n_outputs;
        n_iter += run[i]->depth;
        for (uint32_t k = 0; k < run[i]->n_inputs; k++) {
            n_dims += run[i]->inputs[k].tensor.ndim;
            in_bytes += run[i]->inputs[k].tensor.nbytes;
        }
    }
    if (in_bytes > TP_MAX_INPUT_BYTES) {
        snprintf(why, sizeof(why), "the inputs of a step of tensor-parallel model %s are %" PRIu64
                 " bytes; its ranks exchange at most %llu", m->name, in_bytes,
                 (unsigned long long)TP_MAX_INPUT_BYTES);
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        goto err;
    }
    t.n_ins = n_ins;
    t.items = calloc(n + 1, sizeof(*t.items));
    t.itemp = calloc(n + 1, sizeof(*t.itemp));
    t.samp = calloc(n + 1, sizeof(*t.samp));
    t.ins = calloc(n_ins + 1, sizeof(*t.ins));
    t.inp = calloc(n_ins + 1, sizeof(*t.inp));
    t.vals = calloc(n_ins + 1, sizeof(*t.vals));
    t.bytes = calloc(n_ins + 1, sizeof(*t.bytes));
    t.outs = calloc(n_outs + 1, sizeof(*t.outs));
    t.outp = calloc(n_outs + 1, sizeof(*t.outp));
    t.iters = calloc(n_iter + 1, sizeof(*t.iters));
    t.dims = calloc(n_dims + 1, sizeof(*t.dims));
    if (!t.items || !t.itemp || !t.samp || !t.ins || !t.inp || !t.vals || !t.bytes || !t.outs ||
        !t.outp || !t.iters || !t.dims)
        goto err;
    baton__v1__tp_step__init(&t.step);
    t.step.model = m->name;
    t.step.mode = (char *)(n ? run[0]->mode : "");
    t.step.close_keys = (uint64_t *)closed;
    t.step.n_close_keys = n_closed;
    t.step.items = t.itemp;
    t.step.n_items = n;
    size_t ki = 0, ko = 0, kit = 0, kd = 0;
    for (size_t i = 0; i < n; i++) {
        const baton_item *b = run[i];
        Baton__V1__TpItem *ti = &t.items[i];
        baton__v1__tp_item__init(ti);
        ti->request_key = b->request_key;
        ti->node_name = (char *)b->node_name;
        ti->iteration = &t.iters[kit];
        ti->n_iteration = b->depth;
        if (b->depth)
            memcpy(&t.iters[kit], b->iteration, b->depth * sizeof(*t.iters));
        kit += b->depth;
        baton__v1__sampling__init(&t.samp[i]);
        t.samp[i].temperature = b->sampling.temperature;
        t.samp[i].top_k = b->sampling.top_k;
        t.samp[i].top_p = b->sampling.top_p;
        t.samp[i].seed = b->sampling.seed;
        ti->sampling = &t.samp[i];
        ti->inputs = &t.inp[ki];
        ti->n_inputs = b->n_inputs;
        for (uint32_t k = 0; k < b->n_inputs; k++, ki++) {
            const baton_input *in = &b->inputs[k];
            Baton__V1__TpInput *ti_in = &t.ins[ki];
            Baton__V1__Tensor *v = &t.vals[ki];
            baton__v1__tp_input__init(ti_in);
            baton__v1__tensor__init(v);
            ti_in->name = (char *)in->name;
            ti_in->stream = in->stream != 0;
            ti_in->final = in->final != 0;
            ti_in->chat = in->chat != 0;
            ti_in->raw = in->raw != 0;
            v->dtype = (Baton__V1__DType)in->tensor.dtype;
            v->dims = &t.dims[kd];
            v->n_dims = in->tensor.ndim;
            if (in->tensor.ndim)
                memcpy(&t.dims[kd], in->tensor.dims, in->tensor.ndim * sizeof(*t.dims));
            kd += in->tensor.ndim;
            uint64_t nb = in->tensor.nbytes;
            if (nb) {
                if (!(t.bytes[ki] = malloc(nb)))
                    goto err;
                char err[256];
                /* The tensor may be device memory, its own pool's or a
                 * peer's: the device layer tells them apart. */
                if (wk_device_copy(w->dev, ctx->stream, t.bytes[ki], in->tensor.data, nb, err,
                                   sizeof(err)) != 0) {
                    snprintf(why, sizeof(why), "reading input '%s' for the other ranks: %s",
                             in->name, err);
                    code = BATON_STATUS_INTERNAL;
                    goto err;
                }
            }
            v->data.data = t.bytes[ki];
            v->data.len = nb;
            ti_in->value = v;
            t.inp[ki] = ti_in;
        }
        ti->outputs = &t.outp[ko];
        ti->n_outputs = b->n_outputs;
        for (uint32_t o = 0; o < b->n_outputs; o++, ko++) {
            baton__v1__output_spec__init(&t.outs[ko]);
            t.outs[ko].name = (char *)b->outputs[o].name;
            t.outs[ko].stream = b->outputs[o].stream != 0;
            t.outs[ko].client = b->outputs[o].client != 0;
            t.outp[ko] = &t.outs[ko];
        }
        t.itemp[i] = ti;
    }
    if (post(w, &t.step) != 0)
        goto err;
    tp_msg_free(&t);
    return 0;
err:
    tp_msg_free(&t);
    bt_error("model %s: a step of %zu item(s) is not run: %s", m->name, n, why);
    fail_all(ctx, run, n, code, why);
    /* The sessions closed here must close on the other ranks too, or their
     * caches would hold slots this rank has freed, and the ranks' batches
     * would no longer line up. */
    if (n_closed) {
        Baton__V1__TpStep only = BATON__V1__TP_STEP__INIT;
        only.model = m->name;
        only.mode = (char *)"";
        only.close_keys = (uint64_t *)closed;
        only.n_close_keys = n_closed;
        if (post(w, &only) != 0)
            wk_tp_broken(m->name, "out of memory telling the other ranks of closed sessions");
    }
    return -1;
}

/* --- follower: the queue ---------------------------------------------------- */

void wk_tp_steps_free(wk_tp_step *steps)
{
    while (steps) {
        wk_tp_step *nx = steps->next;
        baton__v1__conductor_message__free_unpacked(steps->msg, NULL);
        free(steps);
        steps = nx;
    }
}

static void append(wk_tp_step **head, wk_tp_step **tail, wk_tp_step *s)
{
    s->next = NULL;
    if (*tail)
        (*tail)->next = s;
    else
        *head = s;
    *tail = s;
}

void wk_tp_on_step(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    const char *model = msg->tp_step->model;
    wk_tp_step *s = calloc(1, sizeof(*s));
    if (!s)
        wk_tp_broken(model, "out of memory queueing a step");
    s->msg = msg;
    pthread_mutex_lock(&w->lock);
    wk_model *m = wk_model_find(w, model);
    if (m && wk_model_follows(m)) {
        append(&m->tp_head, &m->tp_tail, s);
        pthread_cond_broadcast(&w->work);
        pthread_mutex_unlock(&w->lock);
        return;
    }
    pthread_mutex_unlock(&w->lock);
    bool loading = false;
    for (wk_load *ld = w->loading; ld; ld = ld->next)
        loading = loading || strcmp(ld->msg->load->model, model) == 0;
    if (loading) {
        /* The leader's load finished first: keep the step until ours does. */
        wk_tp_step **pp = &w->tp_early;
        while (*pp)
            pp = &(*pp)->next;
        *pp = s;
        return;
    }
    wk_tp_broken(model, "a step arrived for a model not loaded here as one of its ranks");
}

void wk_tp_load_failed(wk_worker *w, const char *model)
{
    for (wk_tp_step **pp = &w->tp_early; *pp;) {
        wk_tp_step *s = *pp;
        if (strcmp(s->msg->tp_step->model, model) != 0) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        s->next = NULL;
        wk_tp_steps_free(s);
    }
}

void wk_tp_loaded(wk_worker *w, wk_model *m)
{
    for (wk_tp_step **pp = &w->tp_early; *pp;) {
        wk_tp_step *s = *pp;
        if (strcmp(s->msg->tp_step->model, m->name) != 0) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        append(&m->tp_head, &m->tp_tail, s);
    }
    if (m->tp_head)
        pthread_cond_broadcast(&w->work);
}

/* --- follower: running a step --------------------------------------------- */

/* A tensor of a mirrored item: an input placed in the pool, or one the
 * backend allocated. */
typedef struct tp_tensor {
    baton_tensor t;               /* t.handle: index in the item's table + 1 */
    wk_pool_blk *blk;             /* in the pool; freed after the step */
    bool writable;
} tp_tensor;

typedef struct tp_item {
    baton_item b;                 /* first: the ctx callbacks cast back */
    baton_input *inputs;
    baton_output *outputs;
    tp_tensor **tensors;
    size_t n_tensors, cap_tensors;
    baton_status status;
} tp_item;

typedef struct tp_mirror {
    baton_ctx ctx;                /* first: the callbacks cast back */
    wk_worker *w;
    const wk_model *m;
} tp_mirror;

static tp_mirror *mirror_of(baton_ctx *ctx)
{
    return (tp_mirror *)ctx;
}

static void mirror_fail(baton_ctx *ctx, baton_item *item, baton_status code, const char *msg)
{
    tp_item *it = (tp_item *)item;
    if (it->status != BATON_STATUS_OK)
        return;
    it->status = code ? code : BATON_STATUS_UNKNOWN;
    /* The leader met the same error on the same input, and reports it. */
    bt_debug("model %s (follower): %s", mirror_of(ctx)->m->name, msg ? msg : "");
}

/* A new tensor of NBYTES in the pool for IT, or NULL (IT failed). */
static tp_tensor *tensor_new(tp_mirror *mr, tp_item *it, baton_dtype dtype, uint32_t ndim,
                             const int64_t *dims)
{
    wk_worker *w = mr->w;
    uint64_t nb = ndim <= BATON_MAX_DIMS ? wk_tensor_bytes(dtype, ndim, dims) : UINT64_MAX;
    if (nb == UINT64_MAX) {
        /* The backend asked for a shape the worker refuses; rank 0's ctx
         * refuses it too, and fails the item alike. */
        mirror_fail(&mr->ctx, &it->b, BATON_STATUS_INTERNAL, "an invalid tensor shape");
        return NULL;
    }
    if (it->n_tensors == it->cap_tensors) {
        size_t cap = it->cap_tensors ? 2 * it->cap_tensors : 8;
        tp_tensor **p = realloc(it->tensors, cap * sizeof(*p));
        if (!p)
            goto oom;
        it->tensors = p;
        it->cap_tensors = cap;
    }
    tp_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        goto oom;
    uint64_t off;
    pthread_mutex_lock(&w->lock);
    t->blk = wk_pool_alloc(w->pool, nb, &off);
    pthread_mutex_unlock(&w->lock);
    if (!t->blk) {
        /* Rank 0 found room where this rank did not: from here on their
         * work differs. */
        free(t);
        wk_tp_broken(mr->m->name, "the pool is full");
    }
    t->t.dtype = dtype;
    t->t.ndim = ndim;
    memcpy(t->t.dims, dims, ndim * sizeof(*dims));
    t->t.data = wk_device_pool_base(w->dev) + off;
    t->t.nbytes = nb;
    it->tensors[it->n_tensors++] = t;
    t->t.handle = it->n_tensors;
    return t;
oom:
    wk_tp_broken(mr->m->name, "out of memory");
}

static tp_tensor *tensor_of(tp_item *it, const baton_tensor *t)
{
    if (!t || t->handle == 0 || t->handle > it->n_tensors)
        return NULL;
    tp_tensor *s = it->tensors[t->handle - 1];
    return &s->t == t || s->t.data == t->data ? s : NULL;
}

static baton_tensor *mirror_alloc(baton_ctx *ctx, baton_item *item, baton_dtype dtype,
                                  uint32_t ndim, const int64_t *dims)
{
    tp_tensor *t = tensor_new(mirror_of(ctx), (tp_item *)item, dtype, ndim, dims);
    if (!t)
        return NULL;
    t->writable = true;
    return &t->t;
}

static int mirror_copy(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                       uint64_t offset, void *host, uint64_t n, bool write)
{
    tp_mirror *mr = mirror_of(ctx);
    tp_tensor *t = tensor_of((tp_item *)item, tensor);
    if (!t || offset > t->t.nbytes || n > t->t.nbytes - offset || (write && !t->writable)) {
        mirror_fail(ctx, item, BATON_STATUS_INTERNAL, "a read or write out of a tensor");
        return -1;
    }
    uint8_t *dev = (uint8_t *)t->t.data + offset;
    char err[256];
    if (wk_device_copy(mr->w->dev, ctx->stream, write ? dev : host, write ? host : dev, n, err,
                       sizeof(err)) != 0) {
        mirror_fail(ctx, item, BATON_STATUS_INTERNAL, err);
        return -1;
    }
    return 0;
}

static int mirror_read(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                       uint64_t offset, void *dst, uint64_t n)
{
    return mirror_copy(ctx, item, tensor, offset, dst, n, false);
}

static int mirror_write(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                        const void *src, uint64_t n)
{
    return mirror_copy(ctx, item, tensor, offset, (void *)src, n, true);
}

/* Outputs are the leader's to report: a follower checks what the backend
 * hands back as the worker's ctx would, and keeps nothing. */
static int mirror_set_output(baton_ctx *ctx, baton_item *item, uint32_t output,
                             const baton_tensor *tensor)
{
    (void)ctx;
    return output < item->n_outputs && tensor_of((tp_item *)item, tensor) ? 0 : -1;
}

static int mirror_forward(baton_ctx *ctx, baton_item *item, uint32_t output, uint32_t input)
{
    (void)ctx;
    return output < item->n_outputs && input < item->n_inputs ? 0 : -1;
}

static int mirror_emit_chunk(baton_ctx *ctx, baton_item *item, uint32_t output,
                             const baton_tensor *tensor, int final)
{
    (void)ctx;
    if (output >= item->n_outputs || !item->outputs[output].stream)
        return -1;
    if (tensor ? !tensor_of((tp_item *)item, tensor) : !final)
        return -1;
    return 0;
}

static void mirror_finish(baton_ctx *ctx, baton_item *item)
{
    (void)ctx, (void)item;
}

/* The leader counts the request's tokens; a follower's counts are the same
 * and go nowhere. */
static void mirror_count_tokens(baton_ctx *ctx, baton_item *item, uint32_t prompt,
                                uint32_t generated)
{
    (void)ctx, (void)item, (void)prompt, (void)generated;
}

/* Cancellation is the leader's: a follower that stopped an item early
 * would leave the collectives of the ranks unequal. */
static baton_status mirror_cancelled(baton_ctx *ctx, const baton_item *item)
{
    (void)ctx, (void)item;
    return BATON_STATUS_OK;
}

static baton_status mirror_sleep_ms(baton_ctx *ctx, const baton_item *item, uint32_t ms)
{
    (void)ctx, (void)item;
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return BATON_STATUS_OK;
}

static baton_session *session_find(wk_model *m, uint64_t key)
{
    for (wk_tp_session *s = m->tp_sessions; s; s = s->next)
        if (s->key == key)
            return s->s;
    return NULL;
}

static void session_close_key(wk_worker *w, wk_model *m, uint64_t key)
{
    for (wk_tp_session **pp = &m->tp_sessions; *pp; pp = &(*pp)->next) {
        wk_tp_session *s = *pp;
        if (s->key != key)
            continue;
        *pp = s->next;
        if (m->backend->session_close)
            m->backend->session_close(m->handle, s->s);
        free(s);
        pthread_mutex_lock(&w->lock);
        w->n_sessions--;
        pthread_mutex_unlock(&w->lock);
        return;
    }
}

void wk_tp_sessions_close(wk_model *m)
{
    while (m->tp_sessions) {
        wk_tp_session *s = m->tp_sessions;
        m->tp_sessions = s->next;
        if (m->backend->session_close)
            m->backend->session_close(m->handle, s->s);
        free(s);
    }
}

/* Opens the session of IT's request on M unless it is open (as the
 * worker's executor does for its own items). */
static void session_attach(tp_mirror *mr, wk_model *m, tp_item *it)
{
    wk_worker *w = mr->w;
    if (!m->backend->session_open)
        return;
    if ((it->b.session = session_find(m, it->b.request_key)))
        return;
    char err[512] = "";
    baton_session *bs = NULL;
    baton_status st = m->backend->session_open(m->handle, it->b.request_key, &bs, err,
                                               sizeof(err));
    wk_tp_session *s = st == BATON_STATUS_OK ? calloc(1, sizeof(*s)) : NULL;
    if (!s)
        wk_tp_broken(m->name, st == BATON_STATUS_OK ? "out of memory" : err);
    s->key = it->b.request_key;
    s->s = bs;
    s->next = m->tp_sessions;
    m->tp_sessions = s;
    pthread_mutex_lock(&w->lock);
    w->n_sessions++;
    pthread_mutex_unlock(&w->lock);
    it->b.session = bs;
}

static void item_free(wk_worker *w, tp_item *it)
{
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < it->n_tensors; i++)
        wk_pool_free(w->pool, it->tensors[i]->blk);
    pthread_mutex_unlock(&w->lock);
    for (size_t i = 0; i < it->n_tensors; i++)
        free(it->tensors[i]);
    free(it->tensors);
    free(it->inputs);
    free(it->outputs);
}

/* Builds item IT from TI: its inputs placed in the pool, its outputs and
 * sampling as the leader had them. */
static void item_build(tp_mirror *mr, wk_model *m, const Baton__V1__TpStep *st,
                       const Baton__V1__TpItem *ti, tp_item *it)
{
    baton_item *b = &it->b;
    b->request_key = ti->request_key;
    b->request_id = "";
    b->node_name = ti->node_name;
    b->mode = st->mode;
    b->iteration = ti->iteration;
    b->depth = (uint32_t)ti->n_iteration;
    if (ti->sampling)
        b->sampling = (baton_sampling){ti->sampling->temperature, ti->sampling->top_k,
                                       ti->sampling->top_p, ti->sampling->seed};
    it->inputs = calloc(ti->n_inputs + 1, sizeof(*it->inputs));
    it->outputs = calloc(ti->n_outputs + 1, sizeof(*it->outputs));
    if (!it->inputs || !it->outputs)
        wk_tp_broken(m->name, "out of memory");
    b->inputs = it->inputs;
    b->outputs = it->outputs;
    b->n_outputs = (uint32_t)ti->n_outputs;
    for (size_t o = 0; o < ti->n_outputs; o++)
        it->outputs[o] = (baton_output){ti->outputs[o]->name, ti->outputs[o]->stream,
                                        ti->outputs[o]->client};
    for (size_t k = 0; k < ti->n_inputs; k++) {
        const Baton__V1__TpInput *in = ti->inputs[k];
        const Baton__V1__Tensor *v = in->value;
        int64_t dims[BATON_MAX_DIMS] = {0};
        if (!v || v->n_dims > BATON_MAX_DIMS)
            wk_tp_broken(m->name, "a step with a malformed input");
        if (v->n_dims)
            memcpy(dims, v->dims, v->n_dims * sizeof(*dims));
        tp_tensor *t = tensor_new(mr, it, (baton_dtype)v->dtype, (uint32_t)v->n_dims, dims);
        if (!t || t->t.nbytes != v->data.len)
            wk_tp_broken(m->name, "a step with an input whose bytes do not match its shape");
        char err[256];
        if (v->data.len && wk_device_copy(mr->w->dev, mr->ctx.stream, t->t.data, v->data.data,
                                          v->data.len, err, sizeof(err)) != 0)
            wk_tp_broken(m->name, err);
        it->inputs[k] = (baton_input){in->name, t->t, in->stream, in->final, in->chat,
                                      in->raw};
        b->n_inputs = (uint32_t)k + 1;
    }
    session_attach(mr, m, it);
}

static void follow_one(wk_worker *w, wk_model *m, tp_mirror *mr, const Baton__V1__TpStep *st)
{
    for (size_t k = 0; k < st->n_close_keys; k++)
        session_close_key(w, m, st->close_keys[k]);
    size_t n = st->n_items;
    if (!n)
        return;
    tp_item *items = calloc(n, sizeof(*items));
    baton_item **run = calloc(n, sizeof(*run));
    if (!items || !run)
        wk_tp_broken(m->name, "out of memory");
    for (size_t i = 0; i < n; i++) {
        item_build(mr, m, st, st->items[i], &items[i]);
        run[i] = &items[i].b;
    }
    /* Whatever fails from here on (a prompt too long, say) fails on every
     * rank alike: the leader met the same input and reports it. */
    m->backend->execute(m->handle, &mr->ctx, run, n);
    char err[384];
    if (wk_device_sync(w->dev, mr->ctx.stream, err, sizeof(err)) != 0)
        bt_error("model %s (follower): %s", m->name, err);
    wk_executor_exit_if_lost(w, m);
    for (size_t i = 0; i < n; i++)
        item_free(w, &items[i]);
    free(items);
    free(run);
}

void wk_tp_follow(wk_worker *w, wk_model *m, void *stream, wk_tp_step *steps)
{
    tp_mirror mr = {.w = w, .m = m};
    mr.ctx = (baton_ctx){.alloc = mirror_alloc,
                         .set_output = mirror_set_output,
                         .forward = mirror_forward,
                         .emit_chunk = mirror_emit_chunk,
                         .finish = mirror_finish,
                         .fail = mirror_fail,
                         .cancelled = mirror_cancelled,
                         .sleep_ms = mirror_sleep_ms,
                         .read = mirror_read,
                         .write = mirror_write,
                         .count_tokens = mirror_count_tokens,
                         .threads = w->opt.threads,
                         .device = w->opt.device,
                         .stream = stream,
                         .impl = &mr};
    for (wk_tp_step *s = steps; s; s = s->next) {
        follow_one(w, m, &mr, s->msg->tp_step);
        atomic_fetch_add(&w->tp_steps, 1);
    }
    wk_tp_steps_free(steps);
}
