/* Dispatch: runtime actions to worker messages, worker results to runtime
 * events (daemon/dispatch.h). */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/u64map.h"
#include "common/vec.h"
#include "daemon/dispatch.h"

#define MAX_TIMINGS 100000 /* per request: a runaway loop must not grow it forever */

/* What a running request carries besides its graph state. */
typedef struct disp_request {
    disp_params p;                /* p.request_id owned */
    disp_timing *timings;         /* owned, in arrival order */
    size_t n_timings, cap_timings;
} disp_request;

/* An Extend held until the burst of worker messages is read. */
typedef struct pending_extend {
    uint64_t req;
    int graph, node;
    uint32_t upto;
} pending_extend;

/* A request whose response went out in this batch: its sessions close
 * once the batch's other messages have gone. */
typedef struct ended_request {
    uint64_t req;
    int graph;
} ended_request;

struct dispatcher {
    const graph_set *gs;          /* borrowed */
    supervisor *sup;              /* borrowed */
    replicas *rs;                 /* borrowed */
    tensor_table *tt;             /* borrowed */
    metrics *m;                   /* borrowed */
    disp_hooks hooks;
    rt_runtime *rt;               /* owned */
    u64map requests;              /* request key -> disp_request (owned) */
    uint64_t next_dispatch;       /* Dispatch ids, for the workers' logs */
    bool in_burst;                /* reading worker messages: batch Releases and Extends */
    bool acting;                  /* in run_actions: a hook's event queues more actions */
    pending_extend *extends;      /* see extend_later */
    size_t n_extends, cap_extends;
    ended_request *ended;         /* see run_actions */
    size_t n_ended, cap_ended;
};

static void request_free(disp_request *r)
{
    if (!r)
        return;
    free((char *)r->p.request_id);
    free(r->timings);
    free(r);
}

int disp_create(const graph_set *gs, uint32_t speculation_window, supervisor *sup,
                replicas *rs, tensor_table *tt, metrics *m, const disp_hooks *hooks,
                dispatcher **out)
{
    *out = NULL;
    dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return BT_ENOMEM;
    d->gs = gs;
    d->sup = sup;
    d->rs = rs;
    d->tt = tt;
    d->m = m;
    d->hooks = *hooks;
    u64map_init(&d->requests);
    rt_options ro = {.speculation_window = speculation_window};
    d->rt = rt_create(gs, &ro);
    if (!d->rt) {
        disp_destroy(d);
        return BT_ENOMEM;
    }
    *out = d;
    return 0;
}

void disp_destroy(dispatcher *d)
{
    if (!d)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&d->requests, &pos, &key, &val))
        request_free(val);
    u64map_free(&d->requests);
    rt_destroy(d->rt);
    free(d->extends);
    free(d->ended);
    free(d);
}

size_t disp_tensors_held(const dispatcher *d)
{
    return rt_tensors_held(d->rt);
}

/* ---- runtime actions --------------------------------------------------- */

/* The arrays a Dispatch message points into, built for one action. */
typedef struct dispatch_msg {
    Baton__V1__InputValue *ins, **insp;   /* per node input */
    Baton__V1__TensorPart *parts, **partp; /* per fan-in part */
    Baton__V1__TensorRef *refs, **refp;   /* per chunk */
    Baton__V1__OutputSpec *outs, **outp;  /* per node value */
    Baton__V1__LoopBack *lbs, **lbp;      /* per loop-back input */
    size_t n_lb;
    size_t n_parts;                       /* parts filled */
} dispatch_msg;

static void dispatch_msg_free(dispatch_msg *m)
{
    free(m->ins);
    free(m->insp);
    free(m->parts);
    free(m->partp);
    free(m->refs);
    free(m->refp);
    free(m->outs);
    free(m->outp);
    free(m->lbs);
    free(m->lbp);
}

