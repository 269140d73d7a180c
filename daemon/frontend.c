/* The client side of the conductor (daemon/frontend.h): checks at the
 * door, admission, placing inputs, cancels, deadlines, and handing each
 * request's results to its outbound queue. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/prefix.h"
#include "common/u64map.h"
#include "common/utf8.h"
#include "common/vec.h"
#include "daemon/deadlines.h"
#include "daemon/door.h"
#include "daemon/frontend.h"

#define MAX_GRAPH_INPUTS 64       /* Put ids are key * 64 + input index */

typedef enum front_phase {
    PHASE_PLACING = 0,            /* inputs being Put on workers */
    PHASE_RUNNING = 1,            /* in the dispatcher */
    PHASE_FLUSHING = 2            /* ended; client messages still waiting for bytes */
} front_phase;

typedef struct front_request {
    uint64_t key;                 /* unique per run */
    uint64_t hkey;                /* hash of (client identity, request_id) */
    struct front_request *hnext;  /* next request with the same hkey */
    uint8_t *identity;            /* the client's ZeroMQ routing id; owned */
    size_t identity_len;
    char *request_id;             /* owned */
    int graph;
    bool stream;
    front_phase phase;
    uint64_t start_us;            /* monotonic us at acceptance */
    uint64_t deadline_ms;         /* monotonic ms */
    disp_params params;           /* params.request_id borrowed from request_id */
    uint32_t *max_iters;          /* per entity, 0: the config's; owned */
    rt_tensor *inputs;            /* per graph input, once placed; owned */
    int chat_input;               /* the graph input that holds the messages; -1: none */
    uint8_t *raw;                 /* per graph input: text without the chat template; owned */
    uint32_t puts_pending;        /* Placed replies the start waits for */
    bool counted;                 /* in its client's inflight (cl_client) */
    bool discard;                 /* its client was dropped: answer nothing, count nothing */
    out_queue out;                /* client messages, in order */
} front_request;

struct frontend {
    const graph_set *gs;
    void *socket;
    outbound *out;
    supervisor *sup;
    tensor_table *tt;
    dispatcher *disp;
    front_hooks hooks;
    front_limits limits;
    front_admission admission;
    u64map requests;              /* key -> front_request (owned) */
    u64map by_client;             /* hkey -> front_request (chained by hnext) */
    cl_table *clients;            /* per connection: requests, unread replies (outbound's) */
    size_t n_placing;             /* requests in PHASE_PLACING */
    dl_heap deadlines;
    uint64_t next_key;
    uint64_t next_put_tensor;     /* ids of early puts, chosen here (top bit set) */
    uint64_t seed_state;          /* drawn once; each request's default seed is mixed from
                                     it (a getrandom call per request cost a system call) */
    replicas *rs;                 /* borrowed: a replicated consumer's pick */
    int **input_node;             /* per graph, per input: entity of its first consumer, -1 */
    uint8_t **input_local;        /* per graph, per input: every consumer runs where that one
                                     does, so the request need not wait for its Placed */
};

/* ---- the request table ------------------------------------------------- */

static uint64_t hash_client(const uint8_t *id, size_t n, const char *rid)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ id[i]) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
    for (const char *p = rid; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return h == 0 || h == UINT64_MAX ? 1 : h;
}

static front_request *find_request(frontend *f, const uint8_t *identity, size_t len,
                                   const char *request_id)
{
    uint64_t h = hash_client(identity, len, request_id);
    for (front_request *r = u64map_get(&f->by_client, h); r; r = r->hnext)
        if (r->identity_len == len && memcmp(r->identity, identity, len) == 0 &&
            strcmp(r->request_id, request_id) == 0)
            return r;
    return NULL;
}

/* The one in-flight request with this id on any connection, or NULL when
 * there is none or several.  Lets an operator's `batonctl cancel ID` (its
 * own connection) stop a request another client sent. */
static front_request *find_unique(frontend *f, const char *request_id, bool *ambiguous)
{
    front_request *found = NULL;
    *ambiguous = false;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&f->requests, &pos, &key, &val)) {
        front_request *r = val;
        if (strcmp(r->request_id, request_id) != 0)
            continue;
        if (found) {
            *ambiguous = true;
            return NULL;
        }
        found = r;
    }
    return found;
}

static void set_phase(frontend *f, front_request *r, front_phase p)
{
    f->n_placing += (p == PHASE_PLACING) - (r->phase == PHASE_PLACING);
    r->phase = p;
}

