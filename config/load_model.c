/* The `models:` list: placement on workers, tensor parallelism, and the
 * backend with its options checked against backends/catalog.c.  A middle
 * layer (load_internal.h): it calls load_util.c, config.c, yaml_tree.c. */
#include <assert.h>
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/config.h"
#include "config/load_internal.h"
#include "config/yaml_tree.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Appends S (read at V) to M's workers, refusing repeats and names of no
 * worker. */
static void add_model_worker(cfg__loader *l, cfg_model *m, const yt_node *v, char *s,
                             cfg__names *seen)
{
    cfg_config *c = l->c;
    const cfg__name *first = cfg__names_find(seen, s);
    if (first) {
        bt_diag_error(l->diag, v->line, v->col,
                      "worker '%s' is listed twice for model '%s' (first at line %d)", s,
                      m->name ? m->name : "?", first->pos.line);
        free(s);
        return;
    }
    if (!cfg__names_find(&l->workers, s)) {
        const char *names[64];
        size_t n = 0;
        for (size_t i = 0; i < c->n_workers && n < N_OF(names); i++)
            if (c->workers[i].name)
                names[n++] = c->workers[i].name;
        const char *hint = bt_suggest(s, names, n);
        bt_diag_error(l->diag, v->line, v->col,
                      "model '%s' is placed on worker '%s', which is not defined%s%s%s",
                      m->name ? m->name : "?", s, hint ? "; did you mean '" : "", hint ? hint : "",
                      hint ? "'?" : "");
    }
    m->workers[m->n_workers].s = s;
    m->workers[m->n_workers].pos = cfg__pos(v);
    m->n_workers++;
    cfg__names_add(l, seen, s, cfg__pos(v), "worker");
}

static void load_placement(cfg__loader *l, cfg_model *m, const yt_node *mv, const char *ctx,
                           const yt_node *one, const yt_node *many, const yt_node *tp)
{
    cfg__names seen = {0}; /* the workers listed so far */

    if (one && many) {
        bt_diag_error(l->diag, many->line, many->col,
                      "%s sets both 'worker' and 'workers'; use 'worker' for one, 'workers' "
                      "for several (replicas, or shards with tp)",
                      ctx);
        return;
    }
    if (!one && !many) {
        bt_diag_error(l->diag, mv->line, mv->col, "%s has no 'worker' (or 'workers')", ctx);
        return;
    }
    if (one) {
        char *s = NULL;
        m->workers = cfg__calloc(l, 1, sizeof(*m->workers));
        if (m->workers && cfg__str(l, one, "worker", &s))
            add_model_worker(l, m, one, s, &seen);
    } else if (yt_expect(many, YT_SEQ, "workers", l->diag)) {
        if (many->n_items == 0) {
            bt_diag_error(l->diag, many->line, many->col, "'workers' of %s is empty", ctx);
            return;
        }
        if (many->n_items > 64) {
            /* tp is at most 64, and a model needs no more copies than that. */
            bt_diag_error(l->diag, many->line, many->col,
                          "%s lists %zu workers; a model spans at most 64 (shards or replicas)",
                          ctx, many->n_items);
            return;
        }
        m->workers = cfg__calloc(l, many->n_items, sizeof(*m->workers));
        for (size_t i = 0; m->workers && i < many->n_items; i++) {
            char *s = NULL;
            if (cfg__str(l, many->items[i], "workers", &s))
                add_model_worker(l, m, many->items[i], s, &seen);
        }
    } else {
        return;
    }
    cfg__names_free(&seen);

    /* Tensor parallelism puts one shard on each worker, so the degree and
     * the placement must agree; a mismatch is a typo either way. */
    if (m->tp > 1 && m->n_workers != m->tp) {
        const yt_node *at = tp ? tp : mv;
        bt_diag_error(l->diag, at->line, at->col,
                      "%s has tp: %" PRIu32 " but is placed on %zu worker%s; tp must equal the "
                      "number of workers",
                      ctx, m->tp, m->n_workers, m->n_workers == 1 ? "" : "s");
    } else if (m->tp > 1) {
        /* The ranks meet in NCCL collectives, which only GPU workers have. */
        for (size_t k = 0; k < m->n_workers; k++) {
            const cfg_worker *w = cfg_worker_find(l->c, m->workers[k].s);
            if (w && w->cuda_index < 0)
                bt_diag_error(l->diag, m->workers[k].pos.line, m->workers[k].pos.col,
                              "%s has tp: %" PRIu32 ", but worker '%s' is on the CPU; "
                              "tensor parallelism runs over NCCL between GPU workers "
                              "(device: cuda:N)",
                              ctx, m->tp, w->name);
        }
        /* A rank 0 waits in its collectives for the other ranks' lanes, so a
         * worker that is rank 0 of one group and another rank of a second
         * could wait for a worker that waits for it. */
        for (const cfg_model *p = l->c->models; p < m; p++)
            for (size_t j = 0; p->tp > 1 && j < p->n_workers; j++)
                for (size_t k = 0; k < m->n_workers; k++)
                    if (p->workers[j].s && m->workers[k].s &&
                        strcmp(p->workers[j].s, m->workers[k].s) == 0 && (j == 0) != (k == 0))
                        bt_diag_error(l->diag, m->workers[k].pos.line, m->workers[k].pos.col,
                                      "worker '%s' is rank %zu of %s and rank %zu of model "
                                      "'%s'; a worker may be rank 0 of tensor-parallel models "
                                      "or one of their other ranks, not both",
                                      m->workers[k].s, k, ctx, j, p->name ? p->name : "?");
    }
    /* Several workers with tp 1 hold a full copy each (replicas): any mix of
     * CPU and GPU workers will do, since a request stays on one of them. */
}

