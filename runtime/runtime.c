/* The runtime's top layer: the public API of runtime/runtime.h.  Each event
 * is checked (a request that exists, a node of its graph at the right
 * depth), handed to progress.c, and closed by after_event: replays queued
 * during it, then the requests it ended are freed, then, if memory ran out
 * on the way, every request ends.  runtime/core.h lists the layers. */
#include <stdio.h>
#include <stdlib.h>

#include "common/vec.h"
#include "runtime/core.h"
#include "runtime/progress.h"
#include "runtime/registry.h"

static void after_event(rt_runtime *rt);

/* ---- create / destroy -------------------------------------------------- */

rt_runtime *rt_create(const graph_set *gs, const rt_options *opt)
{
    rt_runtime *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return NULL;
    rt->gs = gs;
    if (opt)
        rt->opt = *opt;
    rt->lost_worker = -1;
    u64map_init(&rt->requests);
    if (rtc_extra_build(rt) < 0) {
        rt_destroy(rt);
        return NULL;
    }
    return rt;
}

void rt_destroy(rt_runtime *rt)
{
    if (!rt)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        rtc_request_free(rt, val);
    u64map_free(&rt->requests);
    rtc_bury(rt);
    free(rt->dead);
    rtc_extra_free(rt);
    rt_actions_clear(rt);
    free(rt->arena);
    free(rt->actions);
    free(rt->replay);
    free(rt);
}

/* ---- requests ---------------------------------------------------------- */

/* Runs postponed replays until none is left; each may queue more. */
static void drain(rt_runtime *rt)
{
    for (size_t i = 0; i < rt->n_replay; i++) {
        replay_item it = rt->replay[i];
        rt_request *r = u64map_get(&rt->requests, it.req);
        if (r && !r->ended)
            prog_replay(rt, r, it.node, &it.iter);
    }
    rt->n_replay = 0;
}

int rt_request_start(rt_runtime *rt, uint64_t req, int graph_index, const rt_tensor *inputs,
                     bool stream, const uint32_t *max_iters)
{
    if (graph_index < 0 || (size_t)graph_index >= rt->gs->n_graphs)
        return BT_EINVAL;
    if (req == 0 || req == UINT64_MAX)
        return BT_EINVAL;
    if (u64map_get(&rt->requests, req))
        return BT_EEXIST;
    const graph *g = &rt->gs->graphs[graph_index];
    /* Room in the list of retired requests for every live one and this:
     * retiring a request (rtc_request_retire) then never allocates, so an
     * allocation failing mid-event cannot lose a request's memory. */
    if (BT_RESERVE(rt->dead, rt->requests.n + rt->n_dead, rt->cap_dead, 8) < 0)
        return BT_ENOMEM;
    rt_request *r = rtc_request_new(rt, req, graph_index, stream, max_iters);
    if (!r)
        return BT_ENOMEM;
    if (u64map_put(&rt->requests, req, r) < 0) {
        rtc_request_free(rt, r);
        return BT_ENOMEM;
    }
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (tvec_push(rt, r, &r->inputs, inputs ? inputs[k] : (rt_tensor){0, 0}) < 0 ||
            rt->oom) {
            /* Nothing was dispatched yet: forget the request; its inputs
             * stay the caller's to free. */
            rt->oom = 0;
            u64map_del(&rt->requests, req);
            if (r->tensors)
                for (uint32_t i = 0; i < r->cap_tensors; i++)
                    if (r->tensors[i].used && r->tensors[i].refs)
                        rt->held--;
            rtc_request_free(rt, r);
            return BT_ENOMEM;
        }
    }
    /* From here the runtime owns the inputs.  An allocation that fails
     * while the first nodes are dispatched ends this request (and every
     * other) in after_event, with its one response and its inputs released
     * there: the start succeeded as far as the caller is concerned, which
     * must neither answer nor release again. */
    reg_try_dispatch_range(rt, r, 0, (int)g->n_entities - 1);
    after_event(rt);
    return 0;
}