static void request_free(frontend *f, front_request *r)
{
    if (!r)
        return;
    if (u64map_get(&f->requests, r->key) == r) {
        u64map_del(&f->requests, r->key);
        f->n_placing -= r->phase == PHASE_PLACING;
        /* A dropped client's requests were uncounted when it was. */
        cl_client *c = r->discard || !r->counted
                           ? NULL : cl_find(f->clients, r->identity, r->identity_len);
        if (c) {
            cl_inflight_sub(f->clients, c);
            cl_release_if_idle(f->clients, c, bt_now_ms(), CL_REFUSED_KEEP_MS);
        }
    }
    /* Unlink from its hash chain. */
    front_request *head = u64map_get(&f->by_client, r->hkey);
    if (head == r) {
        if (r->hnext)
            u64map_put(&f->by_client, r->hkey, r->hnext);
        else
            u64map_del(&f->by_client, r->hkey);
    } else {
        for (front_request *p = head; p; p = p->hnext)
            if (p->hnext == r) {
                p->hnext = r->hnext;
                break;
            }
    }
    out_queue_free(&r->out);
    free(r->raw);
    free(r->inputs);
    free(r->max_iters);
    free(r->identity);
    free(r->request_id);
    free(r);
}

/* The keys of every request, so that a walk that ends some of them (which
 * removes them from the map) holds no pointer across an end. */
static size_t collect_keys(frontend *f, uint64_t **out)
{
    size_t n = 0, pos = 0;
    uint64_t key;
    void *val;
    *out = malloc((f->requests.n + 1) * sizeof(**out));
    while (*out && u64map_next(&f->requests, &pos, &key, &val))
        (*out)[n++] = key;
    return n;
}

size_t front_inflight(const frontend *f)
{
    return f->requests.n;
}

size_t front_placing(const frontend *f)
{
    return f->n_placing;
}

/* ---- results ----------------------------------------------------------- */

/* Sends what R has ready.  R may be freed on return. */
static void flush(frontend *f, front_request *r)
{
    out_client to = {r->identity, r->identity_len, r->request_id, r->graph, r->start_us,
                     r->params.seed, r->discard};
    if (out_flush(f->out, &r->out, &to)) {
        request_free(f, r);
        return;
    }
    /* Its text reached a stop string or max_tokens: the rest of its work
     * goes as on a cancel, and it ends OK.  Called from the dispatcher's
     * chunk hook, the response follows once the hook returns; else it
     * comes now, and may free R. */
    if (r->out.stop_pending) {
        r->out.stop_pending = false;
        if (r->phase == PHASE_RUNNING)
            disp_stop(f->disp, r->key);
    }
}

void front_on_chunk(frontend *f, uint64_t req, const rt_action *a)
{
    front_request *r = u64map_get(&f->requests, req);
    if (!r)
        return;
    out_queue_chunk(f->out, &r->out, a);
    flush(f, r);
}

void front_on_response(frontend *f, uint64_t req, const rt_action *a,
                       const disp_timing *timings, size_t n_timings)
{
    front_request *r = u64map_get(&f->requests, req);
    if (!r)
        return;
    out_queue_response(f->out, &r->out, a, timings, n_timings);
    set_phase(f, r, PHASE_FLUSHING);
    flush(f, r);
}

/* Flushes the requests of KEYS, which something made ready to send.
 * Flushing may free a request, so it happens after the walk that found
 * them. */
static void flush_keys(frontend *f, const uint64_t *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        front_request *r = u64map_get(&f->requests, keys[i]);
        if (r)
            flush(f, r);
    }
}

void front_fetched(frontend *f, int w, const Baton__V1__Fetched *m)
{
    uint64_t key = tt_key((rt_tensor){m->tensor_id, w});
    bt_code code = m->status ? (bt_code)m->status->code : BT_CODE_OK;
    const char *why = m->status && m->status->message ? m->status->message : "";
    uint64_t *hits = NULL, rk;
    size_t n = 0, cap = 0, pos = 0;
    void *val;
    while (u64map_next(&f->requests, &pos, &rk, &val)) {
        front_request *r = val;
        if (r->out.fetches_pending &&
            out_fetched(&r->out, key, code, why, m->data.data, m->data.len) &&
            BT_RESERVE(hits, n, cap, 8) == 0)
            hits[n++] = rk;
    }
    /* A request still running whose output is gone ends now, with that
     * error (its queue already says it), rather than streaming on. */
    for (size_t i = 0; code != BT_CODE_OK && i < n; i++) {
        front_request *r = u64map_get(&f->requests, hits[i]);
        if (r && r->phase == PHASE_RUNNING)
            disp_abort(f->disp, hits[i], code, r->out.fail_message ? r->out.fail_message : why);
    }
    flush_keys(f, hits, n);
    free(hits);
}

void front_fetches_lost(frontend *f, int w)
{
    uint64_t *hits = NULL, rk;
    size_t n = 0, cap = 0, pos = 0;
    void *val;
    while (u64map_next(&f->requests, &pos, &rk, &val)) {
        front_request *r = val;
        if (out_worker_lost(&r->out, w) && BT_RESERVE(hits, n, cap, 8) == 0)
            hits[n++] = rk;
    }
    flush_keys(f, hits, n);
    free(hits);
}

/* ---- placing inputs ---------------------------------------------------- */

/* Releases the inputs already placed, for a request that never reached the
 * dispatcher. */
static void release_inputs(frontend *f, front_request *r)
{
    const graph *g = &f->gs->graphs[r->graph];
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (r->inputs[k].id)
            tt_release(f->tt, r->inputs[k]);
        r->inputs[k] = (rt_tensor){0, 0};
    }
    tt_flush(f->tt);
}

