/* The workers' registrations and what they report (daemon/roster.h). */
#include "daemon/roster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/curve.h"
#include "common/log.h"
#include "common/status.h"

#define SILENT_MS 10000          /* no message this long: presumed hung */
#define EXTERNAL_SILENT_MS 3000  /* an external worker (no pid to watch): three missed
                                    heartbeats and it is lost */

struct roster {
    const cfg_config *cfg;        /* borrowed */
    const graph_set *gs;          /* borrowed; NULL: no peer is named in reads_from */
    worker_set *ws;               /* borrowed */
    tp_groups *groups;            /* borrowed: the ids of tensor-parallel ranks' Loads */
    pair_table *pairs;            /* borrowed: a registration forgets the worker's pairs */
    roster_hooks hooks;
    bool ready;                   /* every model servable: see roster_update_ready */
};

int roster_create(const cfg_config *cfg, const graph_set *gs, worker_set *ws, tp_groups *groups,
                  pair_table *pairs, const roster_hooks *hooks, roster **out)
{
    *out = NULL;
    roster *r = calloc(1, sizeof(*r));
    if (!r)
        return BT_ENOMEM;
    r->cfg = cfg;
    r->gs = gs;
    r->ws = ws;
    r->groups = groups;
    r->pairs = pairs;
    r->hooks = *hooks;
    *out = r;
    return 0;
}

void roster_destroy(roster *r)
{
    if (!r)
        return;
    for (size_t w = 0; w < workers_count(r->ws); w++)
        roster_forget(workers_at(r->ws, (int)w));
    free(r);
}

bool roster_ready(const roster *r)
{
    return r->ready;
}

/* Is W needed for readiness?  Every worker is, but one that holds only
 * replicas of models with another replica READY: those models still serve
 * (a lost replica ends its own requests, the others go on). */
static bool needed(const roster *r, const sup_worker *w)
{
    const cfg_config *cfg = r->cfg;
    bool holds = false;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        bool here = false, other = false;
        for (size_t k = 0; k < md->n_workers; k++) {
            const sup_worker *x = workers_named(r->ws, md->workers[k].s);
            if (x == w)
                here = true;
            else if (x && x->state == SUP_READY)
                other = true;
        }
        if (!here)
            continue;
        holds = true;
        if (!cfg_model_replicated(md) || !other)
            return true;
    }
    return !holds;
}

void roster_update_ready(roster *r)
{
    size_t n = workers_count(r->ws), up = 0;
    bool was = r->ready, now = true;
    for (size_t w = 0; w < n; w++) {
        const sup_worker *wk = workers_at(r->ws, (int)w);
        up += wk->state == SUP_READY;
        if (wk->state != SUP_READY && needed(r, wk))
            now = false;
    }
    r->ready = now;
    if (now && !was)
        bt_info("ready: %zu of %zu worker%s loaded", up, n, n == 1 ? "" : "s");
    else if (!now && was)
        bt_warn("not ready: a worker is down");
    if (now != was)
        r->hooks.ready_changed(r->hooks.arg, now);
}

