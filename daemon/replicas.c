/* Replicas: picking one per request, pinning, and the prefix index of each
 * (daemon/replicas.h). */
#include "daemon/replicas.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/u64map.h"

/* One replica of a replicated model. */
typedef struct replica {
    int worker;                   /* index into the config's workers */
    uint32_t pinned;              /* requests pinned to it now */
    uint64_t picks[REPLICAS_N_REASONS];
    u64map blocks;                /* prefix hash -> how many reported entries hold it
                                     (a count in the pointer) */
} replica;

/* A replicated model. */
typedef struct rmodel {
    int model;                    /* index into the config's models */
    uint32_t max_batch;
    cfg_routing routing;
    replica *reps;                /* owned; in the order the config lists them */
    size_t n_reps;
    size_t turn;                  /* round robin: where the next search starts */
} rmodel;

struct replicas {
    const cfg_config *cfg;        /* borrowed */
    replicas_ready_fn ready;
    void *ready_arg;
    rmodel *models;               /* owned; the replicated models */
    size_t n_models;
    int *rmodel_of;               /* per config model: index into models, or -1; owned */
    u64map pins;                  /* request key -> int[n_models], worker or -1; owned */
};

int replicas_create(const cfg_config *cfg, replicas_ready_fn ready, void *arg, replicas **out)
{
    *out = NULL;
    replicas *rs = calloc(1, sizeof(*rs));
    if (!rs)
        return BT_ENOMEM;
    rs->cfg = cfg;
    rs->ready = ready;
    rs->ready_arg = arg;
    u64map_init(&rs->pins);
    rs->rmodel_of = malloc((cfg->n_models + 1) * sizeof(*rs->rmodel_of));
    rs->models = calloc(cfg->n_models + 1, sizeof(*rs->models));
    if (!rs->rmodel_of || !rs->models)
        goto err;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        rs->rmodel_of[m] = -1;
        if (!cfg_model_replicated(md))
            continue;
        rmodel *rm = &rs->models[rs->n_models];
        rm->model = (int)m;
        rm->max_batch = md->max_batch ? md->max_batch : 1;
        rm->routing = md->routing;
        rm->reps = calloc(md->n_workers, sizeof(*rm->reps));
        if (!rm->reps)
            goto err;
        rs->rmodel_of[m] = (int)rs->n_models++;
        for (size_t k = 0; k < md->n_workers; k++) {
            const cfg_worker *w = cfg_worker_find(cfg, md->workers[k].s);
            replica *r = &rm->reps[rm->n_reps++];
            r->worker = w ? (int)(w - cfg->workers) : -1;
            u64map_init(&r->blocks);
        }
    }
    *out = rs;
    return 0;
err:
    replicas_destroy(rs);
    return BT_ENOMEM;
}

void replicas_destroy(replicas *rs)
{
    if (!rs)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&rs->pins, &pos, &key, &val))
        free(val);
    u64map_free(&rs->pins);
    for (size_t i = 0; rs->models && i < rs->n_models; i++) {
        for (size_t k = 0; k < rs->models[i].n_reps; k++)
            u64map_free(&rs->models[i].reps[k].blocks);
        free(rs->models[i].reps);
    }
    free(rs->models);
    free(rs->rmodel_of);
    free(rs);
}

const char *replicas_reason_name(replicas_reason r)
{
    switch (r) {
    case REPLICAS_BY_CACHE: return "cache";
    case REPLICAS_BY_LOAD: return "load";
    case REPLICAS_BY_TURN: return "round_robin";
    case REPLICAS_N_REASONS: break;
    }
    return "?";
}

static rmodel *find_rmodel(const replicas *rs, int model)
{
    if (model < 0 || (size_t)model >= rs->cfg->n_models || rs->rmodel_of[model] < 0)
        return NULL;
    return &rs->models[rs->rmodel_of[model]];
}

static bool replica_ready(const replicas *rs, const replica *r)
{
    return r->worker >= 0 && rs->ready(rs->ready_arg, r->worker);
}

/* The load of worker W, in batches: per replicated model it holds, the
 * requests pinned to it there over that model's max_batch. */
static double worker_load(const replicas *rs, int w)
{
    double load = 0;
    for (size_t i = 0; i < rs->n_models; i++)
        for (size_t k = 0; k < rs->models[i].n_reps; k++)
            if (rs->models[i].reps[k].worker == w)
                load += (double)rs->models[i].reps[k].pinned / rs->models[i].max_batch;
    return load;
}