static void load_routing(cfg__loader *l, cfg_model *m, const yt_node *v, const char *ctx)
{
    const char *names[8];
    size_t n = 0;
    while (n < N_OF(names) && (names[n] = cfg_routing_name((cfg_routing)n)))
        n++;
    char *s = NULL;
    if (!cfg__str(l, v, "routing", &s))
        return;
    size_t k = 0;
    while (k < n && strcmp(s, names[k]) != 0)
        k++;
    if (k == n) {
        const char *hint = bt_suggest(s, names, n);
        bt_diag_error(l->diag, v->line, v->col,
                      "unknown routing '%s' for %s%s%s%s (cache_aware, least_loaded or "
                      "round_robin)", s, ctx, hint ? "; did you mean '" : "", hint ? hint : "",
                      hint ? "'?" : "");
    } else if (!cfg_model_replicated(m)) {
        bt_diag_warn(l->diag, v->line, v->col,
                     "%s sets 'routing' but has no replicas (several workers without tp); "
                     "it does nothing", ctx);
    }
    m->routing = k < n ? (cfg_routing)k : CFG_ROUTE_CACHE_AWARE;
    free(s);
}

/* Reads the value V of option D of backend B into O; false (reported at
 * V) when V is not of D's type, or outside the range or the values the
 * catalog allows for D. */
static bool read_option(cfg__loader *l, const bt_backend_desc *b, const yt_node *v,
                        const bt_opt_desc *d, cfg_option *o)
{
    o->type = d->type;
    o->pos = cfg__pos(v);
    bt_opt_value val = {.set = true};
    bool ok = false;
    switch (d->type) {
    case BT_OPT_INT:
        ok = yt_int(v, d->name, INT64_MIN, INT64_MAX, &o->v.i, l->diag);
        val.i = o->v.i;
        break;
    case BT_OPT_FLOAT:
        ok = yt_float(v, d->name, -DBL_MAX, DBL_MAX, &o->v.f, l->diag);
        val.f = o->v.f;
        break;
    case BT_OPT_BOOL:
        ok = yt_bool(v, d->name, &o->v.b, l->diag);
        val.b = o->v.b;
        break;
    case BT_OPT_STRING:
    case BT_OPT_PATH:
        ok = cfg__str(l, v, d->name, &o->v.s);
        val.s = o->v.s;
        break;
    }
    if (!ok)
        return false;
    /* The type is the YAML's business; what values are allowed is the
     * catalog's, which the backend reads too. */
    char why[512];
    if (bt_opt_check(b, d, &val, v->str, why, sizeof(why)) != 0) {
        bt_diag_error(l->diag, v->line, v->col, "%s", why);
        return false;
    }
    return true;
}

/* Sets O to the declared default of D; the table in backends/catalog.c is
 * ours, so a default that does not parse is a bug, not a config error. */
