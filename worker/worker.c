/* The worker process: creation, the I/O thread's loop, and the handling of
 * every ConductorMessage (proto/baton.proto, "conductor -> worker").
 *
 * The I/O thread polls three things: the DEALER socket, an eventfd the
 * lanes and loaders signal when they post events, and a self-pipe for
 * SIGTERM/SIGINT (PR_SET_PDEATHSIG delivers SIGTERM when the conductor
 * dies).  Results leave in the order they were posted, which is what puts
 * every Chunk of an execution before its Done. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "worker/join.h"
#include "common/log.h"
#include "common/pbwire.h"
#include "worker/worker_internal.h"
#include "worker/nccl.h"
#include "worker/xfer.h"

#define HEARTBEAT_NS 1000000000ull
#define MAX_BATCH_CAP 4096u /* larger max_batch values are clamped: lanes keep batches on the stack */

void wk_dispatch_refuse(wk_worker *w, const Baton__V1__Dispatch *d, baton_status code,
                        const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)message;
    Baton__V1__Done done = BATON__V1__DONE__INIT;
    done.request_key = d->request_key;
    done.node = d->node;
    done.graph = d->graph;
    done.n_iteration = d->n_iteration;
    done.iteration = d->iteration;
    done.status = &st;
    done.dispatch_id = d->dispatch_id;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &done;
    bt_warn("dispatch of node '%s' (request %s) refused: %s", d->node_name, d->request_id,
            message);
    wk_send(w, &m);
}

/* --- Load ---------------------------------------------------------------- */

static void send_loaded(wk_worker *w, const char *model, baton_status code, const char *message,
                        uint64_t load_us, uint64_t weight_bytes, const char *report)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)(message ? message : "");
    Baton__V1__Loaded l = BATON__V1__LOADED__INIT;
    l.model = (char *)model;
    l.status = &st;
    l.load_us = load_us;
    l.weight_bytes = weight_bytes;
    l.report = (char *)(report ? report : "");
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_LOADED;
    m.loaded = &l;
    if (code == BATON_STATUS_OK) {
        bt_info("model %s loaded in %" PRIu64 " us", model, load_us);
        /* The report is the schedule decision and prediction of each
         * executable, which belong in the log. */
        for (const char *r = report; r && *r;) {
            const char *nl = strchr(r, '\n');
            int n = nl ? (int)(nl - r) : (int)strlen(r);
            bt_info("model %s: %.*s", model, n, r);
            r += n + (nl != NULL);
        }
    } else
        bt_error("model %s not loaded: %s", model, st.message);
    wk_send(w, &m);
}

/* Runs model_load off the I/O thread, so heartbeats go on during a long
 * load (weights of a real model take seconds). */
static void *load_main(void *arg)
{
    wk_load *ld = arg;
    const Baton__V1__Load *l = ld->msg->load;
    const char **keys = calloc(l->n_options + 1, sizeof(*keys));
    const char **vals = calloc(l->n_options + 1, sizeof(*vals));
    uint64_t t0 = bt_now_ns();
    if (!keys || !vals) {
        ld->status = BATON_STATUS_RESOURCE_EXHAUSTED;
        snprintf(ld->err, sizeof(ld->err), "out of memory");
    } else {
        for (size_t i = 0; i < l->n_options; i++) {
            keys[i] = l->options[i]->key;
            vals[i] = l->options[i]->value;
        }
        uint32_t mb = l->max_batch ? l->max_batch : 1;
        baton_load_params p = {l->model, keys, vals, l->n_options, l->tp_rank,
                               l->tp_size ? l->tp_size : 1, ld->w->opt.device,
                               mb > MAX_BATCH_CAP ? MAX_BATCH_CAP : mb, ld->threads,
                               &ld->w->opt.profile, ld->w->opt.streams, ld->w->opt.comm_streams,
                               ld->comm_id_len ? ld->comm_id : NULL, ld->comm_id_len};
        ld->status = ld->backend->model_load(&p, &ld->handle, ld->err, sizeof(ld->err));
    }
    ld->load_us = (bt_now_ns() - t0) / 1000u;
    free(keys);
    free(vals);
    wk_event *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        bt_error("out of memory posting a load result; exiting");
        abort();
    }
    ev->kind = WK_EV_LOADED;
    ev->load = ld;
    pthread_mutex_lock(&ld->w->lock);
    wk_event_push(ld->w, ev);
    pthread_mutex_unlock(&ld->w->lock);
    return NULL;
}

/* The backend's account of a loaded model (malloc'd), or NULL when it has
 * none or memory is short. */
static char *describe(const baton_backend *b, const baton_model *model)
{
    if (!b->model_describe)
        return NULL;
    int need = b->model_describe(model, NULL, 0);
    char *text = need > 0 ? malloc((size_t)need + 1) : NULL;
    if (text)
        b->model_describe(model, text, (size_t)need + 1);
    return text;
}

/* The communicator id of L's tensor-parallel group, into LD: rank 0 makes
 * it and tells the conductor, which hands it to the other ranks' Load; they
 * take it from there.  0, or -1 with ERR. */