/* The ready replica of least load, ties to the first at or after the
 * model's turn (so equal replicas share the work); -1 when none is ready. */
static int least_loaded(const replicas *rs, const rmodel *rm, double *load)
{
    int best = -1;
    double best_load = 0;
    for (size_t j = 0; j < rm->n_reps; j++) {
        size_t k = (rm->turn + j) % rm->n_reps;
        if (!replica_ready(rs, &rm->reps[k]))
            continue;
        double l = worker_load(rs, rm->reps[k].worker);
        if (best < 0 || l < best_load) {
            best = (int)k;
            best_load = l;
        }
    }
    *load = best_load;
    return best;
}

/* How many blocks of KEY replica R's index holds: blocks are chained, so
 * holding block J means holding every one before it, and the search runs
 * from the longest down. */
static size_t match_len(const replica *r, const replicas_key *key)
{
    size_t j = r->blocks.n ? key->n : 0;
    while (j > 0 && !u64map_get(&r->blocks, key->hashes[j - 1]))
        j--;
    return j;
}

/* The ready replica whose index holds the longest prefix of KEY (of equal
 * ones, a system prompt every replica holds, the least loaded), and that
 * length in blocks (*LEN 0: no replica holds even the first block). */
static int longest_match(const replicas *rs, const rmodel *rm, const replicas_key *key,
                         size_t *len)
{
    int best = -1;
    *len = 0;
    for (size_t k = 0; key && k < rm->n_reps; k++) {
        const replica *r = &rm->reps[k];
        size_t n = replica_ready(rs, r) ? match_len(r, key) : 0;
        if (n && (n > *len || (n == *len && worker_load(rs, r->worker) <
                                                 worker_load(rs, rm->reps[best].worker)))) {
            best = (int)k;
            *len = n;
        }
    }
    return best;
}

/* The first ready replica from the model's turn on, or -1. */
static int next_ready(const replicas *rs, const rmodel *rm)
{
    for (size_t j = 0; j < rm->n_reps; j++) {
        size_t x = (rm->turn + j) % rm->n_reps;
        if (replica_ready(rs, &rm->reps[x]))
            return (int)x;
    }
    return -1;
}

static int choose(replicas *rs, rmodel *rm, const replicas_key *key, replicas_reason *why)
{
    double least = 0;
    int k;
    *why = REPLICAS_BY_LOAD;
    if (rm->routing == CFG_ROUTE_ROUND_ROBIN) {
        k = next_ready(rs, rm); /* whatever its load */
        *why = REPLICAS_BY_TURN;
    } else {
        k = least_loaded(rs, rm, &least);
    }
    size_t len;
    int c = k >= 0 && rm->routing == CFG_ROUTE_CACHE_AWARE ? longest_match(rs, rm, key, &len) : -1;
    /* A cached prefix is worth a wait, but not a full batch's: past that
     * the least loaded replica recomputes sooner than the cached one gets
     * to the request. */
    if (c >= 0 && worker_load(rs, rm->reps[c].worker) - least <= 1.0) {
        k = c;
        *why = REPLICAS_BY_CACHE;
    }
    if (k >= 0)
        rm->turn = ((size_t)k + 1) % rm->n_reps;
    return k;
}

int replicas_pick(replicas *rs, uint64_t req, int model, const replicas_key *key)
{
    rmodel *rm = find_rmodel(rs, model);
    if (!rm)
        return -1;
    int *pins = u64map_get(&rs->pins, req);
    size_t ri = (size_t)(rm - rs->models);
    if (pins && pins[ri] >= 0)
        return pins[ri];
    replicas_reason why;
    int k = choose(rs, rm, key, &why);
    if (k < 0)
        return -1;
    if (!pins) {
        pins = malloc(rs->n_models * sizeof(*pins));
        if (!pins || u64map_put(&rs->pins, req, pins) < 0) {
            free(pins);
            return -1;
        }
        for (size_t i = 0; i < rs->n_models; i++)
            pins[i] = -1;
    }
    replica *r = &rm->reps[k];
    pins[ri] = r->worker;
    r->pinned++;
    r->picks[why]++;
    return r->worker;
}

int replicas_pinned(const replicas *rs, uint64_t req, int model)
{
    const rmodel *rm = find_rmodel(rs, model);
    const int *pins = rm ? u64map_get(&rs->pins, req) : NULL;
    return pins ? pins[rm - rs->models] : -1;
}