/* Ends a request that has not reached the dispatcher. */
static void end_placing(frontend *f, front_request *r, bt_code code, const char *message)
{
    release_inputs(f, r);
    replicas_unpin(f->rs, r->key);
    if (!r->discard)
        out_reject(f->out, r->identity, r->identity_len, r->request_id, code, "%s", message);
    request_free(f, r);
}

/* Most blocks of a prompt a routing key covers (16 MiB of prompt): a
 * longer one is routed by its first blocks. */
#define MAX_KEY_BLOCKS 262144

/* The worker input K of request R goes to: its first consumer's, or the
 * replica of that consumer's model R is pinned to.  With V (the input's
 * value), pin R to one now if it has none, routed by V's bytes (the
 * routing key, common/prefix.h) when the model routes by cache.  -1 for an
 * input nothing reads, or no replica ready. */
static int input_home(frontend *f, const front_request *r, size_t k,
                      const Baton__V1__Tensor *v)
{
    int e = f->input_node[r->graph][k];
    if (e < 0)
        return -1;
    const graph_node *n = &f->gs->graphs[r->graph].entities[e].u.node;
    if (!n->replicated)
        return n->worker;
    int w = replicas_pinned(f->rs, r->key, n->model_index);
    if (w >= 0 || !v)
        return w;
    replicas_key key = {NULL, 0};
    uint64_t *hashes = NULL;
    size_t nb = v->data.len / BT_PREFIX_BYTES;
    if (nb > MAX_KEY_BLOCKS)
        nb = MAX_KEY_BLOCKS;
    /* Out of memory, the pick goes by load: slower, not wrong. */
    if (nb && f->gs->cfg->models[n->model_index].routing == CFG_ROUTE_CACHE_AWARE &&
        (hashes = malloc(nb * sizeof(*hashes)))) {
        bt_prefix_hashes(v->data.data, nb * BT_PREFIX_BYTES, BT_PREFIX_BYTES, hashes, nb);
        key = (replicas_key){hashes, nb};
    }
    w = replicas_pick(f->rs, r->key, n->model_index, key.n ? &key : NULL);
    free(hashes);
    return w;
}

void front_end_placing(frontend *f, int w, bt_code code, const char *message)
{
    uint64_t *keys;
    size_t nk = collect_keys(f, &keys);
    for (size_t i = 0; i < nk; i++) {
        front_request *r = u64map_get(&f->requests, keys[i]);
        if (!r || r->phase != PHASE_PLACING)
            continue;
        const graph *g = &f->gs->graphs[r->graph];
        bool uses = w < 0;
        for (size_t k = 0; k < g->n_inputs && !uses; k++)
            uses = input_home(f, r, k, NULL) == w;
        if (!uses)
            continue;
        /* Inputs placed on a dead worker are gone with it. */
        for (size_t k = 0; w >= 0 && k < g->n_inputs; k++)
            if (r->inputs[k].worker == w)
                r->inputs[k] = (rt_tensor){0, 0};
        end_placing(f, r, code, message);
    }
    free(keys);
}

static void start(frontend *f, front_request *r)
{
    /* Running from here on: the dispatcher may end it before it returns
     * (a node that fails at once), and the response then frees it. */
    set_phase(f, r, PHASE_RUNNING);
    /* A text limit needs every value as it comes: the runtime streams, and
     * the outbound queue keeps them for a client that asked for no stream. */
    int rc = disp_start(f->disp, r->key, r->graph, r->inputs, r->stream || r->out.limit,
                        r->max_iters, &r->params);
    if (rc != 0) {
        set_phase(f, r, PHASE_PLACING);
        end_placing(f, r, bt_err_to_code(rc), bt_strerror(rc));
    }
}

/* An early put: its id is chosen here and the request runs at once (see
 * place_inputs).  The runtime owns the tensor; the worker answers only a
 * failure.  Only W's nodes read it, so its pool offset matters only once
 * one of them passes it on, and that node's Done carries it (tt_add).
 * A failure while another input is still being placed ends the request
 * with the input's entry released like the others' (the worker ignores
 * the Release of an id it never stored). */
static void early_placed(frontend *f, front_request *r, const Baton__V1__Placed *m)
{
    bool ok = !m->status || m->status->code == BATON__V1__CODE__OK;
    if (ok)
        return;
    const char *msg = m->status->message ? m->status->message : "placing failed";
    if (r->phase == PHASE_PLACING) {
        end_placing(f, r, (bt_code)m->status->code, msg);
    } else if (r->phase == PHASE_RUNNING) {
        disp_abort(f->disp, r->key, (bt_code)m->status->code, msg);
    }
}