static void default_option(cfg__loader *l, const bt_opt_desc *d, cfg_pos pos, cfg_option *o)
{
    int rc = 0;
    o->type = d->type;
    o->pos = pos;
    switch (d->type) {
    case BT_OPT_INT: rc = yt_parse_int(d->def, &o->v.i); break;
    case BT_OPT_FLOAT: rc = yt_parse_float(d->def, &o->v.f); break;
    case BT_OPT_BOOL: rc = yt_parse_bool(d->def, &o->v.b); break;
    case BT_OPT_STRING:
    case BT_OPT_PATH: o->v.s = cfg__strdup(l, d->def); break;
    }
    assert(rc == 0);
    (void)rc;
}

/* Plugins declare their options only when loaded on a worker, so here every
 * value is kept as its text (BT_OPT_STRING) for the plugin to parse. */
static void load_plugin_options(cfg__loader *l, cfg_model *m, const yt_node *v)
{
    cfg__names seen = {0};
    m->options = cfg__calloc(l, v->n_pairs, sizeof(*m->options));
    for (size_t i = 0; m->options && i < v->n_pairs; i++) {
        const yt_node *key = v->pairs[i].key, *val = v->pairs[i].value;
        cfg_option *o = &m->options[m->n_options];
        o->type = BT_OPT_STRING;
        o->pos = cfg__pos(val);
        /* The name joins SEEN only once the option is kept: SEEN borrows it. */
        if (!cfg__str(l, key, "options", &o->name) || !cfg__str(l, val, o->name, &o->v.s) ||
            !cfg__names_add(l, &seen, o->name, cfg__pos(key), "option")) {
            cfg__option_clear(o);
            continue;
        }
        m->n_options++;
    }
    cfg__names_free(&seen);
}

/* Checks the options V (NULL when absent) of M against its backend, then
 * fills in the defaults.  They are kept in declaration order. */
static void load_options(cfg__loader *l, cfg_model *m, const yt_node *mv, const yt_node *v,
                         const char *ctx)
{
    const bt_backend_desc *b = m->desc;
    const yt_node *seen[64] = {0}; /* the key of each declared option given */
    bool bad[64] = {0};            /* given, but of the wrong type (reported) */

    if (v && !yt_expect(v, YT_MAP, "options", l->diag))
        v = NULL;
    if (!b) {
        if (v)
            load_plugin_options(l, m, v);
        return;
    }
    assert(b->n_options <= N_OF(seen));
    m->options = cfg__calloc(l, b->n_options, sizeof(*m->options));
    if (b->n_options && !m->options)
        return;
    for (size_t i = 0; v && i < v->n_pairs; i++) {
        const yt_node *key = v->pairs[i].key, *val = v->pairs[i].value;
        char *k = NULL;
        if (!cfg__str(l, key, "options", &k))
            continue;
        const bt_opt_desc *d = bt_backend_option(b, k);
        if (!d) {
            const char *names[64];
            for (size_t j = 0; j < b->n_options; j++)
                names[j] = b->options[j].name;
            const char *hint = bt_suggest(k, names, b->n_options);
            if (b->n_options == 0)
                bt_diag_error(l->diag, key->line, key->col,
                              "unknown option '%s' for backend '%s', which takes no options", k,
                              b->name);
            else if (hint)
                bt_diag_error(l->diag, key->line, key->col,
                              "unknown option '%s' for backend '%s'; did you mean '%s'?", k,
                              b->name, hint);
            else
                bt_diag_error(l->diag, key->line, key->col, "unknown option '%s' for backend '%s'",
                              k, b->name);
            free(k);
            continue;
        }
        size_t j = (size_t)(d - b->options);
        if (seen[j]) {
            bt_diag_error(l->diag, key->line, key->col,
                          "duplicate option '%s' in %s (first at line %d)", k, ctx,
                          seen[j]->line);
        } else if (!yt_is_null(val)) {
            seen[j] = key;
            cfg_option *o = &m->options[j];
            o->name = k;
            k = NULL;
            if (!read_option(l, b, val, d, o)) {
                cfg__option_clear(o); /* reported; it counts as not given */
                bad[j] = true;
            }
        } else {
            seen[j] = key; /* `opt: ~` asks for the default */
        }
        free(k);
    }

    /* Defaults, required options, then packing the set ones to the front. */
    size_t n = 0;
    for (size_t j = 0; j < b->n_options; j++) {
        const bt_opt_desc *d = &b->options[j];
        cfg_option *o = &m->options[j];
        if (!o->name && d->def) {
            o->name = cfg__strdup(l, d->name);
            if (o->name)
                default_option(l, d, cfg__pos(mv), o);
        } else if (!o->name && d->required && !bad[j]) {
            bt_diag_error(l->diag, mv->line, mv->col,
                          "%s is missing option '%s', which backend '%s' requires (%s)", ctx,
                          d->name, b->name, d->doc);
        }
        if (o->name) {
            if (n != j) {
                m->options[n] = *o;
                memset(o, 0, sizeof(*o));
            }
            n++;
        }
    }
    m->n_options = n;
}

