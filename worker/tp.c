/* Tensor-parallel groups (tp.h). */
#include "worker/tp.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "common/status.h"
#include "common/vec.h"
#include "worker/join.h"

#define TP_MAX_INPUT_BYTES (64ull << 20)

/* A follower's session of a tensor-parallel model, named by the leader's
 * request key.  Kept apart from the request records: only the leader's
 * steps open and close it, never this worker's own Dispatch traffic. */
typedef struct tp_session {
    const wk_model *model;
    uint64_t key;
    baton_session *s;
    struct tp_session *next;
} tp_session;

/* A TpStep waiting for its model: a job of the executor once the model is
 * loaded here, kept on the early list before. */
typedef struct tp_step {
    wk_job job;                   /* first: the executor hands it back */
    wk_tp *tp;
    Baton__V1__ConductorMessage *msg; /* owned; msg->tp_step */
    struct tp_step *next;         /* on the early list */
} tp_step;

/* A step the leader packed, sent by the I/O thread. */
typedef struct tp_send {
    wk_event ev;                  /* first */
    wk_tp *tp;
    uint8_t *bytes;               /* a packed WorkerMessage; owned */
    size_t len;
} tp_send;

struct wk_tp {
    wk_tp_options opt;
    tp_session *sessions;         /* [L] the followers' sessions, of every model */
    tp_step *early;               /* I/O thread: steps for models still loading */
    atomic_uint_fast64_t steps;   /* steps run as a follower */
};

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

/* On the I/O thread: sends a step the leader packed (a stopping worker
 * sends nothing more).  A step the other ranks never get leaves this one
 * waiting for them in a collective. */
static void send_step(wk_event *ev)
{
    tp_send *s = (tp_send *)ev;
    int rc = 0;
    while (!atomic_load(s->tp->opt.stopping) &&
           (rc = zmq_send(s->tp->opt.sock, s->bytes, s->len, 0)) < 0 && zmq_errno() == EINTR) {
    }
    if (rc < 0 && !atomic_load(s->tp->opt.stopping))
        wk_tp_broken("(this worker's)", zmq_strerror(zmq_errno()));
    free(s->bytes);
    free(s);
}

/* Packs STEP into a WorkerMessage and hands it to the I/O thread.  0 or -1
 * (out of memory). */
static int post(wk_tp *tp, Baton__V1__TpStep *step)
{
    Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
    wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_TP_STEP;
    wm.tp_step = step;
    tp_send *s = calloc(1, sizeof(*s));
    size_t len = baton__v1__worker_message__get_packed_size(&wm);
    uint8_t *buf = s ? malloc(len ? len : 1) : NULL;
    if (!buf) {
        free(s);
        return -1;
    }
    baton__v1__worker_message__pack(&wm, buf);
    s->ev.run = send_step;
    s->tp = tp;
    s->bytes = buf;
    s->len = len;
    wk_events_post(tp->opt.events, &s->ev);
    return 0;
}