void front_placed(frontend *f, int w, const Baton__V1__Placed *m)
{
    front_request *r = u64map_get(&f->requests, m->request_key);
    bool ok = !m->status || m->status->code == BATON__V1__CODE__OK;
    size_t k = (size_t)(m->put_id % MAX_GRAPH_INPUTS);
    if (!r && m->ref && m->ref->id >> 63)
        return; /* an early put of a request that ended: the runtime released it */
    if (r && f->input_local[r->graph][k] && r->inputs[k].id >> 63) {
        early_placed(f, r, m);
        return;
    }
    rt_tensor t = {0, 0};
    ctensor *ct = ok && m->ref ? tt_add(f->tt, w, m->ref) : NULL;
    if (ct) {
        t = (rt_tensor){m->ref->id, (int32_t)m->ref->owner};
        ct->chat = r && (int)k == r->chat_input;
        ct->raw = r && r->raw[k];
    }
    if (!r || r->phase != PHASE_PLACING) {
        if (t.id) {
            tt_release(f->tt, t);
            tt_flush(f->tt);
        }
        return;
    }
    r->puts_pending--;
    if (!ok || !t.id) {
        end_placing(f, r, ok ? BT_CODE_INTERNAL : (bt_code)m->status->code,
                    ok ? "an input could not be placed"
                       : (m->status->message ? m->status->message : "placing failed"));
        return;
    }
    r->inputs[k] = t;
    if (r->puts_pending == 0)
        start(f, r);
}

/* Puts input K of request R, given as V, on worker W.  An input read only
 * on W need not wait for Placed: it gets an id now, and the worker handles
 * the Put before any Dispatch that names it (one ZeroMQ pair keeps order);
 * a Put that fails later ends the request then.  False when the request
 * was ended. */
static bool place_input(frontend *f, front_request *r, size_t k, int w,
                        const Baton__V1__Tensor *v)
{
    Baton__V1__Put put = BATON__V1__PUT__INIT;
    put.request_key = r->key;
    put.put_id = r->key * MAX_GRAPH_INPUTS + k;
    /* The fields the door checked, and nothing else: unknown fields of the
     * client's tensor stay at the door. */
    Baton__V1__Tensor value = BATON__V1__TENSOR__INIT;
    value.name = v->name;
    value.dtype = v->dtype;
    value.n_dims = v->n_dims;
    value.dims = v->dims;
    value.data = v->data;
    put.value = &value;
    bool early = f->input_local[r->graph][k];
    if (early) {
        put.tensor_id = (UINT64_C(1) << 63) | ++f->next_put_tensor;
        Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
        ref.owner = (uint32_t)w;
        ref.id = put.tensor_id;
        ref.dtype = v->dtype;
        ref.n_dims = v->n_dims;
        ref.dims = v->dims;
        ref.nbytes = v->data.len;
        ctensor *ct = tt_add(f->tt, w, &ref);
        if (!ct) {
            end_placing(f, r, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
            return false;
        }
        ct->chat = (int)k == r->chat_input;
        ct->raw = r->raw[k];
        r->inputs[k] = (rt_tensor){put.tensor_id, w};
    }
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT;
    m.put = &put;
    if (sup_worker_get(f->sup, w)->state != SUP_READY || sup_send(f->sup, w, &m) < 0) {
        end_placing(f, r, BT_CODE_UNAVAILABLE, "the worker for an input is down");
        return false;
    }
    if (!early)
        r->puts_pending++;
    return true;
}

/* Places every input on the worker of its first consumer, then starts the
 * request when nothing is left to wait for. */
static void place_inputs(frontend *f, front_request *r, const Baton__V1__Tensor **by_input)
{
    const graph *g = &f->gs->graphs[r->graph];
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (f->input_node[r->graph][k] < 0)
            continue;
        int w = input_home(f, r, k, by_input[k]);
        if (w < 0) {
            const graph_node *n = &g->entities[f->input_node[r->graph][k]].u.node;
            char msg[160];
            snprintf(msg, sizeof(msg), "no replica of model '%s' is ready", n->model);
            end_placing(f, r, BT_CODE_UNAVAILABLE, msg);
            return;
        }
        if (!place_input(f, r, k, w, by_input[k]))
            return;
    }
    if (r->puts_pending == 0)
        start(f, r);
}

/* ---- client frames ----------------------------------------------------- */

/* A client frame being answered: who sent it, and its request_id. */
typedef struct frame {
    frontend *f;
    const uint8_t *id;
    size_t idlen;
    const char *rid;              /* "" until the request_id is known good */
} frame;

/* Answers the frame with CODE and a message; the request is not accepted. */
#define REFUSE(fr, code, ...) \
    out_reject((fr)->f->out, (fr)->id, (fr)->idlen, (fr)->rid, (code), __VA_ARGS__)

/* The connections that share max_inflight now: those with requests in
 * flight, and those refused for want of room a moment ago (they are
 * waiting to get in), C among them. */
static size_t sharers(frontend *f, const cl_client *c, uint64_t now)
{
    size_t n = f->clients->busy + (c->inflight == 0);
    size_t k;
    cl_client **v = cl_list(f->clients, &k);
    for (size_t i = 0; i < k; i++)
        n += v[i] != c && !v[i]->inflight && v[i]->refused_ms &&
             v[i]->refused_ms + CL_REFUSED_KEEP_MS >= now;
    free(v);
    return n;
}