/* Looks up the request and checks that NODE names a node of its graph at
 * the depth of ITER.  On failure the event's tensors go back. */
static rt_request *event_request(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter,
                                 const rt_tensor *ts, size_t n, int *rc)
{
    rt_request *r = u64map_get(&rt->requests, req);
    if (!r) {
        rtc_release_stray(rt, req, -1, ts, n);
        *rc = BT_ENOENT;
        return NULL;
    }
    const graph *g = r->g;
    if (node < 0 || (size_t)node >= g->n_entities || g->entities[node].kind != GRAPH_NODE ||
        !iter || iter->depth != (uint32_t)g->entities[node].depth) {
        rtc_release_stray(rt, req, r->graph_index, ts, n);
        *rc = BT_EINVAL;
        return NULL;
    }
    *rc = 0;
    return r;
}

static void after_event(rt_runtime *rt)
{
    drain(rt);
    rtc_bury(rt);
    if (rt->oom) {
        /* Out of memory mid-event leaves graph state unreliable: end every
         * request rather than risk a hang. */
        rt->oom = 0;
        rt_end_all(rt, BT_CODE_RESOURCE_EXHAUSTED, "out of memory in the conductor");
    }
}

int rt_node_done(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter,
                 const rt_value_out *outs, size_t n_outs, bool finish, const rt_usage *usage)
{
    int rc;
    rt_tensor stack[16] = {{0, 0}};
    rt_tensor *ts = n_outs <= 16 ? stack : malloc(n_outs * sizeof(*ts));
    if (!ts)
        return BT_ENOMEM;
    for (size_t i = 0; i < n_outs; i++)
        ts[i] = outs[i].tensor;
    rt_request *r = event_request(rt, req, node, iter, ts, n_outs, &rc);
    if (r) {
        /* A value index outside the node's values is a worker bug: treat the
         * tensor as stray rather than corrupt state. */
        for (size_t i = 0; i < n_outs; i++) {
            int v = outs[i].value;
            if (v < 0 || (size_t)v >= r->g->n_values || r->g->values[v].producer != node) {
                rtc_release_stray(rt, req, r->graph_index, ts, n_outs);
                prog_end(rt, r, BT_CODE_INTERNAL,
                        "node '%s' completed with an output that is not one of its values",
                        r->g->entities[node].name);
                r = NULL;
                rc = BT_EINVAL;
                break;
            }
        }
    }
    if (r)
        prog_node_done(rt, r, node, iter, outs, n_outs, finish, usage);
    if (ts != stack)
        free(ts);
    after_event(rt);
    return rc;
}

int rt_chunk(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, int value,
             rt_tensor tensor, bool final)
{
    int rc;
    rt_request *r = event_request(rt, req, node, iter, &tensor, 1, &rc);
    if (r && (value < 0 || (size_t)value >= r->g->n_values ||
              r->g->values[value].producer != node)) {
        rtc_release_stray(rt, req, r->graph_index, &tensor, 1);
        prog_end(rt, r, BT_CODE_INTERNAL, "node '%s' emitted a chunk of a value it does not make",
                r->g->entities[node].name);
        r = NULL;
        rc = BT_EINVAL;
    }
    if (r)
        prog_node_chunk(rt, r, node, iter, value, tensor, final);
    after_event(rt);
    return rc;
}

int rt_node_failed(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, bt_code code,
                   const char *message)
{
    int rc;
    rt_request *r = event_request(rt, req, node, iter, NULL, 0, &rc);
    if (!r)
        return rc;
    prog_node_failed(rt, r, node, iter, code == BT_CODE_OK ? BT_CODE_INTERNAL : code,
                    message ? message : "");
    after_event(rt);
    return 0;
}

static int end_one(rt_runtime *rt, uint64_t req, bt_code code, const char *msg)
{
    rt_request *r = u64map_get(&rt->requests, req);
    if (!r)
        return BT_ENOENT;
    prog_end(rt, r, code, "%s", msg);
    after_event(rt);
    return 0;
}