static void load_model(cfg__loader *l, const yt_node *v, cfg_model *m, cfg__names *seen)
{
    static const char *const keys[] = {"name",      "backend", "worker",  "workers",
                                       "tp",        "max_batch", "options", "routing",
                                       "tp_step_timeout_ms"};
    const yt_node *f[N_OF(keys)];
    char ctx[96];
    const char *peek = cfg__peek_name(v);

    m->pos = cfg__pos(v);
    m->tp = 1;
    m->max_batch = 1;
    m->tp_step_timeout_ms = CFG_TP_STEP_TIMEOUT_MS;
    snprintf(ctx, sizeof(ctx), peek ? "model '%.64s'" : "a model", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);

    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "%s has no 'name'", ctx);
    else if (cfg__str(l, f[0], "name", &m->name))
        cfg__names_add(l, seen, m->name, cfg__pos(f[0]), "model");

    bool backend_ok = false;
    if (!f[1]) {
        bt_diag_error(l->diag, v->line, v->col, "%s has no 'backend'", ctx);
    } else if (cfg__str(l, f[1], "backend", &m->backend)) {
        if (strncmp(m->backend, "plugin:", 7) == 0) {
            backend_ok = m->backend[7] != '\0';
            if (!backend_ok)
                bt_diag_error(l->diag, f[1]->line, f[1]->col,
                              "backend 'plugin:' needs the library's path, as in "
                              "plugin:/usr/lib/baton/libx.so");
        } else {
            m->desc = bt_backend_find(m->backend);
            backend_ok = m->desc != NULL;
            if (!backend_ok) {
                size_t n;
                const bt_backend_desc *const *all = bt_backend_all(&n);
                const char *names[32];
                for (size_t i = 0; i < n && i < N_OF(names); i++)
                    names[i] = all[i]->name;
                const char *hint = bt_suggest(m->backend, names, n < 32 ? n : 32);
                bt_diag_error(l->diag, f[1]->line, f[1]->col,
                              "unknown backend '%s'%s%s%s (a built-in name, or plugin:/path)",
                              m->backend, hint ? "; did you mean '" : "", hint ? hint : "",
                              hint ? "'?" : "");
            }
        }
    }

    if (f[4])
        yt_u32(f[4], "tp", 1, 64, &m->tp, l->diag);
    if (f[5])
        yt_u32(f[5], "max_batch", 1, 65536, &m->max_batch, l->diag);
    load_placement(l, m, v, ctx, f[2], f[3], f[4]);
    /* Options of an unknown backend cannot be checked; one error is enough. */
    if (backend_ok)
        load_options(l, m, v, f[6], ctx);
    if (f[7])
        load_routing(l, m, f[7], ctx);
    if (f[8])
        yt_u32(f[8], "tp_step_timeout_ms", 1, UINT32_MAX, &m->tp_step_timeout_ms, l->diag);
}

void cfg__load_models(cfg__loader *l, const yt_node *v)
{
    cfg_config *c = l->c;

    if (!yt_expect(v, YT_SEQ, "models", l->diag))
        return;
    c->models = cfg__calloc(l, v->n_items, sizeof(*c->models));
    if (!c->models)
        return;
    for (size_t i = 0; i < v->n_items; i++)
        if (yt_expect(v->items[i], YT_MAP, "models", l->diag))
            load_model(l, v->items[i], &c->models[c->n_models++], &l->models);
}