/* Admission of the connection's share: its replies read, its own cap,
 * room under max_inflight, and no more than its fair share of it while
 * others want some too (so that one busy connection cannot starve
 * another: when a slot frees, the connection under its share gets it, and
 * the busy one is refused).  False when refused. */
static bool admit_client(frame *dr)
{
    frontend *f = dr->f;
    const front_limits *lim = &f->limits;
    cl_client *c = cl_get(f->clients, dr->id, dr->idlen);
    uint64_t now = bt_now_ms();
    if (!c) {
        REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    if (c->backlog_bytes > lim->client_max_reply_bytes) {
        REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED,
               "this connection has not read %llu bytes of replies, more than "
               "client_max_reply_bytes (%llu): read them before sending more requests",
               (unsigned long long)c->backlog_bytes,
               (unsigned long long)lim->client_max_reply_bytes);
        return false;
    }
    if (c->inflight >= lim->client_max_inflight) {
        REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED,
               "this connection has %u requests in flight, the limit per connection "
               "(client_max_inflight)", c->inflight);
        return false;
    }
    if (f->requests.n >= lim->max_inflight) {
        c->refused_ms = now;
        REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED,
               "%u requests are in flight, the limit (max_inflight)", lim->max_inflight);
        return false;
    }
    /* The share matters only when the slots run short. */
    if (f->requests.n * 2 >= lim->max_inflight) {
        size_t n = sharers(f, c, now);
        size_t share = (lim->max_inflight + n - 1) / n;
        if (c->inflight >= share) {
            c->refused_ms = now;
            REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED,
                   "this connection has %u requests in flight, its share of max_inflight (%u) "
                   "while %zu connections want it", c->inflight, lim->max_inflight, n);
            return false;
        }
    }
    return true;
}

/* Admission: not a duplicate on this connection, the daemon open, room
 * under max_inflight and within the connection's share.  False when
 * refused. */
static bool admit(frame *dr)
{
    frontend *f = dr->f;
    if (find_request(f, dr->id, dr->idlen, dr->rid)) {
        REFUSE(dr, BT_CODE_ALREADY_EXISTS,
               "request '%s' is already in flight on this connection", dr->rid);
        return false;
    }
    if (f->admission == FRONT_DRAINING) {
        REFUSE(dr, BT_CODE_UNAVAILABLE, "the daemon is shutting down");
        return false;
    }
    if (f->admission == FRONT_NOT_READY) {
        REFUSE(dr, BT_CODE_UNAVAILABLE,
               "not ready: waiting for workers to register and load their models");
        return false;
    }
    return admit_client(dr);
}

/* A new request in the tables with its deadline, taking CAPS.  NULL (and
 * refused) when out of memory. */
static front_request *request_create(frame *dr, const graph *g, const Baton__V1__InferRequest *q,
                                     uint32_t *caps)
{
    frontend *f = dr->f;
    front_request *r = calloc(1, sizeof(*r));
    if (!r || !(r->identity = malloc(dr->idlen ? dr->idlen : 1)) ||
        !(r->request_id = strdup(dr->rid)) ||
        !(r->inputs = calloc(g->n_inputs + 1, sizeof(*r->inputs))))
        goto err;
    memcpy(r->identity, dr->id, dr->idlen);
    r->identity_len = dr->idlen;
    r->key = ++f->next_key;
    r->hkey = hash_client(dr->id, dr->idlen, dr->rid);
    r->graph = (int)g->index;
    r->chat_input = -1;
    r->stream = q->stream;
    r->start_us = bt_now_us();
    /* Clamped: a request holds its slot until its deadline at worst. */
    uint32_t timeout = q->timeout_ms ? q->timeout_ms : f->limits.request_timeout_ms;
    if (timeout > f->limits.max_request_timeout_ms)
        timeout = f->limits.max_request_timeout_ms;
    r->deadline_ms = bt_now_ms() + timeout;
    r->params.request_id = r->request_id;
    r->params.deadline_ms = r->deadline_ms;
    if (q->sampling) {
        r->params.temperature = q->sampling->temperature;
        r->params.top_k = q->sampling->top_k;
        r->params.top_p = q->sampling->top_p;
        r->params.seed = q->sampling->seed;
    }
    /* Seed 0 asks for a fresh one: sampling then differs from run to run,
     * and the response reports the seed drawn so that a run can be
     * repeated. */
    if (r->params.seed == 0) {
        f->seed_state += UINT64_C(0x9E3779B97F4A7C15);
        r->params.seed = u64map_mix(f->seed_state);
        if (r->params.seed == 0)
            r->params.seed = 1;
    }
    r->hnext = u64map_get(&f->by_client, r->hkey);
    if (u64map_put(&f->requests, r->key, r) < 0)
        goto err;
    if (u64map_put(&f->by_client, r->hkey, r) < 0) {
        u64map_del(&f->requests, r->key);
        goto err;
    }
    r->max_iters = caps;
    f->n_placing++; /* PHASE_PLACING is 0 */
    /* admit_client made the record; it lives while a request counts in it. */
    cl_client *c = cl_get(f->clients, dr->id, dr->idlen);
    if ((r->counted = c != NULL))
        cl_inflight_add(f->clients, c);
    /* Lazy deletion: an entry of a request that ended is skipped when due;
     * one that cannot be added only costs the deadline, never the request. */
    if (dl_push(&f->deadlines, r->deadline_ms, r->key) < 0)
        bt_warn("out of memory: request '%s' has no deadline", r->request_id);
    return r;
err:
    if (r) {
        free(r->inputs);
        free(r->identity);
        free(r->request_id);
        free(r);
    }
    free(caps);
    REFUSE(dr, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
}

static void handle_infer(frame *dr, const Baton__V1__InferRequest *q)
{
    char why[512];
    door_pass p;
    bt_code code = door_check_infer(dr->f->gs, q, &p, why, sizeof(why));
    dr->rid = p.request_id;
    if (code != BT_CODE_OK) {
        REFUSE(dr, code, "%s", why);
    } else if (admit(dr)) {
        front_request *r = request_create(dr, p.g, q, p.caps);
        p.caps = NULL; /* the request's now, or freed */
        if (r) {
            r->chat_input = p.chat_input;
            r->raw = p.raw;
            p.raw = NULL;
            int rc = p.text_output ? out_queue_limit(&r->out, p.g, p.text_output,
                                                     (const char *const *)q->stop, q->n_stop,
                                                     q->max_tokens, q->stream)
                                   : 0;
            if (rc != 0)
                end_placing(dr->f, r, bt_err_to_code(rc), bt_strerror(rc));
            else
                place_inputs(dr->f, r, p.by_input);
        }
    }
    door_pass_free(&p);
}

/* Answers a cancel: whether it found a request to end. */
static void cancel_answer(frame *dr, const char *rid, bt_code code, const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)message;
    Baton__V1__CancelResponse cr = BATON__V1__CANCEL_RESPONSE__INIT;
    cr.request_id = (char *)rid;
    cr.status = &st;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CANCEL;
    m.cancel = &cr;
    out_send(dr->f->out, dr->id, dr->idlen, &m);
}