static int group_id(wk_worker *w, const Baton__V1__Load *l, wk_load *ld, char *err,
                    size_t errlen)
{
    if (l->tp_rank > 0) {
        if (!l->comm_id.len || l->comm_id.len > sizeof(ld->comm_id)) {
            snprintf(err, errlen, "rank %u of tensor-parallel model %s got no valid group id",
                     l->tp_rank, l->model);
            return -1;
        }
        memcpy(ld->comm_id, l->comm_id.data, l->comm_id.len);
        ld->comm_id_len = l->comm_id.len;
        return 0;
    }
    if (wk_device_space(w->dev) != WK_SPACE_CUDA) {
        snprintf(err, errlen, "tensor parallelism needs GPU workers (the group talks over NCCL)");
        return -1;
    }
    size_t len = sizeof(ld->comm_id);
    wk_device_bind_thread(w->dev);
    if (bk_comm_unique_id(ld->comm_id, &len, err, errlen) != 0)
        return -1;
    ld->comm_id_len = len;
    Baton__V1__TpGroup g = BATON__V1__TP_GROUP__INIT;
    g.model = l->model;
    g.comm_id.data = ld->comm_id;
    g.comm_id.len = len;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_TP_GROUP;
    m.tp_group = &g;
    return wk_send(w, &m) == 0 ? 0 : (snprintf(err, errlen, "cannot send the group id"), -1);
}