/* Room for action A on node N (with EN's values); false when out of memory. */
static bool dispatch_msg_alloc(dispatch_msg *m, const rt_action *a, const graph_entity *en)
{
    const graph_node *n = &en->u.node;
    size_t n_refs = 0, n_parts = 0;
    for (uint32_t k = 0; k < a->u.dispatch.n_inputs; k++) {
        n_parts += a->u.dispatch.inputs[k].n_parts;
        for (uint32_t p = 0; p < a->u.dispatch.inputs[k].n_parts; p++)
            n_refs += a->u.dispatch.inputs[k].parts[p].n;
    }
    memset(m, 0, sizeof(*m));
    m->ins = calloc(n->n_inputs + 1, sizeof(*m->ins));
    m->insp = calloc(n->n_inputs + 1, sizeof(*m->insp));
    m->parts = calloc(n_parts + 1, sizeof(*m->parts));
    m->partp = calloc(n_parts + 1, sizeof(*m->partp));
    m->refs = calloc(n_refs + 1, sizeof(*m->refs));
    m->refp = calloc(n_refs + 1, sizeof(*m->refp));
    m->outs = calloc(en->n_values + 1, sizeof(*m->outs));
    m->outp = calloc(en->n_values + 1, sizeof(*m->outp));
    m->lbs = calloc(n->n_inputs + 1, sizeof(*m->lbs));
    m->lbp = calloc(n->n_inputs + 1, sizeof(*m->lbp));
    return m->ins && m->insp && m->parts && m->partp && m->refs && m->refp && m->outs &&
           m->outp && m->lbs && m->lbp;
}

/* How a tensor of worker FROM reaches worker TO, decided from the hosts
 * both registered from: the own pool; read in place on the same host
 * (shared memory, CUDA IPC); between GPUs of different hosts, NCCL send and
 * receive; between CPUs of different hosts, a pull over the producer's
 * peer socket.  A transfer that cannot be made returns
 * TRANSFER_KIND_UNSPECIFIED with *CODE and WHY. */
Baton__V1__TransferKind disp_transfer_kind(const supervisor *sup, int from, int to, int *code,
                                           char *why, size_t whylen)
{
    if (from == to)
        return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
    const sup_worker *a = sup_worker_get(sup, from), *b = sup_worker_get(sup, to);
    /* A worker not registered has no host yet; its tensors are gone or
     * not made, and the same-host path reports that well enough. */
    if (!a->hostname[0] || !b->hostname[0] || strcmp(a->hostname, b->hostname) == 0)
        return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC;
    *code = BT_CODE_FAILED_PRECONDITION;
    bool ga = a->cfg->cuda_index >= 0, gb = b->cfg->cuda_index >= 0;
    if (ga && gb)
        return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL;
    if (ga || gb) {
        snprintf(why, whylen, "worker %s (host %s) feeds worker %s (host %s), a GPU and a CPU "
                 "worker on different hosts: that transfer is not built (GPU to GPU goes over "
                 "NCCL, CPU to CPU over peer sockets)", a->cfg->name, a->hostname,
                 b->cfg->name, b->hostname);
        return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED;
    }
    if (!a->peer_endpoint[0]) {
        snprintf(why, whylen, "worker %s (host %s) holds an input of worker %s (host %s) but "
                 "has no peer endpoint: set 'peer_listen' in its entry under workers:",
                 a->cfg->name, a->hostname, b->cfg->name, b->hostname);
        return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED;
    }
    return BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET;
}

/* After the Dispatch of M went to worker W: each chunk of its NCCL parts is
 * sent by its owner, one Send per chunk, numbered as the part says.  They go
 * right after the Dispatch, before anything else is numbered on the pair,
 * so both workers see the pair's transfers in the same order. */