int wk_tp_lead(wk_tp *tp, baton_ctx *ctx, wk_model *m, const uint64_t *closed, size_t n_closed,
               baton_item *const *run, size_t n)
{
    tp_msg t = {0};
    if (n_closed && !closed)
        wk_tp_broken(m->name, "out of memory naming the closed sessions");
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
                if (wk_device_copy(tp->opt.dev, ctx->stream, t.bytes[ki], in->tensor.data, nb, err,
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
    if (post(tp, &t.step) != 0)
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
        if (post(tp, &only) != 0)
            wk_tp_broken(m->name, "out of memory telling the other ranks of closed sessions");
    }
    return -1;
}

/* --- follower: the queue ---------------------------------------------------- */

static void step_free(tp_step *s)
{
    baton__v1__conductor_message__free_unpacked(s->msg, NULL);
    free(s);
}

static void step_run(wk_job *job, wk_model *m, void *stream);

static void step_drop(wk_job *job)
{
    step_free((tp_step *)job);
}

void wk_tp_on_step(wk_tp *tp, Baton__V1__ConductorMessage *msg, bool loading)
{
    const char *model = msg->tp_step->model;
    tp_step *s = calloc(1, sizeof(*s));
    if (!s)
        wk_tp_broken(model, "out of memory queueing a step");
    s->job = (wk_job){step_run, step_drop, NULL};
    s->tp = tp;
    s->msg = msg;
    pthread_mutex_lock(tp->opt.lock);
    wk_model *m = wk_executor_model_find(tp->opt.ex, model);
    if (m && wk_model_follows(m)) {
        wk_executor_post_job(tp->opt.ex, m, &s->job);
        pthread_mutex_unlock(tp->opt.lock);
        return;
    }
    pthread_mutex_unlock(tp->opt.lock);
    if (loading) {
        /* The leader's load finished first: keep the step until ours does. */
        tp_step **pp = &tp->early;
        while (*pp)
            pp = &(*pp)->next;
        *pp = s;
        return;
    }
    wk_tp_broken(model, "a step arrived for a model not loaded here as one of its ranks");
}

void wk_tp_load_failed(wk_tp *tp, const char *model)
{
    for (tp_step **pp = &tp->early; *pp;) {
        tp_step *s = *pp;
        if (strcmp(s->msg->tp_step->model, model) != 0) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        step_free(s);
    }
}

void wk_tp_loaded(wk_tp *tp, wk_model *m)
{
    for (tp_step **pp = &tp->early; *pp;) {
        tp_step *s = *pp;
        if (strcmp(s->msg->tp_step->model, m->name) != 0) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        wk_executor_post_job(tp->opt.ex, m, &s->job);
    }
}

uint64_t wk_tp_steps(const wk_tp *tp)
{
    return atomic_load(&tp->steps);
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
    wk_tp *tp;
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
    wk_tp *tp = mr->tp;
    uint64_t nb = ndim <= BATON_MAX_DIMS ? wk_tensor_bytes(dtype, ndim, dims) : UINT64_MAX;
    if (nb == UINT64_MAX) {
        /* The backend asked for a shape the worker refuses; rank 0's ctx
         * refuses it too, and fails the item alike. */
        mirror_fail(&mr->ctx, &it->b, BATON_STATUS_INTERNAL, "an invalid tensor shape");
        return NULL;
    }
    if (BT_RESERVE(it->tensors, it->n_tensors, it->cap_tensors, 8) != 0)
        goto oom;
    tp_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        goto oom;
    void *data = NULL;
    pthread_mutex_lock(tp->opt.lock);
    t->blk = wk_store_block_alloc(tp->opt.store, nb, &data);
    pthread_mutex_unlock(tp->opt.lock);
    if (!t->blk) {
        /* Rank 0 found room where this rank did not: from here on their
         * work differs. */
        free(t);
        wk_tp_broken(mr->m->name, "the pool is full");
    }
    t->t.dtype = dtype;
    t->t.ndim = ndim;
    memcpy(t->t.dims, dims, ndim * sizeof(*dims));
    t->t.data = data;
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
    if (wk_device_copy(mr->tp->opt.dev, ctx->stream, write ? dev : host, write ? host : dev, n, err,
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

/* The leader fails an item its backend defers (a group cannot hold one
 * back on one rank): the follower's copy ends with the step. */
static void mirror_defer(baton_ctx *ctx, baton_item *item)
{
    (void)ctx, (void)item;
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

/* The follower's session of M for request KEY, or NULL.  [L] */
static tp_session *session_find(wk_tp *tp, const wk_model *m, uint64_t key)
{
    for (tp_session *s = tp->sessions; s; s = s->next)
        if (s->model == m && s->key == key)
            return s;
    return NULL;
}

/* Closes the follower's session of M for request KEY, if open.  On the
 * lane holding M. */
static void session_close_key(wk_tp *tp, wk_model *m, uint64_t key)
{
    pthread_mutex_lock(tp->opt.lock);
    tp_session **pp = &tp->sessions;
    while (*pp && ((*pp)->model != m || (*pp)->key != key))
        pp = &(*pp)->next;
    tp_session *s = *pp;
    if (s) {
        *pp = s->next;
        wk_executor_count_session(tp->opt.ex, -1);
    }
    pthread_mutex_unlock(tp->opt.lock);
    if (!s)
        return;
    if (m->backend->session_close)
        m->backend->session_close(m->handle, s->s);
    free(s);
}

/* Opens the session of IT's request on M unless it is open (as the
 * executor does for the worker's own items).  On the lane holding M. */
static void session_attach(tp_mirror *mr, wk_model *m, tp_item *it)
{
    wk_tp *tp = mr->tp;
    if (!m->backend->session_open)
        return;
    pthread_mutex_lock(tp->opt.lock);
    tp_session *have = session_find(tp, m, it->b.request_key);
    pthread_mutex_unlock(tp->opt.lock);
    if (have) {
        it->b.session = have->s;
        return;
    }
    char err[512] = "";
    baton_session *bs = NULL;
    baton_status st = m->backend->session_open(m->handle, it->b.request_key, &bs, err,
                                               sizeof(err));
    tp_session *s = st == BATON_STATUS_OK ? calloc(1, sizeof(*s)) : NULL;
    if (!s)
        wk_tp_broken(m->name, st == BATON_STATUS_OK ? "out of memory" : err);
    s->model = m;
    s->key = it->b.request_key;
    s->s = bs;
    pthread_mutex_lock(tp->opt.lock);
    s->next = tp->sessions;
    tp->sessions = s;
    wk_executor_count_session(tp->opt.ex, +1);
    pthread_mutex_unlock(tp->opt.lock);
    it->b.session = bs;
}

static void item_free(wk_tp *tp, tp_item *it)
{
    pthread_mutex_lock(tp->opt.lock);
    for (size_t i = 0; i < it->n_tensors; i++)
        wk_store_block_free(tp->opt.store, it->tensors[i]->blk);
    pthread_mutex_unlock(tp->opt.lock);
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
        if (v->data.len && wk_device_copy(mr->tp->opt.dev, mr->ctx.stream, t->t.data, v->data.data,
                                          v->data.len, err, sizeof(err)) != 0)
            wk_tp_broken(m->name, err);
        it->inputs[k] = (baton_input){in->name, t->t, in->stream, in->final, in->chat,
                                      in->raw};
        b->n_inputs = (uint32_t)k + 1;
    }
    session_attach(mr, m, it);
}

static void follow_one(wk_tp *tp, wk_model *m, tp_mirror *mr, const Baton__V1__TpStep *st)
{
    for (size_t k = 0; k < st->n_close_keys; k++)
        session_close_key(tp, m, st->close_keys[k]);
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
    if (wk_device_sync(tp->opt.dev, mr->ctx.stream, err, sizeof(err)) != 0)
        bt_error("model %s (follower): %s", m->name, err);
    wk_device_exit_if_lost(tp->opt.dev, m->name);
    wk_model_exit_if_broken(m, "follower");
    for (size_t i = 0; i < n; i++)
        item_free(tp, &items[i]);
    free(items);
    free(run);
}

/* The executor runs a step on the lane holding M. */
static void step_run(wk_job *job, wk_model *m, void *stream)
{
    tp_step *s = (tp_step *)job;
    wk_tp *tp = s->tp;
    tp_mirror mr = {.tp = tp, .m = m};
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
                         .defer = mirror_defer,
                         .threads = tp->opt.threads,
                         .device = tp->opt.device,
                         .stream = stream,
                         .impl = &mr};
    follow_one(tp, m, &mr, s->msg->tp_step);
    atomic_fetch_add(&tp->steps, 1);
    step_free(s);
}

/* --- life ---------------------------------------------------------------------- */

int wk_tp_create(const wk_tp_options *opt, wk_tp **out)
{
    *out = NULL;
    wk_tp *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return BT_ENOMEM;
    tp->opt = *opt;
    atomic_init(&tp->steps, 0);
    *out = tp;
    return 0;
}

void wk_tp_destroy(wk_tp *tp)
{
    if (!tp)
        return;
    while (tp->sessions) {
        tp_session *s = tp->sessions;
        tp->sessions = s->next;
        if (s->model->backend->session_close)
            s->model->backend->session_close(s->model->handle, s->s);
        free(s);
    }
    while (tp->early) {
        tp_step *s = tp->early;
        tp->early = s->next;
        step_free(s);
    }
    free(tp);
}