static void on_load(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Load *l = msg->load;
    char err[512];
    pthread_mutex_lock(&w->lock);
    wk_model *have = wk_model_find(w, l->model);
    pthread_mutex_unlock(&w->lock);
    if (have) {
        /* A repeated Load (e.g. after a conductor restart) is answered like
         * the first, as long as it names the same backend. */
        bool same = strcmp(have->backend_spec, l->backend) == 0;
        char *report = same ? describe(have->backend, have->handle) : NULL;
        uint64_t bytes = same && have->backend->model_bytes
                             ? have->backend->model_bytes(have->handle) : 0;
        send_loaded(w, l->model, same ? BATON_STATUS_OK : BATON_STATUS_ALREADY_EXISTS,
                    same ? "" : "a model of this name is loaded with another backend", 0, bytes,
                    report);
        free(report);
        goto out;
    }
    for (wk_load *ld = w->loading; ld; ld = ld->next)
        if (strcmp(ld->msg->load->model, l->model) == 0) {
            send_loaded(w, l->model, BATON_STATUS_ALREADY_EXISTS, "the model is being loaded",
                        0, 0, NULL);
            goto out;
        }
    const baton_backend *b;
    baton_status st = wk_registry_find(w->registry, l->backend, &b, err, sizeof(err));
    if (st != BATON_STATUS_OK) {
        send_loaded(w, l->model, st, err, 0, 0, NULL);
        goto out;
    }
    wk_load *ld = calloc(1, sizeof(*ld));
    if (!ld) {
        send_loaded(w, l->model, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory", 0, 0, NULL);
        goto out;
    }
    ld->msg = msg;
    ld->backend = b;
    ld->w = w;
    ld->threads = w->opt.threads;
    if (l->tp_size > 1 && group_id(w, l, ld, err, sizeof(err)) != 0) {
        free(ld);
        send_loaded(w, l->model, BATON_STATUS_FAILED_PRECONDITION, err, 0, 0, NULL);
        goto out;
    }
    if (pthread_create(&ld->thread, NULL, load_main, ld) != 0) {
        free(ld);
        send_loaded(w, l->model, BATON_STATUS_RESOURCE_EXHAUSTED, "cannot start a load thread",
                    0, 0, NULL);
        goto out;
    }
    ld->next = w->loading;
    w->loading = ld;
    return;
out:
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

static void on_loaded(wk_worker *w, wk_load *ld)
{
    pthread_join(ld->thread, NULL);
    for (wk_load **pp = &w->loading; *pp; pp = &(*pp)->next)
        if (*pp == ld) {
            *pp = ld->next;
            break;
        }
    const Baton__V1__Load *l = ld->msg->load;
    baton_status st = ld->status;
    uint64_t weight_bytes = 0;
    char *report = NULL;
    if (st == BATON_STATUS_OK) {
        wk_model *m = calloc(1, sizeof(*m));
        if (!m || !(m->name = strdup(l->model)) || !(m->backend_spec = strdup(l->backend))) {
            if (m)
                free(m->name);
            free(m);
            ld->backend->model_unload(ld->handle);
            st = BATON_STATUS_RESOURCE_EXHAUSTED;
            snprintf(ld->err, sizeof(ld->err), "out of memory");
        } else {
            m->backend = ld->backend;
            m->handle = ld->handle;
            m->max_batch = l->max_batch ? (l->max_batch > MAX_BATCH_CAP ? MAX_BATCH_CAP
                                                                        : l->max_batch) : 1;
            m->tp_rank = l->tp_rank;
            m->tp_size = l->tp_size;
            if (ld->backend->model_bytes)
                weight_bytes = ld->backend->model_bytes(ld->handle);
            report = describe(ld->backend, ld->handle);
            pthread_mutex_lock(&w->lock);
            m->next = w->models;
            w->models = m;
            if (wk_model_follows(m))
                wk_tp_loaded(w, m);
            pthread_mutex_unlock(&w->lock);
        }
    }
    if (st != BATON_STATUS_OK)
        wk_tp_load_failed(w, l->model);
    if (!atomic_load(&w->stopping))
        send_loaded(w, l->model, st, ld->err, ld->load_us, weight_bytes, report);
    free(report);
    baton__v1__conductor_message__free_unpacked(ld->msg, NULL);
    free(ld);
}

/* --- Dispatch ------------------------------------------------------------ */

void wk_dispatch_start(wk_worker *w, wk_dispatch *disp, wk_request *req)
{
    const Baton__V1__Dispatch *d = disp->d;
    disp->refs++; /* held across item creation, so a failure cannot free it under us */
    wk_model *model = wk_model_find(w, d->model);
    if (!model) {
        char why[512];
        snprintf(why, sizeof(why), "model '%s' is not loaded on worker %s", d->model,
                 w->opt.name);
        wk_dispatch_refuse(w, d, BATON_STATUS_FAILED_PRECONDITION, why);
        wk_dispatch_unref(disp);
        wk_request_gc(w, req);
        return;
    }
    uint32_t depth = (uint32_t)d->n_iteration;
    wk_chain *chain = NULL;
    if (depth && d->speculate_upto > d->iteration[depth - 1])
        chain = wk_chain_open(w, req, disp);
    wk_item *it = wk_item_create(w, disp, req, model, d->iteration, depth, NULL);
    if (it) {
        it->chain = chain;
        if (chain)
            chain->pending = true;
    } else if (chain) {
        chain->active = false;
        wk_chain_maybe_free(w, chain);
    }
    if (!it) {
        wk_dispatch_refuse(w, d, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        wk_dispatch_unref(disp);
        wk_request_gc(w, req);
        return;
    }
    wk_dispatch_unref(disp);
}

void wk_dispatch_accept(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Dispatch *d = msg->dispatch;
    char why[512];
    baton_status code = BATON_STATUS_INVALID_ARGUMENT;
    if (d->n_iteration > WK_MAX_DEPTH) {
        snprintf(why, sizeof(why), "iteration vector of %zu levels (at most %d)", d->n_iteration,
                 WK_MAX_DEPTH);
        goto refuse;
    }
    if (d->n_inputs > WK_MAX_PORTS || d->n_outputs > WK_MAX_PORTS) {
        snprintf(why, sizeof(why), "%zu inputs and %zu outputs (at most %d each)", d->n_inputs,
                 d->n_outputs, WK_MAX_PORTS);
        goto refuse;
    }
    pthread_mutex_lock(&w->lock);
    if (!wk_model_find(w, d->model)) {
        pthread_mutex_unlock(&w->lock);
        code = BATON_STATUS_FAILED_PRECONDITION;
        snprintf(why, sizeof(why), "model '%s' is not loaded on worker %s", d->model,
                 w->opt.name);
        goto refuse;
    }
    wk_request *req = wk_request_get(w, d->request_key, true);
    if (!req) {
        pthread_mutex_unlock(&w->lock);
        snprintf(why, sizeof(why), "request key %" PRIu64 " is not usable", d->request_key);
        goto refuse;
    }
    if (req->closed) {
        /* SessionClose came first: the request is over here. */
        pthread_mutex_unlock(&w->lock);
        bt_debug("dispatch of node '%s' for closed request %s ignored", d->node_name,
                 d->request_id);
        baton__v1__conductor_message__free_unpacked(msg, NULL);
        return;
    }
    wk_dispatch *disp = calloc(1, sizeof(*disp));
    if (!disp) {
        wk_request_gc(w, req);
        pthread_mutex_unlock(&w->lock);
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        snprintf(why, sizeof(why), "out of memory");
        goto refuse;
    }
    disp->msg = msg;
    disp->d = d;
    if (d->remaining_ms)
        disp->deadline_ns = bt_now_ns() + (uint64_t)d->remaining_ms * 1000000u;
    if (wk_pull_needed(d)) {
        /* Inputs on another host: parked until they are here. */
        pthread_mutex_unlock(&w->lock);
        wk_pull_start(w, disp, req);
        return;
    }
    wk_dispatch_start(w, disp, req);
    pthread_mutex_unlock(&w->lock);
    return;
refuse:
    wk_dispatch_refuse(w, d, code, why);
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

/* Parts that come over NCCL are received first (nccl.c), in arrival
 * order: the peer's sends are matched by that order. */
static void on_dispatch(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    if (wk_nccl_on_dispatch(w->nccl, msg) == 0)
        wk_dispatch_accept(w, msg);
}

/* --- Put, Fetch, Release, SessionClose, Peers ----------------------------- */

static void send_placed(wk_worker *w, const Baton__V1__Put *p, const wk_ref *ref,
                        baton_status code, const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)(message ? message : "");
    Baton__V1__TensorRef t = BATON__V1__TENSOR_REF__INIT;
    int64_t dims[BATON_MAX_DIMS];
    Baton__V1__Placed pl = BATON__V1__PLACED__INIT;
    pl.request_key = p->request_key;
    pl.put_id = p->put_id;
    pl.status = &st;
    if (ref) {
        wk_ref_to_proto(w, ref, &t, dims, NULL);
        pl.ref = &t;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_PLACED;
    m.placed = &pl;
    if (code != BATON_STATUS_OK)
        bt_warn("put %" PRIu64 " of request %" PRIu64 " refused: %s", p->put_id, p->request_key,
                st.message);
    wk_send(w, &m);
}

static void on_put(wk_worker *w, const Baton__V1__Put *p)
{
    const Baton__V1__Tensor *v = p->value;
    char why[512];
    if (!v || v->dtype < BATON__V1__DTYPE__F32 || v->dtype > BATON__V1__DTYPE__BOOL ||
        v->n_dims > BATON_MAX_DIMS) {
        send_placed(w, p, NULL, BATON_STATUS_INVALID_ARGUMENT,
                    "the tensor has no valid dtype or too many dims");
        return;
    }
    uint64_t bytes = wk_tensor_bytes((baton_dtype)v->dtype, (uint32_t)v->n_dims, v->dims);
    if (bytes == UINT64_MAX || bytes != v->data.len) {
        snprintf(why, sizeof(why), "its dims and dtype span %" PRIu64 " bytes but %zu were sent",
                 bytes, v->data.len);
        send_placed(w, p, NULL, BATON_STATUS_INVALID_ARGUMENT, why);
        return;
    }
    pthread_mutex_lock(&w->lock);
    wk_request *req = wk_request_get(w, p->request_key, true);
    wk_tensor *t = req && !req->closed ? wk_tensor_new(w, req, (baton_dtype)v->dtype,
                                                       (uint32_t)v->n_dims, v->dims, true)
                                       : NULL;
    if (t && p->tensor_id && wk_tensor_rekey(w, t, p->tensor_id) != 0) {
        uint64_t id = t->ref.id;
        wk_tensor_unpin(w, t);
        wk_tensor_release(w, id);
        wk_request_gc(w, req);
        pthread_mutex_unlock(&w->lock);
        snprintf(why, sizeof(why), "tensor id %" PRIu64 " is taken or invalid", p->tensor_id);
        send_placed(w, p, NULL, BATON_STATUS_INVALID_ARGUMENT, why);
        return;
    }
    if (!t) {
        wk_pool_stats st;
        wk_pool_get_stats(w->pool, &st);
        bool closed = req && req->closed;
        wk_request_gc(w, req);
        pthread_mutex_unlock(&w->lock);
        if (closed)
            snprintf(why, sizeof(why), "the request was closed");
        else
            snprintf(why, sizeof(why), "the pool of worker %s is full: %" PRIu64 " bytes asked, "
                     "largest free block %" PRIu64 " of %" PRIu64 " free", w->opt.name, bytes,
                     st.largest_free, st.free);
        send_placed(w, p, NULL, closed ? BATON_STATUS_FAILED_PRECONDITION
                                       : BATON_STATUS_RESOURCE_EXHAUSTED, why);
        return;
    }
    pthread_mutex_unlock(&w->lock);
    /* Copy outside the lock: inputs may be large.  The tensor is pinned
     * and nobody knows its id before Placed. */
    char cerr[256];
    int rc = wk_device_copy(w->dev, w->io_stream, wk_tensor_data(w, t), v->data.data, bytes,
                            cerr, sizeof(cerr));
    pthread_mutex_lock(&w->lock);
    wk_ref ref = t->ref;
    wk_tensor_unpin(w, t);
    if (rc) {
        wk_tensor_release(w, ref.id);
        wk_request_gc(w, req);
    }
    pthread_mutex_unlock(&w->lock);
    if (rc) {
        snprintf(why, sizeof(why), "copy into the pool of worker %s: %s", w->opt.name, cerr);
        send_placed(w, p, NULL, BATON_STATUS_INTERNAL, why);
        return;
    }
    send_placed(w, p, &ref, BATON_STATUS_OK, NULL);
}

static void on_fetch(wk_worker *w, const Baton__V1__Fetch *f)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    Baton__V1__Fetched out = BATON__V1__FETCHED__INIT;
    out.tensor_id = f->tensor_id;
    out.status = &st;
    pthread_mutex_lock(&w->lock);
    wk_tensor *t = wk_tensor_find(w, f->tensor_id);
    if (t)
        t->pins++;
    pthread_mutex_unlock(&w->lock);
    char why[128];
    void *copy = NULL;
    bool copied = false;
    if (t && !(copy = wk_bytes_to_host(w, wk_tensor_data(w, t),
                                       wk_device_space(w->dev) == WK_SPACE_CUDA, t->ref.nbytes,
                                       &copied)) && t->ref.nbytes) {
        st.code = BATON__V1__CODE__INTERNAL;
        snprintf(why, sizeof(why), "tensor %" PRIu64 " could not be copied to the host",
                 f->tensor_id);
        st.message = why;
    } else if (t) {
        out.data.data = copy;
        out.data.len = t->ref.nbytes;
    } else {
        st.code = BATON__V1__CODE__NOT_FOUND;
        snprintf(why, sizeof(why), "tensor %" PRIu64 " is not held by worker %s", f->tensor_id,
                 w->opt.name);
        st.message = why;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_FETCHED;
    m.fetched = &out;
    wk_send(w, &m);
    if (copied)
        free(copy);
    if (t) {
        pthread_mutex_lock(&w->lock);
        wk_request *req = t->req;
        wk_tensor_unpin(w, t);
        wk_request_gc(w, req);
        pthread_mutex_unlock(&w->lock);
    }
}

static void on_release(wk_worker *w, const Baton__V1__Release *r)
{
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < r->n_tensor_ids; i++) {
        wk_tensor *t = wk_tensor_find(w, r->tensor_ids[i]);
        if (!t)
            continue; /* unknown or already released: quietly ignored */
        wk_request *req = t->req;
        wk_tensor_release(w, r->tensor_ids[i]);
        wk_request_gc(w, req);
    }
    pthread_mutex_unlock(&w->lock);
}

/* The request's last running item ended (or none ran): free what is left
 * of it.  [L] */
static void request_finalize(wk_worker *w, wk_request *req)
{
    wk_chain_close_all(w, req);
    wk_request_release_all(w, req);
    wk_executor_close_sessions(w, req);
    wk_request_gc(w, req);
}

static void on_session_close(wk_worker *w, uint64_t key)
{
    pthread_mutex_lock(&w->lock);
    wk_request *req = wk_request_get(w, key, false);
    if (req) {
        req->closed = true;
        wk_pull_request_closed(w, req);
        for (wk_item *it = req->items, *nx; it; it = nx) {
            nx = it->req_next;
            if (it->state == WK_ITEM_QUEUED) {
                wk_executor_dequeue(w, it);
                if (it->chain) {
                    it->chain->pending = false;
                    it->chain->active = false;
                    wk_chain_maybe_free(w, it->chain);
                }
                wk_item_destroy(w, it);
            } else {
                wk_item_cancel(w, it);
            }
        }
        /* With items still running, the rest waits for their ends, which
         * may still make tensors; sessions may be in use until then. */
        if (req->n_running == 0)
            request_finalize(w, req);
        else
            wk_chain_close_all(w, req);
    }
    pthread_mutex_unlock(&w->lock);
}

static void on_peers(wk_worker *w, const Baton__V1__Peers *p)
{
    pthread_mutex_lock(&w->lock);
    w->self_index = p->self_index;
    int rc = wk_peers_update(&w->peers, p, p->self_index);
    pthread_mutex_unlock(&w->lock);
    /* Without the lock: a peer found lost fails its pulls, whose callbacks
     * take it. */
    for (size_t i = 0; i < p->n_peers && !rc; i++) {
        const Baton__V1__PeerInfo *pi = p->peers[i];
        if (pi->index != p->self_index)
            rc = wk_xfer_peer_update(w->xfer, pi->index, pi->name, pi->peer_endpoint,
                                     pi->incarnation, pi->up) ||
                 wk_xfer_peer_key(w->xfer, pi->index, pi->curve_public_key);
    }
    if (rc)
        bt_error("out of memory taking in the peers");
    bt_info("peers: %zu workers, this one is index %u", p->n_peers, p->self_index);
    wk_nccl_on_peers(w->nccl, p);
}

/* --- events from lanes and loaders --------------------------------------- */

static void on_done_event(wk_worker *w, wk_item *it)
{
    pthread_mutex_lock(&w->lock);
    wk_request *req = it->req;
    req->n_running--;
    bool drop = atomic_load(&it->cancelled) || req->closed || atomic_load(&w->stopping);
    if (!drop) {
        for (uint32_t o = 0; it->results && o < it->b.n_outputs; o++)
            if (it->results[o].set)
                wk_dispatch_claim(it->disp, it->results[o].ref.id);
        wk_send_done(w, it);
    } else {
        /* Never reported: what this execution made is the worker's to free.
         * (A next iteration it was chained to, if any, was cancelled by the
         * same Drop or SessionClose, and finds these ids gone.) */
        for (uint32_t o = 0; it->results && o < it->b.n_outputs; o++)
            if (it->results[o].set && it->results[o].created)
                wk_tensor_release(w, it->results[o].ref.id);
    }
    wk_item_destroy(w, it);
    if (req->closed && req->n_running == 0)
        request_finalize(w, req);
    else
        wk_request_gc(w, req);
    pthread_mutex_unlock(&w->lock);
}

static void on_chunk_event(wk_worker *w, const wk_event *ev)
{
    pthread_mutex_lock(&w->lock);
    const wk_item *it = ev->item;
    if (atomic_load(&it->cancelled) || it->req->closed || atomic_load(&w->stopping)) {
        if (ev->has_ref && ev->created)
            wk_tensor_release(w, ev->ref.id);
    } else {
        if (ev->has_ref)
            wk_dispatch_claim(it->disp, ev->ref.id);
        wk_send_chunk(w, ev);
    }
    pthread_mutex_unlock(&w->lock);
}

/* A message a lane packed (a tensor-parallel step for the followers). */
static void send_bytes(wk_worker *w, wk_event *ev)
{
    /* A step the other ranks never get leaves this one waiting for them in
     * a collective. */
    int rc;
    while ((rc = zmq_send(w->sock, ev->bytes, ev->len, 0)) < 0 && zmq_errno() == EINTR) {
    }
    if (rc < 0 && !atomic_load(&w->stopping))
        wk_tp_broken("(this worker's)", zmq_strerror(zmq_errno()));
    free(ev->bytes);
}

void wk_drain_events(wk_worker *w)
{
    uint64_t n;
    if (read(w->event_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        bt_error("eventfd read: %s", strerror(errno));
    wk_xfer_drain_unpins(w->xfer);
    pthread_mutex_lock(&w->lock);
    wk_event *ev = w->ev_head;
    w->ev_head = w->ev_tail = NULL;
    pthread_mutex_unlock(&w->lock);
    while (ev) {
        wk_event *nx = ev->next;
        switch (ev->kind) {
        case WK_EV_CHUNK: on_chunk_event(w, ev); break;
        case WK_EV_DONE: on_done_event(w, ev->item); break;
        case WK_EV_LOADED: on_loaded(w, ev->load); break;
        case WK_EV_SEND: send_bytes(w, ev); break;
        case WK_EV_NCCL: wk_nccl_on_event(w->nccl, ev); break;
        }
        free(ev);
        ev = nx;
    }
}

/* --- the loop ------------------------------------------------------------ */

static void send_register(wk_worker *w)
{
    Baton__V1__PoolHandle ph = BATON__V1__POOL_HANDLE__INIT;
    wk_device_pool_handle(w->dev, &ph);
    Baton__V1__PoolHandle *phs[1] = {&ph};
    Baton__V1__Register r = BATON__V1__REGISTER__INIT;
    r.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    r.worker = (char *)w->opt.name;
    r.device = (char *)w->opt.device;
    r.n_pools = 1;
    r.pools = phs;
    r.pool_bytes = wk_device_pool_size(w->dev);
    r.pid = (uint32_t)getpid();
    r.hostname = w->hostname;
    r.peer_endpoint = (char *)wk_xfer_endpoint(w->xfer);
    /* Peers authenticate this worker's peer socket by it (and it theirs). */
    r.curve_public_key = w->opt.curve_own ? (char *)w->opt.curve_own->public_z85 : "";
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &r;
    wk_send(w, &m);
}

static void send_heartbeat(wk_worker *w)
{
    Baton__V1__Heartbeat hb = BATON__V1__HEARTBEAT__INIT;
    wk_pool_stats st;
    pthread_mutex_lock(&w->lock);
    wk_pool_get_stats(w->pool, &st);
    hb.live_tensors = w->n_tensors;
    hb.open_sessions = w->n_sessions;
    hb.queued = w->n_queued;
    pthread_mutex_unlock(&w->lock);
    hb.staged_bytes = wk_device_staged_bytes(w->dev);
    hb.tp_steps = atomic_load(&w->tp_steps);
    hb.pool_used_bytes = st.used;
    hb.pool_free_bytes = st.free;
    hb.fragmentation = st.fragmentation;
    hb.largest_free_bytes = st.largest_free;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    wk_send(w, &m);
}

/* The fields of a Put or a Dispatch that name its request, read from a
 * frame that does not parse as a whole. */
typedef struct salvaged {
    uint64_t member;              /* ConductorMessage field: 2 Dispatch, 9 Put; 0: neither */
    uint64_t request_key, put_id, dispatch_id;
    uint32_t graph, node;
    uint32_t iteration[16];
    size_t n_iteration;
} salvaged;

static void salvage_fields(salvaged *sv, const pbw_field *top)
{
    pbw_reader r = pbw_init(top->data, top->len);
    pbw_field f;
    bool put = sv->member == 9;
    while (pbw_next(&r, &f) > 0) {
        if (f.number == 1 && f.wire == PBW_VARINT)
            sv->request_key = f.value;
        else if (put && f.number == 2 && f.wire == PBW_VARINT)
            sv->put_id = f.value;
        else if (!put && f.number == 3 && f.wire == PBW_VARINT)
            sv->graph = (uint32_t)f.value;
        else if (!put && f.number == 4 && f.wire == PBW_VARINT)
            sv->node = (uint32_t)f.value;
        else if (!put && f.number == 13 && f.wire == PBW_VARINT)
            sv->dispatch_id = f.value;
        else if (!put && f.number == 8 && f.wire == PBW_VARINT && sv->n_iteration < 16)
            sv->iteration[sv->n_iteration++] = (uint32_t)f.value;
        else if (!put && f.number == 8 && f.wire == PBW_BYTES) {
            const uint8_t *p = f.data, *end = f.data + f.len;
            uint64_t v;
            while (p < end && sv->n_iteration < 16 && pbw_varint(&p, end, &v) == 0)
                sv->iteration[sv->n_iteration++] = (uint32_t)v;
        }
    }
}

/* A frame from the conductor that does not parse: when it is a Put or a
 * Dispatch whose request can still be read from it, that request fails at
 * once (a refused Placed, a failed Done), rather than wait for an answer
 * that would never come. */
static void salvage_frame(wk_worker *w, const void *data, size_t len)
{
    salvaged sv = {0};
    pbw_reader r = pbw_init(data, len);
    pbw_field f;
    while (pbw_next(&r, &f) > 0)
        if ((f.number == 2 || f.number == 9) && f.wire == PBW_BYTES) {
            sv.member = f.number;
            salvage_fields(&sv, &f);
        }
    if (!sv.member || !sv.request_key) {
        bt_warn("dropped a frame of %zu bytes from the conductor that does not parse", len);
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "worker %s could not parse the %s of %zu bytes the conductor "
             "sent for this request", w->opt.name, sv.member == 9 ? "Put" : "Dispatch", len);
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__INTERNAL;
    st.message = why;
    if (sv.member == 9) {
        Baton__V1__Put p = BATON__V1__PUT__INIT;
        p.request_key = sv.request_key;
        p.put_id = sv.put_id;
        send_placed(w, &p, NULL, BATON_STATUS_INTERNAL, why);
        return;
    }
    Baton__V1__Done d = BATON__V1__DONE__INIT;
    d.request_key = sv.request_key;
    d.graph = sv.graph;
    d.node = sv.node;
    d.iteration = sv.iteration;
    d.n_iteration = sv.n_iteration;
    d.dispatch_id = sv.dispatch_id;
    d.status = &st;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &d;
    bt_warn("%s", why);
    wk_send(w, &m);
}

void wk_handle_frame(wk_worker *w, const void *data, size_t len)
{
    Baton__V1__ConductorMessage *msg =
        baton__v1__conductor_message__unpack(NULL, len, (const uint8_t *)data);
    if (!msg) {
        salvage_frame(w, data, len);
        return;
    }
    switch (msg->msg_case) {
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD:
        on_load(w, msg);
        return; /* owns msg */
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH:
        on_dispatch(w, msg);
        return; /* owns msg */
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_TP_STEP:
        wk_tp_on_step(w, msg);
        return; /* owns msg */
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND:
        pthread_mutex_lock(&w->lock);
        wk_chain_extend(w, msg->extend);
        wk_pull_extend(w, msg->extend);
        pthread_mutex_unlock(&w->lock);
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP:
        pthread_mutex_lock(&w->lock);
        wk_pull_drop(w, msg->drop);
        wk_chain_drop(w, msg->drop);
        pthread_mutex_unlock(&w->lock);
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE: on_release(w, msg->release); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE:
        on_session_close(w, msg->session_close->request_key);
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH: on_fetch(w, msg->fetch); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN:
        bt_info("shutdown: %s", msg->shutdown->reason && *msg->shutdown->reason
                                    ? msg->shutdown->reason : "asked by the conductor");
        w->quit = true;
        w->exit_code = 0;
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT: on_put(w, msg->put); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS: on_peers(w, msg->peers); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_PAIR_COMM:
        wk_nccl_on_pair_comm(w->nccl, msg->pair_comm);
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_SEND: wk_nccl_on_send(w->nccl, msg->send); break;
    default: bt_warn("dropped a conductor message with no member set"); break;
    }
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

/* Reads the monitor's events; every connection after the first is a
 * reconnect, and the conductor on the other side may not know us. */
static void monitor_events(wk_worker *w)
{
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, w->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        bool more = zmq_msg_more(&ev);
        uint16_t id = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&id, zmq_msg_data(&ev), 2);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, w->monitor, 0);
            zmq_msg_close(&addr);
        }
        if (id == ZMQ_EVENT_CONNECTED && w->connects++ > 0) {
            bt_info("reconnected to %s; registering again", w->opt.endpoint);
            /* The conductor may be a new one that knows none of our pair
             * communicators: the next Peers makes them again. */
            wk_nccl_reset(w->nccl);
            send_register(w);
        }
    }
}

static void recv_all(wk_worker *w)
{
    while (!w->quit) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e != EAGAIN && e != EINTR)
                bt_error("receive from the conductor failed: %s", zmq_strerror(e));
            return;
        }
        wk_handle_frame(w, zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
    }
}