static void send_nccl_parts(dispatcher *d, const dispatch_msg *m, int w, uint32_t remaining_ms)
{
    for (size_t p = 0; p < m->n_parts; p++) {
        const Baton__V1__TensorPart *tp = &m->parts[p];
        if (tp->transfer != BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL)
            continue;
        for (size_t x = 0; x < tp->n_chunks; x++) {
            Baton__V1__Send s = BATON__V1__SEND__INIT;
            s.peer = (uint32_t)w;
            s.epoch = tp->nccl_epoch;
            s.seq = tp->nccl_seq + x;
            s.ref = tp->chunks[x];
            s.remaining_ms = remaining_ms;
            Baton__V1__ConductorMessage cm = BATON__V1__CONDUCTOR_MESSAGE__INIT;
            cm.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SEND;
            cm.send = &s;
            int owner = (int)s.ref->owner;
            /* One that cannot go leaves the consumer's receive waiting until
             * the owner is seen lost or the request's deadline passes: both
             * abort the pair's communicator, which fails the node. */
            if (sup_worker_get(d->sup, owner)->state != SUP_READY ||
                sup_send(d->sup, owner, &cm) < 0)
                bt_warn("Send %llu of a tensor to worker %s could not go to its owner",
                        (unsigned long long)s.seq, sup_worker_get(d->sup, w)->cfg->name);
        }
    }
}

/* The inputs: per input its fan-in parts, per part its chunks as tensor
 * references and how they reach worker W (local, IPC, NCCL or a pull).  0, or a status code with the
 * reason in WHY. */
static int fill_inputs(dispatcher *d, dispatch_msg *m, const rt_action *a, const graph_node *n,
                       int w, char *why, size_t whylen)
{
    size_t pi = 0, ri = 0;
    for (uint32_t k = 0; k < a->u.dispatch.n_inputs; k++) {
        const rt_input *in = &a->u.dispatch.inputs[k];
        Baton__V1__InputValue *iv = &m->ins[k];
        baton__v1__input_value__init(iv);
        iv->name = (char *)n->inputs[in->input].name;
        iv->shard_dim = in->shard_dim;
        iv->stream = in->stream;
        iv->final = in->stream ? in->stream_final : true;
        iv->parts = &m->partp[pi];
        for (uint32_t p = 0; p < in->n_parts; p++) {
            Baton__V1__TensorPart *tp = &m->parts[pi];
            baton__v1__tensor_part__init(tp);
            tp->chunks = &m->refp[ri];
            int owner = -1;
            for (uint32_t x = 0; x < in->parts[p].n; x++) {
                const ctensor *ct = tt_find(d->tt, in->parts[p].t[x]);
                if (!ct) {
                    snprintf(why, whylen, "a dispatch names a tensor the conductor does not "
                             "know");
                    return BT_CODE_UNAVAILABLE;
                }
                tt_fill_ref(ct, &m->refs[ri]);
                iv->chat |= ct->chat;
                iv->raw |= ct->raw;
                m->refp[ri] = &m->refs[ri];
                ri++;
                tp->n_chunks++;
                int code = BT_CODE_UNAVAILABLE;
                char reason[384];
                Baton__V1__TransferKind kind = disp_transfer_kind(d->sup, ct->t.worker, w, &code,
                                                                  reason, sizeof(reason));
                if (kind == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED) {
                    snprintf(why, whylen, "input '%s': %s", iv->name, reason);
                    return code;
                }
                /* One kind per part: its chunks are numbered, pulled or
                 * mapped together. */
                if (tp->n_chunks > 1 && kind != tp->transfer) {
                    snprintf(why, whylen, "input '%s': the chunks of one part would reach "
                             "worker %s in different ways", iv->name,
                             sup_worker_get(d->sup, w)->cfg->name);
                    return BT_CODE_FAILED_PRECONDITION;
                }
                if (kind == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL && owner >= 0 &&
                    owner != ct->t.worker) {
                    snprintf(why, whylen, "input '%s': the chunks of one part come from several "
                             "GPU workers of other hosts", iv->name);
                    return BT_CODE_FAILED_PRECONDITION;
                }
                owner = ct->t.worker;
                tp->transfer = kind;
            }
            if (tp->transfer == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL &&
                !sup_pair_reserve(d->sup, owner, w, (uint32_t)tp->n_chunks, &tp->nccl_epoch,
                                  &tp->nccl_seq)) {
                snprintf(why, whylen, "input '%s': no NCCL communicator between the producer's "
                         "worker and this one (not formed yet, or lost)", iv->name);
                return BT_CODE_UNAVAILABLE;
            }
            m->partp[pi++] = tp;
            m->n_parts = pi;
            iv->n_parts++;
        }
        m->insp[k] = iv;
    }
    return 0;
}