void roster_send_peers(roster *r)
{
    size_t n = workers_count(r->ws);
    Baton__V1__PeerInfo *infos = calloc(n + 1, sizeof(*infos));
    Baton__V1__PeerInfo **ip = calloc(n + 1, sizeof(*ip));
    uint32_t *reads = calloc(n + 1, sizeof(*reads));
    if (!infos || !ip || !reads)
        goto out;
    for (size_t w = 0; w < n; w++) {
        sup_worker *wk = workers_at(r->ws, (int)w);
        baton__v1__peer_info__init(&infos[w]);
        infos[w].index = (uint32_t)w;
        infos[w].name = (char *)wk->cfg->name;
        infos[w].hostname = wk->hostname;
        infos[w].peer_endpoint = wk->peer_endpoint;
        infos[w].curve_public_key = wk->curve_public_key;
        infos[w].incarnation = wk->incarnation;
        infos[w].up = workers_live(wk);
        infos[w].n_pools = wk->n_pools;
        Baton__V1__PoolHandle **pp = calloc(wk->n_pools + 1, sizeof(*pp));
        for (size_t k = 0; pp && k < wk->n_pools; k++)
            pp[k] = &wk->pools[k];
        infos[w].pools = pp;
        ip[w] = &infos[w];
    }
    for (size_t w = 0; w < n; w++) {
        if (!workers_live(workers_at(r->ws, (int)w)))
            continue;
        Baton__V1__Peers p = BATON__V1__PEERS__INIT;
        p.self_index = (uint32_t)w;
        p.n_peers = n;
        p.peers = ip;
        p.speculation_window = r->cfg->daemon.speculation_window;
        /* The pools this worker will be asked to read, so that it opens
         * them now rather than on a request's path. */
        p.reads_from = reads;
        for (size_t f = 0; r->gs && f < n; f++)
            if (f != w && graph_set_reaches(r->gs, (int)f, (int)w))
                reads[p.n_reads_from++] = (uint32_t)f;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS;
        m.peers = &p;
        workers_send(r->ws, (int)w, &m);
    }
out:
    for (size_t w = 0; infos && w < n; w++)
        free(infos[w].pools);
    free(infos);
    free(ip);
    free(reads);
}

void roster_forget(sup_worker *w)
{
    free(w->loads_text);
    w->loads_text = NULL;
    for (size_t k = 0; k < w->n_pools; k++) {
        free(w->pools[k].shm_name);
        free(w->pools[k].cuda_ipc_handle.data);
    }
    free(w->pools);
    w->pools = NULL;
    w->n_pools = 0;
}

int roster_send_load(roster *r, sup_worker *w, size_t m, size_t k)
{
    const cfg_model *md = &r->cfg->models[m];
    Baton__V1__Load__OptionsEntry *ents = calloc(md->n_options + 1, sizeof(*ents));
    Baton__V1__Load__OptionsEntry **ep = calloc(md->n_options + 1, sizeof(*ep));
    char (*vals)[64] = calloc(md->n_options + 1, sizeof(*vals));
    int rc = BT_ENOMEM;
    if (!ents || !ep || !vals)
        goto out;
    for (size_t o = 0; o < md->n_options; o++) {
        const cfg_option *op = &md->options[o];
        baton__v1__load__options_entry__init(&ents[o]);
        ents[o].key = op->name;
        switch (op->type) {
        case BT_OPT_INT: snprintf(vals[o], 64, "%lld", (long long)op->v.i); break;
        case BT_OPT_FLOAT: snprintf(vals[o], 64, "%.17g", op->v.f); break;
        case BT_OPT_BOOL: snprintf(vals[o], 64, "%s", op->v.b ? "true" : "false"); break;
        default: vals[o][0] = 0; break;
        }
        ents[o].value = op->type == BT_OPT_STRING || op->type == BT_OPT_PATH ? op->v.s : vals[o];
        ep[o] = &ents[o];
    }
    Baton__V1__Load ld = BATON__V1__LOAD__INIT;
    ld.model = md->name;
    ld.backend = md->backend;
    ld.n_options = md->n_options;
    ld.options = ep;
    ld.tp_size = md->tp ? md->tp : 1;
    /* K is a rank only under tensor parallelism; a replica is a whole copy. */
    ld.tp_rank = ld.tp_size > 1 ? (uint32_t)k : 0;
    ld.max_batch = md->max_batch;
    ld.tp_step_ms = ld.tp_size > 1 ? md->tp_step_timeout_ms : 0;
    if (ld.tp_size > 1 && k > 0)
        ld.comm_id.data = (uint8_t *)tpg_group_id(r->groups, m, &ld.comm_id.len);
    Baton__V1__ConductorMessage msg = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    msg.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD;
    msg.load = &ld;
    rc = workers_send(r->ws, w->index, &msg);
    if (rc == 0 && ld.tp_size > 1)
        tpg_load_sent(r->groups, m, k, w->registrations);
out:
    free(ents);
    free(ep);
    free(vals);
    return rc;
}