void replicas_unpin(replicas *rs, uint64_t req)
{
    int *pins = u64map_del(&rs->pins, req);
    if (!pins)
        return;
    for (size_t i = 0; i < rs->n_models; i++)
        for (size_t k = 0; pins[i] >= 0 && k < rs->models[i].n_reps; k++)
            if (rs->models[i].reps[k].worker == pins[i] && rs->models[i].reps[k].pinned)
                rs->models[i].reps[k].pinned--;
    free(pins);
}

int replicas_pinned_to(const replicas *rs, int w, uint64_t **keys, size_t *n)
{
    *n = 0;
    *keys = malloc((rs->pins.n + 1) * sizeof(**keys));
    if (!*keys)
        return BT_ENOMEM;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&rs->pins, &pos, &key, &val)) {
        const int *pins = val;
        bool on = false;
        for (size_t i = 0; i < rs->n_models && !on; i++)
            on = pins[i] == w;
        if (on)
            (*keys)[(*n)++] = key;
    }
    return 0;
}

/* The replica of model NAME on worker W, or NULL. */
static replica *find_replica(replicas *rs, int w, const char *name)
{
    const cfg_model *md = cfg_model_find(rs->cfg, name);
    rmodel *rm = md ? find_rmodel(rs, (int)(md - rs->cfg->models)) : NULL;
    for (size_t k = 0; rm && k < rm->n_reps; k++)
        if (rm->reps[k].worker == w)
            return &rm->reps[k];
    return NULL;
}

int replicas_cache_event(replicas *rs, int w, const char *model, const uint64_t *stored,
                         size_t n_stored, const uint64_t *removed, size_t n_removed)
{
    replica *r = find_replica(rs, w, model ? model : "");
    int rc = 0;
    /* Each report counts once per entry of the worker's cache that holds
     * the block; the block leaves the index when the last one goes.  0
     * and UINT64_MAX, which a map cannot hold, come from no hash of ours. */
    for (size_t i = 0; r && i < n_removed; i++)
        if (removed[i] && removed[i] != UINT64_MAX)
            u64map_count_sub(&r->blocks, removed[i]);
    for (size_t i = 0; r && i < n_stored; i++)
        if (stored[i] && stored[i] != UINT64_MAX && u64map_count_add(&r->blocks, stored[i]) < 0)
            rc = BT_ENOMEM;
    return rc;
}

void replicas_worker_reset(replicas *rs, int w)
{
    for (size_t i = 0; i < rs->n_models; i++)
        for (size_t k = 0; k < rs->models[i].n_reps; k++) {
            replica *r = &rs->models[i].reps[k];
            if (r->worker != w)
                continue;
            u64map_free(&r->blocks);
            u64map_init(&r->blocks);
        }
}

bool replicas_stats_get(const replicas *rs, int model, size_t k, replicas_stats *out)
{
    const rmodel *rm = find_rmodel(rs, model);
    if (!rm || k >= rm->n_reps)
        return false;
    const replica *r = &rm->reps[k];
    out->worker = r->worker;
    out->pinned = r->pinned;
    memcpy(out->picks, r->picks, sizeof(out->picks));
    out->cached_blocks = r->blocks.n;
    return true;
}

void replicas_print(const replicas *rs, FILE *f)
{
    if (!rs->n_models)
        return;
    fprintf(f, "replicas:\n");
    for (size_t i = 0; i < rs->n_models; i++) {
        const rmodel *rm = &rs->models[i];
        fprintf(f, "  %s: routing %s, max_batch %u\n", rs->cfg->models[rm->model].name,
                cfg_routing_name(rm->routing), rm->max_batch);
        for (size_t k = 0; k < rm->n_reps; k++) {
            const replica *r = &rm->reps[k];
            const char *name = r->worker >= 0 ? rs->cfg->workers[r->worker].name : "?";
            fprintf(f, "    %s: %s, %u pinned, picked", name,
                    replica_ready(rs, r) ? "ready" : "not ready", r->pinned);
            for (int why = 0; why < REPLICAS_N_REASONS; why++)
                fprintf(f, " %llu by %s%s", (unsigned long long)r->picks[why],
                        replicas_reason_name((replicas_reason)why),
                        why + 1 < REPLICAS_N_REASONS ? "," : "");
            fprintf(f, "; %zu cached prefix blocks reported\n", r->blocks.n);
        }
    }
}