/* The outputs: which go to the client (inline when small) and which
 * stream. */
static void fill_outputs(dispatch_msg *m, const rt_action *a, const graph *g,
                         const graph_entity *en)
{
    const uint8_t *client = a->u.dispatch.client_values;
    for (size_t k = 0; k < en->n_values; k++) {
        const graph_value *v = &g->values[en->values[k]];
        baton__v1__output_spec__init(&m->outs[k]);
        m->outs[k].name = (char *)v->name;
        m->outs[k].client = client && client[en->values[k]];
        for (size_t e = 0; e < v->n_edges; e++)
            m->outs[k].stream |= g->edges[v->edges[e]].stream;
        m->outp[k] = &m->outs[k];
    }
}

/* A node that runs ahead feeds its own loop-back outputs to itself: which
 * output becomes which input. */
static void fill_loop_backs(dispatch_msg *m, const rt_action *a, const graph *g,
                            const graph_node *n)
{
    if (!a->u.dispatch.spec_upto)
        return;
    for (size_t k = 0; k < n->n_inputs; k++)
        for (size_t x = 0; x < n->inputs[k].n_edges; x++) {
            const graph_edge *e = &g->edges[n->inputs[k].edges[x]];
            if (!e->loopback || e->producer != a->u.dispatch.node)
                continue;
            Baton__V1__LoopBack *lb = &m->lbs[m->n_lb];
            baton__v1__loop_back__init(lb);
            lb->output = (char *)g->values[e->value].name;
            lb->input = (char *)n->inputs[k].name;
            m->lbp[m->n_lb++] = lb;
        }
}

/* The worker node N of request REQ runs on: its own, or the replica of its
 * model the request is pinned to.  PICK: pin the request to one now if it
 * has none (a Dispatch); else -1 (an Extend or a Drop follows a Dispatch,
 * so the pin is there unless the request was ended). */
static int node_worker(dispatcher *d, uint64_t req, const graph_node *n, bool pick)
{
    if (!n->replicated)
        return n->worker;
    return pick ? replicas_pick(d->rs, req, n->model_index, NULL)
                : replicas_pinned(d->rs, req, n->model_index);
}

/* Sends the Dispatch of action A to its node's worker; a dispatch that
 * cannot go fails its node (UNAVAILABLE), which ends the request. */