int rt_cancel(rt_runtime *rt, uint64_t req)
{
    return end_one(rt, req, BT_CODE_CANCELLED, "cancelled by the client");
}

int rt_abort(rt_runtime *rt, uint64_t req, bt_code code, const char *message)
{
    return end_one(rt, req, code == BT_CODE_OK ? BT_CODE_INTERNAL : code,
                   message ? message : "");
}

int rt_deadline(rt_runtime *rt, uint64_t req)
{
    return end_one(rt, req, BT_CODE_DEADLINE_EXCEEDED, "deadline exceeded");
}

int rt_stop(rt_runtime *rt, uint64_t req)
{
    return end_one(rt, req, BT_CODE_OK, "");
}

static bool request_uses_worker(rt_runtime *rt, rt_request *r, int worker)
{
    if (rt->gx[r->graph_index].uses_worker[worker])
        return true;
    for (uint32_t i = 0; i < r->cap_tensors; i++)
        if (r->tensors[i].used && r->tensors[i].refs && r->tensors[i].t.worker == worker)
            return true;
    return false;
}

int rt_worker_lost(rt_runtime *rt, int worker, const uint64_t *also, size_t n_also)
{
    if (worker < 0 || (size_t)worker >= rt->gs->cfg->n_workers)
        return BT_EINVAL;
    size_t n = rt->requests.n, k = 0, pos = 0;
    uint64_t *keys = malloc((n + n_also + 1) * sizeof(*keys));
    if (!keys)
        return BT_ENOMEM;
    uint64_t key;
    void *val;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        if (request_uses_worker(rt, val, worker))
            keys[k++] = key;
    /* A request listed twice is ended once: the second lookup finds it gone. */
    for (size_t i = 0; i < n_also; i++)
        keys[k++] = also[i];
    rt->lost_worker = worker;
    for (size_t i = 0; i < k; i++) {
        rt_request *r = u64map_get(&rt->requests, keys[i]);
        if (r)
            prog_end(rt, r, BT_CODE_UNAVAILABLE, "worker '%s' was lost",
                    rt->gs->cfg->workers[worker].name);
    }
    rt->lost_worker = -1;
    free(keys);
    after_event(rt);
    return 0;
}

void rt_end_all(rt_runtime *rt, bt_code code, const char *message)
{
    size_t n = rt->requests.n, k = 0, pos = 0;
    uint64_t *keys = malloc((n + 1) * sizeof(*keys));
    uint64_t key;
    void *val;
    if (!keys)
        return;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        keys[k++] = key;
    for (size_t i = 0; i < k; i++) {
        rt_request *r = u64map_get(&rt->requests, keys[i]);
        if (r)
            prog_end(rt, r, code, "%s", message);
    }
    free(keys);
    rt->n_replay = 0;
    rtc_bury(rt);
}

size_t rt_inflight(const rt_runtime *rt)
{
    return rt->requests.n;
}

size_t rt_tensors_held(const rt_runtime *rt)
{
    return rt->held;
}

bool rt_request_exists(const rt_runtime *rt, uint64_t req)
{
    return u64map_get(&rt->requests, req) != NULL;
}

const char *rt_action_kind_name(rt_action_kind k)
{
    switch (k) {
    case RT_DISPATCH: return "DISPATCH";
    case RT_EXTEND: return "EXTEND";
    case RT_DROP: return "DROP";
    case RT_RELEASE: return "RELEASE";
    case RT_CHUNK: return "CHUNK";
    case RT_RESPONSE: return "RESPONSE";
    }
    return "?";
}

void rt_iter_format(const rt_iter *it, char *buf, size_t len)
{
    size_t off = 0;
    if (len == 0)
        return;
    buf[0] = 0;
    off += (size_t)snprintf(buf, len, "(");
    for (uint32_t k = 0; k < it->depth && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s%u", k ? "," : "", it->v[k]);
    if (off < len)
        snprintf(buf + off, len - off, ")");
}