/* Sends W a Load per model placed on it.  The other ranks of a
 * tensor-parallel model wait for the id of their group (TpGroup from rank
 * 0); their Load goes out when it comes, and counts as pending till then. */
static void send_loads(roster *r, sup_worker *w)
{
    const cfg_config *cfg = r->cfg;
    w->loads_pending = 0;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        for (size_t k = 0; k < md->n_workers; k++) {
            if (strcmp(md->workers[k].s, w->cfg->name) != 0)
                continue;
            if (tpg_waits(r->groups, m, k))
                w->loads_pending++;
            else if (roster_send_load(r, w, m, k) == 0)
                w->loads_pending++;
        }
    }
    if (w->loads_pending == 0) {
        w->state = SUP_READY;
        roster_update_ready(r);
    }
}

void roster_on_register(roster *r, sup_worker *w, const Baton__V1__Register *rg)
{
    if (rg->protocol_version != BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT) {
        bt_error("worker %s speaks protocol %u, this batond %u: shutting it down",
                 w->cfg->name, rg->protocol_version,
                 (unsigned)BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT);
        workers_send_shutdown(r->ws, w->index, "protocol version mismatch");
        return;
    }
    if (workers_live(w) && tpg_in_group(r->groups, w)) {
        /* It keeps its models, loaded on a communicator the rest of its
         * group is about to leave: it must start over with them. */
        r->hooks.take_down(r->hooks.arg, w,
                           "it registered again, and its tensor-parallel group starts over");
        return;
    }
    if (workers_live(w))
        r->hooks.lost(r->hooks.arg, w, "it registered again");
    roster_forget(w);
    pairs_forget(r->pairs, w->index);
    w->registrations++;
    w->pools = calloc(rg->n_pools + 1, sizeof(*w->pools));
    for (size_t k = 0; w->pools && k < rg->n_pools; k++) {
        const Baton__V1__PoolHandle *src = rg->pools[k];
        Baton__V1__PoolHandle *dst = &w->pools[w->n_pools++];
        baton__v1__pool_handle__init(dst);
        dst->pool = src->pool;
        dst->kind = src->kind;
        dst->shm_name = strdup(src->shm_name ? src->shm_name : "");
        dst->pool_bytes = src->pool_bytes;
        dst->cuda_device = src->cuda_device;
        if (src->cuda_ipc_handle.len && (dst->cuda_ipc_handle.data =
                                             malloc(src->cuda_ipc_handle.len))) {
            memcpy(dst->cuda_ipc_handle.data, src->cuda_ipc_handle.data,
                   src->cuda_ipc_handle.len);
            dst->cuda_ipc_handle.len = src->cuda_ipc_handle.len;
        }
    }
    /* The segment to unlink when it dies: as registered (an external
     * worker's name is not ours to derive). */
    for (size_t k = 0; k < w->n_pools; k++)
        if (w->pools[k].kind == BATON__V1__POOL_KIND__POOL_KIND_SHM && w->pools[k].shm_name[0]) {
            snprintf(w->shm_name, sizeof(w->shm_name), "%s", w->pools[k].shm_name);
            break;
        }
    snprintf(w->hostname, sizeof(w->hostname), "%s", rg->hostname ? rg->hostname : "");
    snprintf(w->peer_endpoint, sizeof(w->peer_endpoint), "%s",
             rg->peer_endpoint ? rg->peer_endpoint : "");
    /* Only a well-formed key is passed on; anything else is as good as none
     * (its peers then refuse to pull from it under CURVE). */
    snprintf(w->curve_public_key, sizeof(w->curve_public_key), "%s",
             rg->curve_public_key && bt_curve_z85_valid(rg->curve_public_key, NULL)
                 ? rg->curve_public_key
                 : "");
    w->pool_bytes = rg->pool_bytes;
    if (!w->pid && rg->pid && w->cfg->spawn == CFG_SPAWN_EXTERNAL)
        bt_info("external worker %s registered (pid %u on %s)", w->cfg->name, rg->pid,
                w->hostname);
    w->state = SUP_LOADING;
    bt_info("worker %s registered: %zu pool%s, %llu MiB", w->cfg->name, w->n_pools,
            w->n_pools == 1 ? "" : "s", (unsigned long long)(w->pool_bytes >> 20));
    roster_send_peers(r);
    tpg_registered(r->groups, w);
    send_loads(r, w);
}