static void send_dispatch(dispatcher *dp, const rt_action *a)
{
    const disp_request *r = u64map_get(&dp->requests, a->req);
    const graph *g = &dp->gs->graphs[a->graph];
    const graph_entity *en = &g->entities[a->u.dispatch.node];
    const graph_node *n = &en->u.node;
    int w = node_worker(dp, a->req, n, true);
    dispatch_msg m;
    char why[512] = "";
    int code = BT_CODE_UNAVAILABLE;
    if (!dispatch_msg_alloc(&m, a, en))
        snprintf(why, sizeof(why), "out of memory building a dispatch");
    else
        code = fill_inputs(dp, &m, a, n, w, why, sizeof(why));
    const char *fail = why[0] ? why : NULL;
    if (!fail) {
        fill_outputs(&m, a, g, en);
        fill_loop_backs(&m, a, g, n);
        uint32_t iter[GRAPH_MAX_DEPTH];
        for (uint32_t k = 0; k < a->u.dispatch.iter.depth; k++)
            iter[k] = a->u.dispatch.iter.v[k];
        Baton__V1__Sampling samp = BATON__V1__SAMPLING__INIT;
        Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
        d.request_key = a->req;
        d.request_id = (char *)(r ? r->p.request_id : "");
        d.graph = (uint32_t)a->graph;
        d.node = (uint32_t)a->u.dispatch.node;
        d.node_name = (char *)en->name;
        d.model = (char *)n->model;
        d.mode = (char *)n->mode;
        d.n_iteration = a->u.dispatch.iter.depth;
        d.iteration = iter;
        d.n_inputs = a->u.dispatch.n_inputs;
        d.inputs = m.insp;
        d.n_outputs = en->n_values;
        d.outputs = m.outp;
        d.speculate_upto = a->u.dispatch.spec_upto;
        if (r) {
            samp.temperature = r->p.temperature;
            samp.top_k = r->p.top_k;
            samp.top_p = r->p.top_p;
            samp.seed = r->p.seed;
            uint64_t now = bt_now_ms();
            d.remaining_ms = r->p.deadline_ms > now ? (uint32_t)(r->p.deadline_ms - now) : 1;
        }
        d.sampling = &samp;
        d.dispatch_id = ++dp->next_dispatch;
        d.n_loop_back = m.n_lb;
        d.loop_back = m.lbp;
        Baton__V1__ConductorMessage cm = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        cm.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
        cm.dispatch = &d;
        if (w < 0 || sup_worker_get(dp->sup, w)->state != SUP_READY ||
            sup_send(dp->sup, w, &cm) < 0) {
            fail = n->replicated && w < 0 ? "no replica of its model is ready"
                                          : "its worker is not available";
            code = BT_CODE_UNAVAILABLE;
        } else {
            send_nccl_parts(dp, &m, w, d.remaining_ms);
        }
    }
    if (fail) {
        char msg[768];
        snprintf(msg, sizeof(msg), "%s (worker %s)", fail,
                 w >= 0 ? sup_worker_get(dp->sup, w)->cfg->name : "?");
        rt_node_failed(dp->rt, a->req, a->u.dispatch.node, &a->u.dispatch.iter,
                       code ? (bt_code)code : BT_CODE_UNAVAILABLE, msg);
    }
    dispatch_msg_free(&m);
}

/* Extends wait here until the burst of worker messages that caused them is
 * read: a worker that ran ahead reports several iterations at once, and one
 * Extend to the furthest of them unblocks it as well as one per iteration. */
static void extend_later(dispatcher *d, const rt_action *a)
{
    for (size_t i = 0; i < d->n_extends; i++) {
        pending_extend *p = &d->extends[i];
        if (p->req == a->req && p->node == a->u.extend.node) {
            if (a->u.extend.upto > p->upto)
                p->upto = a->u.extend.upto;
            return;
        }
    }
    if (BT_RESERVE(d->extends, d->n_extends, d->cap_extends, 16) < 0)
        return; /* the worker waits for the next one: slower, not wrong */
    d->extends[d->n_extends++] = (pending_extend){a->req, a->graph, a->u.extend.node,
                                                  a->u.extend.upto};
}

/* Forgets the pending Extend of (req, node): a Drop or a new Dispatch
 * supersedes it, and an Extend after a Drop would reopen a closed window. */
static void extend_forget(dispatcher *d, uint64_t req, int node)
{
    for (size_t i = 0; i < d->n_extends; i++)
        if (d->extends[i].req == req && (node < 0 || d->extends[i].node == node))
            d->extends[i--] = d->extends[--d->n_extends];
}

static void flush_extends(dispatcher *d)
{
    for (size_t i = 0; i < d->n_extends; i++) {
        const pending_extend *p = &d->extends[i];
        if (!u64map_get(&d->requests, p->req))
            continue;
        int w = node_worker(d, p->req, &d->gs->graphs[p->graph].entities[p->node].u.node,
                            false);
        Baton__V1__Extend ex = BATON__V1__EXTEND__INIT;
        ex.request_key = p->req;
        ex.graph = (uint32_t)p->graph;
        ex.node = (uint32_t)p->node;
        ex.upto = p->upto;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND;
        m.extend = &ex;
        if (w >= 0 && sup_worker_get(d->sup, w)->state == SUP_READY)
            sup_send(d->sup, w, &m);
    }
    d->n_extends = 0;
}

