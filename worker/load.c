/* Loading models (load.h). */
#include "worker/load.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/wire.h"

/* One Load in flight: its thread, and its end on the way back. */
typedef struct load_job {
    wk_event ev;                  /* first: the end goes to the I/O thread */
    wk_load *ld;
    pthread_t thread;
    bool joined;                  /* the thread was joined (wk_load_wait) */
    Baton__V1__ConductorMessage *msg; /* owned; msg->load */
    const baton_backend *backend;
    baton_model *handle;
    baton_status status;
    char err[512];
    uint64_t load_us;
    uint8_t comm_id[BK_COMM_ID_MAX]; /* tp > 1: the group's id (made here on rank 0) */
    size_t comm_id_len;           /* 0: none */
    struct load_job *next;        /* in ld->loading */
} load_job;

struct wk_load {
    wk_load_options opt;
    load_job *loading;            /* loads whose end was not run yet */
};

int wk_load_create(const wk_load_options *opt, wk_load **out)
{
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return BT_ENOMEM;
    (*out)->opt = *opt;
    return 0;
}

void wk_load_destroy(wk_load *ld)
{
    if (!ld)
        return;
    if (ld->loading)
        bt_warn("a model load never taken in is left behind");
    free(ld);
}

static void send_loaded(wk_load *ld, const char *model, baton_status code, const char *message,
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
    wk_wire_send(ld->opt.sock, &m);
}

static void on_loaded(wk_event *ev);

/* The longest a rank's load waits for the rest of its tensor-parallel
 * group to join: ranks read their shards at the same time, and a shard of
 * a large model may take minutes; past this the load fails rather than
 * wait for a rank that will never come.  The conductor ends the wait
 * sooner when it knows (a rank's load failed: the others are told to
 * stop, which cancels their wait). */
#define GROUP_MS 600000u

static int load_cancelled(void *arg)
{
    return atomic_load((const atomic_bool *)arg);
}