int wk_worker_run(wk_worker *w)
{
    send_register(w);
    bt_info("registered with %s: pool %s, %" PRIu64 " bytes, %u lane(s)", w->opt.endpoint,
            wk_device_pool_describe(w->dev), wk_device_pool_size(w->dev), w->n_lanes);
    uint64_t next_hb = bt_now_ns() + HEARTBEAT_NS;
    while (!w->quit) {
        /* The conductor's socket, the event fd, the signal pipe, the
         * monitor, then the worker-to-worker sockets (xfer.c). */
        /* The tick first: a producer it finds silent loses its socket,
         * which must not be in the poll set by then. */
        uint64_t now = bt_now_ns();
        long timeout = now >= next_hb ? 0 : (long)((next_hb - now) / 1000000u) + 1;
        long xt = wk_xfer_tick(w->xfer, now);
        if (xt >= 0 && xt < timeout)
            timeout = xt;
        size_t n_x = wk_xfer_poll_count(w->xfer);
        zmq_pollitem_t items[4 + n_x];
        items[0] = (zmq_pollitem_t){w->sock, 0, ZMQ_POLLIN, 0};
        items[1] = (zmq_pollitem_t){NULL, w->event_fd, ZMQ_POLLIN, 0};
        items[2] = (zmq_pollitem_t){NULL, w->signal_fd, ZMQ_POLLIN, 0};
        items[3] = (zmq_pollitem_t){w->monitor, 0, ZMQ_POLLIN, 0};
        n_x = wk_xfer_poll_fill(w->xfer, items + 4, n_x);
        if (zmq_poll(items, (int)(4 + n_x), timeout) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            bt_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            w->exit_code = 1;
            break;
        }
        if (items[2].revents & ZMQ_POLLIN) {
            unsigned char sig;
            if (read(w->signal_fd, &sig, 1) == 1)
                bt_info("%s received; stopping", strsignal(sig));
            w->quit = true;
            w->exit_code = 0;
            break;
        }
        if (items[0].revents & ZMQ_POLLIN)
            recv_all(w);
        if (items[1].revents & ZMQ_POLLIN)
            wk_drain_events(w);
        if (items[3].revents & ZMQ_POLLIN)
            monitor_events(w);
        wk_xfer_poll_handle(w->xfer, items + 4, n_x);
        now = bt_now_ns();
        if (now >= next_hb && !w->quit) {
            send_heartbeat(w);
            next_hb = next_hb + HEARTBEAT_NS > now ? next_hb + HEARTBEAT_NS : now + HEARTBEAT_NS;
        }
    }
    return w->exit_code;
}