static void handle_cancel(frame *dr, const Baton__V1__CancelRequest *q)
{
    frontend *f = dr->f;
    const char *rid = q->request_id ? q->request_id : "";
    char msg[384];
    front_request *r = find_request(f, dr->id, dr->idlen, rid);
    bool ambiguous = false;
    if (!r)
        r = find_unique(f, rid, &ambiguous);
    /* The answer goes first: the request's own end may be sent to this
     * same connection while it is being ended. */
    if (!r || r->phase == PHASE_FLUSHING) {
        bool valid = bt_utf8_valid(rid, strlen(rid));
        snprintf(msg, sizeof(msg), ambiguous ? "request '%.*s' is in flight on several "
                 "connections; cancel it from the one that sent it"
                 : "no request '%.*s' is in flight (unknown, or already ended)",
                 valid ? bt_utf8_prefix(rid, 256) : 11, valid ? rid : "(not UTF-8)");
        cancel_answer(dr, rid, ambiguous ? BT_CODE_FAILED_PRECONDITION : BT_CODE_NOT_FOUND, msg);
        return;
    }
    cancel_answer(dr, rid, BT_CODE_OK, "");
    if (r->phase == PHASE_PLACING)
        end_placing(f, r, BT_CODE_CANCELLED, "cancelled by the client");
    else if (r->phase == PHASE_RUNNING)
        disp_cancel(f->disp, r->key);
}

static void handle_message(frame *dr, const Baton__V1__ClientMessage *cm)
{
    frontend *f = dr->f;
    switch (cm->msg_case) {
    case BATON__V1__CLIENT_MESSAGE__MSG_INFER:
        handle_infer(dr, cm->infer);
        break;
    case BATON__V1__CLIENT_MESSAGE__MSG_CANCEL:
        handle_cancel(dr, cm->cancel);
        break;
    case BATON__V1__CLIENT_MESSAGE__MSG_HEALTH:
    case BATON__V1__CLIENT_MESSAGE__MSG_STATS:
    case BATON__V1__CLIENT_MESSAGE__MSG_INSPECT:
        f->hooks.admin(f->hooks.arg, dr->id, dr->idlen, cm);
        break;
    default:
        REFUSE(dr, BT_CODE_INVALID_ARGUMENT, "the ClientMessage has nothing set");
        break;
    }
}

/* Answers a frame that parsed but failed door_check_wire, in the kind of
 * answer its message expects, under its request_id unless that is among
 * the bad strings (or too long to be one). */
static void refuse_wire(frame *dr, const Baton__V1__ClientMessage *cm, bool id_bad,
                        const char *why)
{
    const char *rid = "";
    if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_INFER && cm->infer->request_id)
        rid = cm->infer->request_id;
    else if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_CANCEL && cm->cancel->request_id)
        rid = cm->cancel->request_id;
    if (id_bad || strlen(rid) > DOOR_REQUEST_ID_MAX)
        rid = "";
    if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_CANCEL) {
        cancel_answer(dr, rid, BT_CODE_INVALID_ARGUMENT, why);
        return;
    }
    dr->rid = rid;
    REFUSE(dr, BT_CODE_INVALID_ARGUMENT, "%s", why);
}