/* Runs model_load off the I/O thread. */
static void *load_main(void *arg)
{
    load_job *j = arg;
    const wk_load_options *o = &j->ld->opt;
    const Baton__V1__Load *l = j->msg->load;
    const char **keys = calloc(l->n_options + 1, sizeof(*keys));
    const char **vals = calloc(l->n_options + 1, sizeof(*vals));
    uint64_t t0 = bt_now_ns();
    if (!keys || !vals) {
        j->status = BATON_STATUS_RESOURCE_EXHAUSTED;
        snprintf(j->err, sizeof(j->err), "out of memory");
    } else {
        for (size_t i = 0; i < l->n_options; i++) {
            keys[i] = l->options[i]->key;
            vals[i] = l->options[i]->value;
        }
        uint32_t mb = l->max_batch ? l->max_batch : 1;
        baton_load_params p = {l->model, keys, vals, l->n_options, l->tp_rank,
                               l->tp_size ? l->tp_size : 1, o->device,
                               mb > WK_MAX_BATCH_CAP ? WK_MAX_BATCH_CAP : mb, o->threads,
                               o->profile, o->streams, o->comm_streams,
                               j->comm_id_len ? j->comm_id : NULL, j->comm_id_len,
                               load_cancelled, (void *)o->stopping, GROUP_MS};
        j->status = j->backend->model_load(&p, &j->handle, j->err, sizeof(j->err));
    }
    j->load_us = (bt_now_ns() - t0) / 1000u;
    free(keys);
    free(vals);
    j->ev.run = on_loaded;
    wk_events_post(o->events, &j->ev);
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

/* The communicator id of L's tensor-parallel group, into J: rank 0 makes
 * it and tells the conductor, which hands it to the other ranks' Load;
 * they take it from there.  0, or -1 with ERR. */
static int group_id(wk_load *ld, const Baton__V1__Load *l, load_job *j, char *err,
                    size_t errlen)
{
    if (l->tp_rank > 0) {
        if (!l->comm_id.len || l->comm_id.len > sizeof(j->comm_id)) {
            snprintf(err, errlen, "rank %u of tensor-parallel model %s got no valid group id",
                     l->tp_rank, l->model);
            return -1;
        }
        memcpy(j->comm_id, l->comm_id.data, l->comm_id.len);
        j->comm_id_len = l->comm_id.len;
        return 0;
    }
    if (wk_device_space(ld->opt.dev) != WK_SPACE_CUDA) {
        snprintf(err, errlen, "tensor parallelism needs GPU workers (the group talks over NCCL)");
        return -1;
    }
    size_t len = sizeof(j->comm_id);
    wk_device_bind_thread(ld->opt.dev);
    if (bk_comm_unique_id(j->comm_id, &len, err, errlen) != 0)
        return -1;
    j->comm_id_len = len;
    Baton__V1__TpGroup g = BATON__V1__TP_GROUP__INIT;
    g.model = l->model;
    g.comm_id.data = j->comm_id;
    g.comm_id.len = len;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_TP_GROUP;
    m.tp_group = &g;
    if (wk_wire_send(ld->opt.sock, &m) != 0) {
        snprintf(err, errlen, "cannot send the group id");
        return -1;
    }
    return 0;
}

/* Answers a Load for a model that is loaded already: like the first, as
 * long as it names the same backend (a conductor that restarted asks
 * again). */
static void answer_again(wk_load *ld, const Baton__V1__Load *l, const wk_model *have)
{
    bool same = strcmp(have->backend_spec, l->backend) == 0;
    char *report = same ? describe(have->backend, have->handle) : NULL;
    uint64_t bytes =
        same && have->backend->model_bytes ? have->backend->model_bytes(have->handle) : 0;
    send_loaded(ld, l->model, same ? BATON_STATUS_OK : BATON_STATUS_ALREADY_EXISTS,
                same ? "" : "a model of this name is loaded with another backend", 0, bytes,
                report);
    free(report);
}

void wk_load_on_load(wk_load *ld, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Load *l = msg->load;
    char err[512];
    pthread_mutex_lock(ld->opt.lock);
    const wk_model *have = wk_executor_model_find(ld->opt.ex, l->model);
    pthread_mutex_unlock(ld->opt.lock);
    const baton_backend *b = NULL;
    baton_status st;
    load_job *j = NULL;
    if (have) {
        answer_again(ld, l, have);
        goto out;
    }
    if (wk_load_pending(ld, l->model)) {
        send_loaded(ld, l->model, BATON_STATUS_ALREADY_EXISTS, "the model is being loaded", 0, 0,
                    NULL);
        goto out;
    }
    if ((st = wk_registry_find(ld->opt.registry, l->backend, &b, err, sizeof(err))) !=
        BATON_STATUS_OK) {
        send_loaded(ld, l->model, st, err, 0, 0, NULL);
        goto out;
    }
    if (!(j = calloc(1, sizeof(*j)))) {
        send_loaded(ld, l->model, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory", 0, 0, NULL);
        goto out;
    }
    j->ld = ld;
    j->msg = msg;
    j->backend = b;
    if (l->tp_size > 1 && group_id(ld, l, j, err, sizeof(err)) != 0) {
        send_loaded(ld, l->model, BATON_STATUS_FAILED_PRECONDITION, err, 0, 0, NULL);
        goto out;
    }
    if (pthread_create(&j->thread, NULL, load_main, j) != 0) {
        send_loaded(ld, l->model, BATON_STATUS_RESOURCE_EXHAUSTED, "cannot start a load thread",
                    0, 0, NULL);
        goto out;
    }
    j->next = ld->loading;
    ld->loading = j;
    return;
out:
    free(j);
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

/* The model J loaded, for the executor; NULL when memory is short (J's
 * status then says so). */
static wk_model *model_new(load_job *j)
{
    const Baton__V1__Load *l = j->msg->load;
    wk_model *m = calloc(1, sizeof(*m));
    if (!m || !(m->name = strdup(l->model)) || !(m->backend_spec = strdup(l->backend))) {
        if (m)
            free(m->name);
        free(m);
        j->status = BATON_STATUS_RESOURCE_EXHAUSTED;
        snprintf(j->err, sizeof(j->err), "out of memory");
        return NULL;
    }
    m->backend = j->backend;
    m->handle = j->handle;
    m->max_batch =
        l->max_batch ? (l->max_batch > WK_MAX_BATCH_CAP ? WK_MAX_BATCH_CAP : l->max_batch) : 1;
    m->tp_rank = l->tp_rank;
    m->tp_size = l->tp_size;
    m->step_ms = l->tp_size > 1 ? l->tp_step_ms : 0;
    return m;
}

/* On the I/O thread: a load thread is done.  The model joins the executor
 * and Loaded answers the conductor; a stopping worker unloads it instead
 * and answers nothing. */
static void on_loaded(wk_event *ev)
{
    load_job *j = (load_job *)ev;
    wk_load *ld = j->ld;
    if (!j->joined)
        pthread_join(j->thread, NULL);
    for (load_job **pp = &ld->loading; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    const Baton__V1__Load *l = j->msg->load;
    bool stopping = atomic_load(ld->opt.stopping);
    uint64_t weight_bytes = 0;
    char *report = NULL;
    wk_model *m = NULL;
    if (j->status == BATON_STATUS_OK && !stopping && !(m = model_new(j)))
        j->backend->model_unload(j->handle);
    else if (j->status == BATON_STATUS_OK && stopping)
        j->backend->model_unload(j->handle);
    if (m) {
        if (j->backend->model_bytes)
            weight_bytes = j->backend->model_bytes(j->handle);
        report = describe(j->backend, j->handle);
        pthread_mutex_lock(ld->opt.lock);
        wk_executor_model_add(ld->opt.ex, m);
        if (wk_model_follows(m))
            wk_tp_loaded(ld->opt.tp, m);
        pthread_mutex_unlock(ld->opt.lock);
    }
    if (j->status != BATON_STATUS_OK)
        wk_tp_load_failed(ld->opt.tp, l->model);
    if (!stopping)
        send_loaded(ld, l->model, j->status, j->err, j->load_us, weight_bytes, report);
    free(report);
    baton__v1__conductor_message__free_unpacked(j->msg, NULL);
    free(j);
}

bool wk_load_pending(const wk_load *ld, const char *model)
{
    for (const load_job *j = ld->loading; j; j = j->next)
        if (strcmp(j->msg->load->model, model) == 0)
            return true;
    return false;
}

bool wk_load_busy(const wk_load *ld)
{
    return ld->loading != NULL;
}

void wk_load_wait(wk_load *ld)
{
    for (load_job *j = ld->loading; j; j = j->next)
        if (!j->joined) {
            pthread_join(j->thread, NULL);
            j->joined = true;
        }
}