/* Appends what LD says to W's inspect text: a heading line, then the
 * backend's report indented under it.  Out of memory only loses the text. */
static void record_load(sup_worker *w, const Baton__V1__Loaded *ld)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    if (w->loads_text)
        fputs(w->loads_text, f);
    fprintf(f, "model %s on worker %s: loaded in %.1f ms, %.1f MiB of weights\n",
            ld->model ? ld->model : "?", w->cfg->name, ld->load_us / 1000.0,
            ld->weight_bytes / 1048576.0);
    const char *r = ld->report ? ld->report : "";
    while (*r) {
        const char *nl = strchr(r, '\n');
        size_t n = nl ? (size_t)(nl - r) : strlen(r);
        fprintf(f, "  %.*s\n", (int)n, r);
        r += n + (nl != NULL);
    }
    if (fclose(f) == 0) {
        free(w->loads_text);
        w->loads_text = text;
    } else {
        free(text);
    }
}

void roster_on_loaded(roster *r, sup_worker *w, const Baton__V1__Loaded *ld)
{
    if (ld->status && ld->status->code != BATON__V1__CODE__OK) {
        bt_error("worker %s cannot load model %s: %s", w->cfg->name, ld->model ? ld->model : "?",
                 ld->status->message ? ld->status->message : "");
        /* UNAVAILABLE from a rank of a group: the group did not form (a
         * rank never joined, NCCL failed), which another try may mend: it
         * starts over.  Any other failure is the rank's own, and the other
         * ranks would wait for it to join: the group is held. */
        if (ld->status->code == BATON__V1__CODE__UNAVAILABLE && tpg_in_group(r->groups, w))
            r->hooks.take_down(r->hooks.arg, w, "its tensor-parallel group did not form");
        else
            tpg_load_failed(r->groups, w, ld->model, ld->status->message);
        return; /* it stays LOADING: health says why the daemon is not ready */
    }
    bt_info("worker %s loaded model %s in %.1f ms", w->cfg->name, ld->model ? ld->model : "?",
            ld->load_us / 1000.0);
    record_load(w, ld);
    if (w->loads_pending && --w->loads_pending == 0 && w->state == SUP_LOADING) {
        w->state = SUP_READY;
        roster_update_ready(r);
    }
}

void roster_on_heartbeat(sup_worker *w, const Baton__V1__Heartbeat *h)
{
    w->pool_used = h->pool_used_bytes;
    w->pool_free = h->pool_free_bytes;
    w->largest_free = h->largest_free_bytes;
    w->fragmentation = h->fragmentation;
    w->live_tensors = h->live_tensors;
    w->queued = h->queued;
    w->staged_bytes = h->staged_bytes;
    w->sessions = h->open_sessions;
    w->tp_steps = h->tp_steps;
    w->ipc_ahead = h->ipc_opens_ahead;
    w->ipc_on_request = h->ipc_opens_on_request;
    w->inline_batches = h->inline_batches;
}


bool roster_silent(const sup_worker *w, uint64_t now_ms)
{
    /* Written as sums: last_seen_ms may be later than now_ms (a message
     * read during this tick), and a difference would wrap. */
    if (w->cfg->spawn == CFG_SPAWN_EXTERNAL)
        return workers_live(w) && now_ms > w->last_seen_ms + EXTERNAL_SILENT_MS;
    return w->state != SUP_DOWN && w->pid && now_ms > w->last_seen_ms + SILENT_MS;
}