/* Checks the size of one frame, parses it and handles it. */
static void handle_frame(frontend *f, zmq_msg_t *ident, zmq_msg_t *part, int frames)
{
    frame dr = {f, zmq_msg_data(ident), zmq_msg_size(ident), ""};
    size_t n = zmq_msg_size(part);
    if (frames == 0) {
        REFUSE(&dr, BT_CODE_INVALID_ARGUMENT, "empty message");
        return;
    }
    if (n > f->limits.max_message_bytes) {
        REFUSE(&dr, BT_CODE_RESOURCE_EXHAUSTED,
               "message of %zu bytes exceeds max_message_bytes (%llu)", n,
               (unsigned long long)f->limits.max_message_bytes);
        return;
    }
    Baton__V1__ClientMessage *cm = baton__v1__client_message__unpack(NULL, n, zmq_msg_data(part));
    char why[384];
    bool id_bad = false;
    if (!cm)
        REFUSE(&dr, BT_CODE_INVALID_ARGUMENT,
               "the frame does not parse as a ClientMessage (%zu bytes)", n);
    else if (door_check_wire(zmq_msg_data(part), n, &id_bad, why, sizeof(why)) != BT_CODE_OK)
        refuse_wire(&dr, cm, id_bad, why);
    else
        handle_message(&dr, cm);
    baton__v1__client_message__free_unpacked(cm, NULL);
}

void front_on_readable(evloop *l, void *arg)
{
    (void)l;
    frontend *f = arg;
    for (int budget = 0; budget < 256; budget++) {
        zmq_msg_t ident, part;
        zmq_msg_init(&ident);
        if (zmq_msg_recv(&ident, f->socket, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ident);
            return;
        }
        /* The payload is the last frame; a client that sends several
         * (a REQ socket's empty delimiter, say) is read to the end. */
        zmq_msg_init(&part);
        int more = zmq_msg_more(&ident), frames = 0;
        while (more) {
            zmq_msg_close(&part);
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, f->socket, 0) < 0)
                break;
            frames++;
            more = zmq_msg_more(&part);
        }
        handle_frame(f, &ident, &part, frames);
        zmq_msg_close(&part);
        zmq_msg_close(&ident);
    }
}

/* ---- deadlines and the end --------------------------------------------- */

static bool deadline_live(void *arg, uint64_t key, uint64_t at_ms)
{
    front_request *r = u64map_get(&((frontend *)arg)->requests, key);
    return r && r->deadline_ms == at_ms;
}

/* Drops client C, which left its replies unread too long or too many: its
 * requests are cancelled and answer nothing, its backlog goes. */
static void drop_client(frontend *f, cl_client *c, uint64_t now_ms)
{
    bt_warn("dropping a client connection: %llu bytes of replies unread for %llu ms "
            "(client_max_reply_bytes %llu, client_stall_timeout_ms %u); cancelling its %u "
            "requests", (unsigned long long)c->backlog_bytes,
            (unsigned long long)(now_ms - c->stalled_since_ms),
            (unsigned long long)f->limits.client_max_reply_bytes,
            f->limits.client_stall_timeout_ms, c->inflight);
    uint64_t *keys;
    size_t nk = collect_keys(f, &keys);
    uint64_t *mine = malloc((nk + 1) * sizeof(*mine));
    size_t n = 0;
    for (size_t i = 0; mine && i < nk; i++) {
        front_request *r = u64map_get(&f->requests, keys[i]);
        if (r && !r->discard && r->identity_len == c->identity_len &&
            memcmp(r->identity, c->identity, c->identity_len) == 0) {
            r->discard = true;
            mine[n++] = keys[i];
        }
    }
    free(keys);
    out_drop_client(f->out, c);
    for (size_t i = 0; i < n; i++) {
        front_request *r = u64map_get(&f->requests, mine[i]);
        if (!r)
            continue;
        if (r->phase == PHASE_PLACING)
            end_placing(f, r, BT_CODE_CANCELLED, "the client was dropped");
        else if (r->phase == PHASE_RUNNING)
            disp_cancel(f->disp, r->key);
        else
            request_free(f, r);
    }
    free(mine);
}

/* Clients whose backlog made no progress for client_stall_timeout_ms, or
 * grew past twice client_max_reply_bytes (refusals of a client that sends
 * and never reads), are dropped. */
static void check_clients(frontend *f, uint64_t now_ms)
{
    if (!f->clients->backlog_bytes)
        return;
    size_t n;
    cl_client **v = cl_list(f->clients, &n);
    for (size_t i = 0; i < n; i++) {
        cl_client *c = v[i];
        if (c->n_backlog && (now_ms - c->stalled_since_ms >= f->limits.client_stall_timeout_ms ||
                             c->backlog_bytes > 2 * f->limits.client_max_reply_bytes))
            drop_client(f, c, now_ms);
    }
    free(v);
}