static void send_window(dispatcher *d, const rt_action *a)
{
    const graph *g = &d->gs->graphs[a->graph];
    int node = a->kind == RT_EXTEND ? a->u.extend.node : a->u.drop.node;
    int w = node_worker(d, a->req, &g->entities[node].u.node, false);
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    Baton__V1__Extend ex = BATON__V1__EXTEND__INIT;
    Baton__V1__Drop dr = BATON__V1__DROP__INIT;
    uint32_t from[GRAPH_MAX_DEPTH];
    if (a->kind == RT_EXTEND) {
        ex.request_key = a->req;
        ex.graph = (uint32_t)a->graph;
        ex.node = (uint32_t)node;
        ex.upto = a->u.extend.upto;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND;
        m.extend = &ex;
    } else {
        dr.request_key = a->req;
        dr.graph = (uint32_t)a->graph;
        dr.node = (uint32_t)node;
        for (uint32_t k = 0; k < a->u.drop.from.depth; k++)
            from[k] = a->u.drop.from.v[k];
        dr.n_from_iteration = a->u.drop.from.depth;
        dr.from_iteration = from;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP;
        m.drop = &dr;
    }
    if (w >= 0 && sup_worker_get(d->sup, w)->state == SUP_READY)
        sup_send(d->sup, w, &m);
}

/* The request's sessions (KV caches) and queued work go on every worker its
 * graph places a node on, and on the replicas it is pinned to (its pins go
 * after this).  Sent after the response: the client need not wait for it. */
static void close_sessions(dispatcher *d, uint64_t key, int gi)
{
    const graph *g = &d->gs->graphs[gi];
    for (size_t w = 0; w < sup_n_workers(d->sup); w++) {
        bool used = false;
        for (size_t i = 0; i < g->n_entities && !used; i++) {
            const graph_node *n = &g->entities[i].u.node;
            used = g->entities[i].kind == GRAPH_NODE &&
                   node_worker(d, key, n, false) == (int)w;
        }
        if (!used || sup_worker_get(d->sup, (int)w)->state == SUP_DOWN)
            continue;
        Baton__V1__SessionClose sc = BATON__V1__SESSION_CLOSE__INIT;
        sc.request_key = key;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE;
        m.session_close = &sc;
        sup_send_deferred(d->sup, (int)w, &m);
    }
}

/* Hands a RESPONSE to the client side and forgets the request here; its
 * sessions close after the batch (run_actions). */
static void respond(dispatcher *d, const rt_action *a)
{
    disp_request *r = u64map_del(&d->requests, a->req);
    d->hooks.response(d->hooks.arg, a->req, a, r ? r->timings : NULL, r ? r->n_timings : 0);
    extend_forget(d, a->req, -1);
    request_free(r);
    if (BT_RESERVE(d->ended, d->n_ended, d->cap_ended, 16) == 0) {
        d->ended[d->n_ended++] = (ended_request){a->req, a->graph};
    } else {
        close_sessions(d, a->req, a->graph); /* out of memory: at once, still correct */
        replicas_unpin(d->rs, a->req);
    }
}