void wk_worker_quiesce(wk_worker *w)
{
    /* Cancel everything first, so that lanes finish their batches quickly
     * (a sleeping item wakes at once), then join them. */
    pthread_mutex_lock(&w->lock);
    atomic_store(&w->stopping, true);
    wk_pull_cancel_all(w);
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&w->requests, &pos, &key, &val)) {
        wk_request *req = val;
        for (wk_item *it = req->items, *nx; it; it = nx) {
            nx = it->req_next;
            if (it->state == WK_ITEM_QUEUED) {
                wk_executor_dequeue(w, it);
                if (it->chain)
                    it->chain->pending = false;
                wk_item_destroy(w, it);
            } else {
                wk_item_cancel(w, it);
            }
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (w->lanes)
        wk_executor_stop(w);
    /* Loads cannot be interrupted; wait for them, then take in their
     * results (and every completion the lanes posted) without answering. */
    for (wk_load *ld = w->loading; ld; ld = ld->next)
        pthread_join(ld->thread, NULL);
    /* The comm thread fails what is pending (events taken in below). */
    wk_nccl_stop(w->nccl);
    while (w->loading) {
        wk_load *ld = w->loading;
        w->loading = ld->next;
        if (ld->status == BATON_STATUS_OK)
            ld->backend->model_unload(ld->handle);
        /* Its event, still queued, must not be taken in again. */
        ld->status = BATON_STATUS_CANCELLED;
        ld->handle = NULL;
    }
    pthread_mutex_lock(&w->lock);
    wk_event *ev = w->ev_head;
    w->ev_head = w->ev_tail = NULL;
    pthread_mutex_unlock(&w->lock);
    while (ev) {
        wk_event *nx = ev->next;
        if (ev->kind == WK_EV_CHUNK)
            on_chunk_event(w, ev);
        else if (ev->kind == WK_EV_DONE)
            on_done_event(w, ev->item);
        else if (ev->kind == WK_EV_SEND)
            free(ev->bytes);
        else if (ev->kind == WK_EV_NCCL)
            wk_nccl_on_event(w->nccl, ev);
        else {
            baton__v1__conductor_message__free_unpacked(ev->load->msg, NULL);
            free(ev->load);
        }
        free(ev);
        ev = nx;
    }
    pthread_mutex_lock(&w->lock);
    pos = 0;
    while (u64map_next(&w->requests, &pos, &key, &val))
        request_finalize(w, val);
    pthread_mutex_unlock(&w->lock);
    wk_tp_steps_free(w->tp_early);
    w->tp_early = NULL;
    wk_models_destroy(w);
}