void front_tick(frontend *f, uint64_t now_ms)
{
    out_tick(f->out, now_ms);
    check_clients(f, now_ms);
    dl_compact(&f->deadlines, f->requests.n, deadline_live, f);
    dl_entry e;
    while (dl_pop_due(&f->deadlines, now_ms, &e)) {
        front_request *r = u64map_get(&f->requests, e.key);
        if (!r || r->deadline_ms != e.at_ms)
            continue;
        if (r->phase == PHASE_PLACING)
            end_placing(f, r, BT_CODE_DEADLINE_EXCEEDED, "deadline exceeded");
        else if (r->phase == PHASE_RUNNING)
            disp_deadline(f->disp, r->key);
    }
}

uint64_t front_next_deadline_ms(const frontend *f)
{
    return dl_next(&f->deadlines);
}

void front_end_all(frontend *f, bt_code code, const char *message)
{
    front_end_placing(f, -1, code, message);
    disp_end_all(f->disp, code, message);
    /* Messages still waiting for fetched bytes go out as they are. */
    for (size_t w = 0; w < sup_n_workers(f->sup); w++)
        front_fetches_lost(f, (int)w);
}

void front_set_limits(frontend *f, const front_limits *limits)
{
    f->limits = *limits;
}

void front_set_admission(frontend *f, front_admission a)
{
    f->admission = a;
}

/* ---- create / destroy -------------------------------------------------- */

/* Where node N runs, as far as the graph tells: its worker, or for a
 * replicated node its model (as -2 - model): every node of one replicated
 * model runs on the replica its request picked. */
static int placement_of(const graph_node *n)
{
    return n->replicated ? -2 - n->model_index : n->worker;
}

/* Per graph input: the entity of its first consumer, and whether every
 * consumer reads it where that one runs (then nobody needs its pool
 * offset: a Dispatch names it by the id the Put gave it). */
static void input_placement(const graph *g, size_t k, int *node, uint8_t *local)
{
    *node = -1;
    *local = 0;
    for (size_t e = 0; e < g->n_entities; e++) {
        const graph_entity *en = &g->entities[e];
        if (en->kind != GRAPH_NODE || en->u.node.worker < 0)
            continue;
        for (size_t x = 0; x < en->u.node.n_inputs; x++) {
            if (en->u.node.inputs[x].graph_input != (int)k)
                continue;
            if (*node < 0) {
                *node = (int)e;
                *local = 1;
            } else if (placement_of(&en->u.node) != placement_of(&g->entities[*node].u.node)) {
                *local = 0;
            }
        }
    }
}

int front_create(const front_options *opt, const front_hooks *hooks, frontend **out)
{
    *out = NULL;
    frontend *f = calloc(1, sizeof(*f));
    if (!f)
        return BT_ENOMEM;
    if (getrandom(&f->seed_state, sizeof(f->seed_state), GRND_NONBLOCK) !=
        (ssize_t)sizeof(f->seed_state))
        f->seed_state = bt_now_us() * UINT64_C(0x9E3779B97F4A7C15);
    f->gs = opt->gs;
    f->socket = opt->socket;
    f->out = opt->out;
    f->sup = opt->sup;
    f->tt = opt->tt;
    f->disp = opt->disp;
    f->rs = opt->rs;
    f->limits = opt->limits;
    f->hooks = *hooks;
    f->clients = out_clients(opt->out);
    u64map_init(&f->requests);
    u64map_init(&f->by_client);
    dl_init(&f->deadlines);
    size_t ng = f->gs->n_graphs;
    f->input_node = calloc(ng + 1, sizeof(*f->input_node));
    f->input_local = calloc(ng + 1, sizeof(*f->input_local));
    if (!f->input_node || !f->input_local)
        goto err;
    for (size_t g = 0; g < ng; g++) {
        const graph *gr = &f->gs->graphs[g];
        f->input_node[g] = malloc((gr->n_inputs + 1) * sizeof(int));
        f->input_local[g] = calloc(gr->n_inputs + 1, 1);
        if (!f->input_node[g] || !f->input_local[g])
            goto err;
        for (size_t k = 0; k < gr->n_inputs; k++)
            input_placement(gr, k, &f->input_node[g][k], &f->input_local[g][k]);
    }
    *out = f;
    return 0;
err:
    front_destroy(f);
    return BT_ENOMEM;
}

void front_destroy(frontend *f)
{
    if (!f)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    /* Freeing a request removes it from the map: restart the scan. */
    while (u64map_next(&f->requests, &pos, &key, &val)) {
        request_free(f, val);
        pos = 0;
    }
    u64map_free(&f->requests);
    u64map_free(&f->by_client);
    dl_free(&f->deadlines);
    for (size_t g = 0; f->input_node && g < f->gs->n_graphs; g++)
        free(f->input_node[g]);
    for (size_t g = 0; f->input_local && g < f->gs->n_graphs; g++)
        free(f->input_local[g]);
    free(f->input_node);
    free(f->input_local);
    free(f);
}