/* Carries out the runtime's queued actions, in order. */
static void run_actions(dispatcher *d)
{
    d->acting = true;
    for (size_t i = 0;; i++) {
        size_t n;
        const rt_action *as = rt_actions(d->rt, &n);
        if (i >= n)
            break;
        /* Handling an action may add actions (a failed send): copy it, the
         * array may move; its payload stays in the arena until the clear. */
        rt_action a = as[i];
        switch (a.kind) {
        case RT_DISPATCH:
            extend_forget(d, a.req, a.u.dispatch.node);
            send_dispatch(d, &a);
            break;
        case RT_EXTEND:
            extend_later(d, &a);
            break;
        case RT_DROP:
            extend_forget(d, a.req, a.u.drop.node);
            send_window(d, &a);
            break;
        case RT_RELEASE:
            tt_release(d->tt, a.u.release);
            break;
        case RT_CHUNK:
            d->hooks.chunk(d->hooks.arg, a.req, &a);
            break;
        case RT_RESPONSE:
            respond(d, &a);
            break;
        }
    }
    rt_actions_clear(d->rt);
    d->acting = false;
    /* Sessions close after the responses went out: the client need not
     * wait for it, and the Fetches the responses wait on are already out,
     * ahead of any SessionClose or Release of the same tensors. */
    for (size_t k = 0; k < d->n_ended; k++) {
        close_sessions(d, d->ended[k].req, d->ended[k].graph);
        /* Only now: the batch's Drops after the response still found the
         * replica; from here on its place goes to new requests. */
        replicas_unpin(d->rs, d->ended[k].req);
    }
    d->n_ended = 0;
    /* Inside a burst of worker messages the releases wait for its end: one
     * Release per worker per burst. */
    if (!d->in_burst)
        tt_flush(d->tt);
}

/* ---- events ------------------------------------------------------------ */

int disp_start(dispatcher *d, uint64_t req, int gi, const rt_tensor *inputs, bool stream,
               const uint32_t *max_iters, const disp_params *p)
{
    disp_request *r = calloc(1, sizeof(*r));
    if (!r)
        return BT_ENOMEM;
    r->p = *p;
    r->p.request_id = strdup(p->request_id ? p->request_id : "");
    if (!r->p.request_id || u64map_put(&d->requests, req, r) < 0) {
        request_free(r);
        return BT_ENOMEM;
    }
    int rc = rt_request_start(d->rt, req, gi, inputs, stream, max_iters);
    if (rc != 0) {
        request_free(u64map_del(&d->requests, req));
        return rc;
    }
    run_actions(d);
    return 0;
}

void disp_cancel(dispatcher *d, uint64_t req)
{
    rt_cancel(d->rt, req);
    run_actions(d);
}

void disp_deadline(dispatcher *d, uint64_t req)
{
    rt_deadline(d->rt, req);
    run_actions(d);
}

void disp_abort(dispatcher *d, uint64_t req, bt_code code, const char *message)
{
    rt_abort(d->rt, req, code, message);
    run_actions(d);
}

void disp_stop(dispatcher *d, uint64_t req)
{
    rt_stop(d->rt, req);
    /* From a CHUNK hook the loop that called it carries out the actions
     * this queued, in order after the chunk; running them here would
     * clear the queue under it. */
    if (!d->acting)
        run_actions(d);
}

void disp_end_all(dispatcher *d, bt_code code, const char *message)
{
    rt_end_all(d->rt, code, message);
    run_actions(d);
}

void disp_worker_lost(dispatcher *d, int w)
{
    /* Requests pinned to W as their replica of a model end with it; the
     * rest of its model's requests keep their own replicas. */
    uint64_t *pinned = NULL;
    size_t n = 0;
    if (replicas_pinned_to(d->rs, w, &pinned, &n) < 0)
        bt_error("out of memory listing the requests on lost worker %s; those not otherwise "
                 "tied to it end at their deadline", sup_worker_get(d->sup, w)->cfg->name);
    rt_worker_lost(d->rt, w, pinned, n);
    free(pinned);
    run_actions(d);
}

void disp_burst_begin(dispatcher *d)
{
    d->in_burst = true;
}

void disp_burst_end(dispatcher *d)
{
    d->in_burst = false;
    flush_extends(d);
    tt_flush(d->tt);
}

/* ---- worker results ---------------------------------------------------- */

static int value_of(const graph *g, int node, const char *name)
{
    const graph_entity *en = &g->entities[node];
    for (size_t k = 0; k < en->n_values; k++)
        if (strcmp(g->values[en->values[k]].name, name) == 0)
            return en->values[k];
    return -1;
}

static bool read_iter(const uint32_t *v, size_t n, rt_iter *it)
{
    if (n > GRAPH_MAX_DEPTH)
        return false;
    it->depth = (uint32_t)n;
    for (size_t k = 0; k < n; k++)
        it->v[k] = v[k];
    return true;
}

/* Records a timing for the response of request REQ. */
static void add_timing(dispatcher *d, uint64_t req, const disp_timing *t)
{
    disp_request *r = u64map_get(&d->requests, req);
    if (!r || r->n_timings >= MAX_TIMINGS)
        return;
    if (BT_RESERVE(r->timings, r->n_timings, r->cap_timings, 16) == 0)
        r->timings[r->n_timings++] = *t;
}

/* Takes the output tensors of M into OUTS (value indices per node); those
 * the table cannot take are skipped.  Returns how many were taken. */
static size_t take_outputs(dispatcher *d, int w, const Baton__V1__Done *m, const graph *g,
                           rt_value_out *outs)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_outputs; i++) {
        const Baton__V1__NamedRef *nr = m->outputs[i];
        if (!nr->ref || !tt_add(d->tt, w, nr->ref))
            continue;
        outs[n].tensor = (rt_tensor){nr->ref->id, (int32_t)nr->ref->owner};
        outs[n].value = g ? value_of(g, (int)m->node, nr->name ? nr->name : "") : -1;
        n++;
    }
    return n;
}

void disp_done(dispatcher *d, int w, const Baton__V1__Done *m)
{
    rt_iter it;
    bool ok = m->graph < d->gs->n_graphs && read_iter(m->iteration, m->n_iteration, &it);
    const graph *g = ok ? &d->gs->graphs[m->graph] : NULL;
    ok = ok && m->node < g->n_entities && g->entities[m->node].kind == GRAPH_NODE;
    rt_value_out stack[32];
    rt_value_out *outs = m->n_outputs <= 32 ? stack : malloc(m->n_outputs * sizeof(*outs));
    if (!outs) {
        bt_error("out of memory taking a Done of %zu outputs", m->n_outputs);
        return;
    }
    size_t n = take_outputs(d, w, m, ok ? g : NULL, outs);
    if (!ok) {
        bt_warn("worker %s sent a Done for an unknown node; its tensors are released",
                sup_worker_get(d->sup, w)->cfg->name);
        for (size_t i = 0; i < n; i++)
            tt_release(d->tt, outs[i].tensor);
        tt_flush(d->tt);
        if (outs != stack)
            free(outs);
        return;
    }
    disp_timing t = {(int)m->node, it.depth ? it.v[it.depth - 1] : 0, w, m->queue_us,
                     m->exec_us};
    add_timing(d, m->request_key, &t);
    metrics_node_done(d->m, (int)m->graph, (int)m->node, m->queue_us, m->exec_us);
    if (m->status && m->status->code != BATON__V1__CODE__OK) {
        for (size_t i = 0; i < n; i++)
            tt_release(d->tt, outs[i].tensor);
        rt_node_failed(d->rt, m->request_key, (int)m->node, &it, (bt_code)m->status->code,
                       m->status->message ? m->status->message : "");
    } else {
        rt_usage usage = {m->prompt_tokens, m->generated_tokens, m->cached_tokens};
        rt_node_done(d->rt, m->request_key, (int)m->node, &it, outs, n, m->finish, &usage);
    }
    if (outs != stack)
        free(outs);
    run_actions(d);
}

void disp_chunk(dispatcher *d, int w, const Baton__V1__Chunk *k)
{
    rt_iter it;
    rt_tensor t = {0, 0};
    if (k->ref && tt_add(d->tt, w, k->ref))
        t = (rt_tensor){k->ref->id, (int32_t)k->ref->owner};
    if (k->graph >= d->gs->n_graphs || !read_iter(k->iteration, k->n_iteration, &it) ||
        k->node >= d->gs->graphs[k->graph].n_entities) {
        if (t.id)
            tt_release(d->tt, t);
        tt_flush(d->tt);
        return;
    }
    int v = value_of(&d->gs->graphs[k->graph], (int)k->node, k->name ? k->name : "");
    rt_chunk(d->rt, k->request_key, (int)k->node, &it, v, t, k->final);
    run_actions(d);
}
