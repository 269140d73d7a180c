/* The `graphs:` list: sections, nodes, loops and edges, read into cfg_graph.
 *
 * Only the schema is checked here (keys, types, names, model references).
 * Whether the edges make sense (targets, loop-backs, persist, producers per
 * iteration) is config/graph_build.c's work on the structs made here.  A
 * middle layer (load_internal.h): it calls load_util.c, config.c,
 * yaml_tree.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/config.h"
#include "config/load_internal.h"
#include "config/yaml_tree.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* One graph being read: nodes and loops share one name space in it. */
typedef struct graph_ctx {
    cfg__loader *l;
    cfg__names names;
} graph_ctx;

static const char *const section_kinds[] = {"node", "sequential", "parallel", "loop"};

/* Reads a list of value names (a node's or a graph's inputs); a repeat is
 * an error, since an input is bound once. */
static void load_name_list(cfg__loader *l, const yt_node *v, const char *key, const char *owner,
                           cfg_str **out, size_t *n)
{
    cfg__names seen = {0};

    if (!yt_expect(v, YT_SEQ, key, l->diag))
        return;
    *out = cfg__calloc(l, v->n_items, sizeof(**out));
    for (size_t i = 0; *out && i < v->n_items; i++) {
        const yt_node *it = v->items[i];
        char *s = NULL;
        if (!cfg__str(l, it, key, &s))
            continue;
        const cfg__name *first = cfg__names_find(&seen, s);
        if (first) {
            bt_diag_error(l->diag, it->line, it->col,
                          "input '%s' is listed twice in %s (first at line %d)", s, owner,
                          first->pos.line);
            free(s);
            continue;
        }
        (*out)[*n].s = s;
        (*out)[*n].pos = cfg__pos(it);
        (*n)++;
        cfg__names_add(l, &seen, s, cfg__pos(it), "input");
    }
    cfg__names_free(&seen);
}

static void load_edge(cfg__loader *l, const yt_node *v, cfg_edge *e)
{
    static const char *const keys[] = {"name",      "to",       "persist",   "stream",
                                       "new_token", "modality", "shard_dim", "as"};
    static const char *const modalities[] = {"text", "image", "audio", "tensor"};
    const yt_node *f[N_OF(keys)];
    const char *peek = cfg__peek_name(v);
    char ctx[96];

    e->pos = cfg__pos(v);
    e->modality = cfg__strdup(l, "tensor");
    snprintf(ctx, sizeof(ctx), peek ? "edge '%.64s'" : "an edge", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);
    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "an edge needs a 'name' (the value it carries)");
    else if (cfg__str(l, f[0], "name", &e->name) && !e->name[0])
        bt_diag_error(l->diag, f[0]->line, f[0]->col, "an edge's 'name' must not be empty");
    if (f[1]) {
        e->to_pos = cfg__pos(f[1]);
        if (cfg__str(l, f[1], "to", &e->to) && !e->to[0])
            bt_diag_error(l->diag, f[1]->line, f[1]->col,
                          "'to' must name a node or client; leave it out to declare the value only");
    }
    if (f[2])
        yt_bool(f[2], "persist", &e->persist, l->diag);
    if (f[3])
        yt_bool(f[3], "stream", &e->stream, l->diag);
    if (f[4])
        yt_bool(f[4], "new_token", &e->new_token, l->diag);
    if (f[5]) {
        char *s = NULL;
        if (cfg__str(l, f[5], "modality", &s)) {
            bool ok = false;
            for (size_t i = 0; i < N_OF(modalities); i++)
                ok = ok || strcmp(s, modalities[i]) == 0;
            if (ok) {
                free(e->modality);
                e->modality = s;
                s = NULL;
            } else {
                const char *hint = bt_suggest(s, modalities, N_OF(modalities));
                bt_diag_error(l->diag, f[5]->line, f[5]->col,
                              "modality must be one of text, image, audio, tensor, got '%s'%s%s%s",
                              s, hint ? "; did you mean '" : "", hint ? hint : "",
                              hint ? "'?" : "");
            }
            free(s);
        }
    }
    if (f[6])
        yt_u32(f[6], "shard_dim", 0, 63, &e->shard_dim, l->diag);
    /* Only the client reads values by a name of the edge's choosing: a node
     * takes a value as the input of its own name. */
    if (f[7] && cfg__str(l, f[7], "as", &e->as)) {
        if (!e->as[0])
            bt_diag_error(l->diag, f[7]->line, f[7]->col, "'as' must not be empty");
        else if (!e->to || strcmp(e->to, "client") != 0)
            bt_diag_error(l->diag, f[7]->line, f[7]->col,
                          "'as' names a value for the client, and edge '%.64s' goes %s%s%s; a "
                          "node takes a value as the input of the value's name",
                          e->name ? e->name : "?", e->to ? "to '" : "nowhere",
                          e->to ? e->to : "", e->to ? "'" : "");
    }
}

static void load_edges(cfg__loader *l, const yt_node *v, const char *key, cfg_edge **out,
                       size_t *n)
{
    if (!yt_expect(v, YT_SEQ, key, l->diag))
        return;
    *out = cfg__calloc(l, v->n_items, sizeof(**out));
    for (size_t i = 0; *out && i < v->n_items; i++)
        if (yt_expect(v->items[i], YT_MAP, key, l->diag))
            load_edge(l, v->items[i], &(*out)[(*n)++]);
}

/* Checks the name of a node or loop (WHAT) read at V. */
static void check_entity_name(graph_ctx *g, const yt_node *v, const char *name, const char *what)
{
    cfg__loader *l = g->l;
    if (!name[0])
        bt_diag_error(l->diag, v->line, v->col, "a %s name must not be empty", what);
    else if (strcmp(name, "client") == 0)
        bt_diag_error(l->diag, v->line, v->col,
                      "'client' is reserved (an edge's `to: client` means the caller) and "
                      "cannot name a %s",
                      what);
    else
        cfg__names_add(l, &g->names, name, cfg__pos(v), what);
}

static cfg_section *load_section(graph_ctx *g, const yt_node *v, const char *key);

static void load_node(graph_ctx *g, const yt_node *v, cfg_node *n)
{
    static const char *const keys[] = {"name",    "model",           "mode", "inputs",
                                       "outputs", "consumes_stream", "async"};
    cfg__loader *l = g->l;
    const yt_node *f[N_OF(keys)];
    const char *peek = cfg__peek_name(v);
    char ctx[96];

    snprintf(ctx, sizeof(ctx), peek ? "node '%.64s'" : "a node", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);
    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "a node needs a 'name'");
    else if (cfg__str(l, f[0], "name", &n->name))
        check_entity_name(g, f[0], n->name, "node");

    if (!f[1]) {
        bt_diag_error(l->diag, v->line, v->col, "%s needs a 'model'", ctx);
    } else {
        n->model_pos = cfg__pos(f[1]);
        if (cfg__str(l, f[1], "model", &n->model) && !cfg__names_find(&l->models, n->model)) {
            const char *names[64];
            size_t k = 0;
            for (size_t i = 0; i < l->c->n_models && k < N_OF(names); i++)
                if (l->c->models[i].name)
                    names[k++] = l->c->models[i].name;
            const char *hint = bt_suggest(n->model, names, k);
            bt_diag_error(l->diag, f[1]->line, f[1]->col,
                          "%s runs model '%s', which is not defined%s%s%s", ctx, n->model,
                          hint ? "; did you mean '" : "", hint ? hint : "", hint ? "'?" : "");
        }
    }
    n->mode = cfg__strdup(l, "");
    if (f[2])
        cfg__str(l, f[2], "mode", &n->mode);
    if (f[3])
        load_name_list(l, f[3], "inputs", ctx, &n->inputs, &n->n_inputs);
    if (f[4])
        load_edges(l, f[4], "outputs", &n->outputs, &n->n_outputs);
    if (f[5])
        yt_bool(f[5], "consumes_stream", &n->consumes_stream, l->diag);
    if (f[6])
        yt_bool(f[6], "async", &n->async, l->diag);
}

static void load_loop(graph_ctx *g, const yt_node *v, cfg_loop *lp)
{
    static const char *const keys[] = {"name", "max_iters", "body", "outputs", "accumulate"};
    cfg__loader *l = g->l;
    const yt_node *f[N_OF(keys)];
    const char *peek = cfg__peek_name(v);
    char ctx[96];

    snprintf(ctx, sizeof(ctx), peek ? "loop '%.64s'" : "a loop", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);
    /* The name is checked before the body, so a duplicate inside the body
     * is the one reported, at its second occurrence. */
    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "a loop needs a 'name'");
    else if (cfg__str(l, f[0], "name", &lp->name))
        check_entity_name(g, f[0], lp->name, "loop");
    if (!f[1])
        bt_diag_error(l->diag, v->line, v->col, "%s needs 'max_iters' (at least 1)", ctx);
    else
        yt_u32(f[1], "max_iters", 1, UINT32_MAX, &lp->max_iters, l->diag);
    if (!f[2])
        bt_diag_error(l->diag, v->line, v->col, "%s needs a 'body' (a section)", ctx);
    else
        lp->body = load_section(g, f[2], "body");
    if (f[3])
        load_edges(l, f[3], "outputs", &lp->outputs, &lp->n_outputs);
    if (f[4])
        load_edges(l, f[4], "accumulate", &lp->accumulate, &lp->n_accumulate);
}

static void load_list(graph_ctx *g, const yt_node *v, const char *key, cfg_section *s)
{
    cfg__loader *l = g->l;
    if (!yt_expect(v, YT_SEQ, key, l->diag))
        return;
    if (v->n_items == 0) {
        bt_diag_error(l->diag, v->line, v->col, "'%s' needs at least one section", key);
        return;
    }
    s->u.list.items = cfg__calloc(l, v->n_items, sizeof(*s->u.list.items));
    for (size_t i = 0; s->u.list.items && i < v->n_items; i++) {
        cfg_section *item = load_section(g, v->items[i], key);
        if (item)
            s->u.list.items[s->u.list.n++] = item;
    }
}

/* Reads the section V, the value of KEY.  Returns NULL (reported, or out of
 * memory) when V is not a section at all; a section with errors inside is
 * returned, so that the walk goes on to report them all. */
static cfg_section *load_section(graph_ctx *g, const yt_node *v, const char *key)
{
    cfg__loader *l = g->l;
    const yt_pair *chosen = NULL;
    size_t kind = 0;
    bool reported = false;

    if (!yt_expect(v, YT_MAP, key, l->diag))
        return NULL;
    for (size_t p = 0; p < v->n_pairs; p++) {
        const yt_node *k = v->pairs[p].key;
        char got[64];
        size_t i = 0;
        if (k->kind == YT_SCALAR)
            while (i < N_OF(section_kinds) && strcmp(k->str, section_kinds[i]) != 0)
                i++;
        if (k->kind != YT_SCALAR || i == N_OF(section_kinds)) {
            const char *hint =
                k->kind == YT_SCALAR ? bt_suggest(k->str, section_kinds, N_OF(section_kinds)) : NULL;
            bt_diag_error(l->diag, k->line, k->col,
                          "unknown key %s in a section (node, sequential, parallel or loop)%s%s%s",
                          yt_describe(k, got, sizeof(got)), hint ? "; did you mean '" : "",
                          hint ? hint : "", hint ? "'?" : "");
            reported = true;
        } else if (chosen) {
            bt_diag_error(l->diag, k->line, k->col,
                          "a section holds exactly one of node, sequential, parallel or loop; "
                          "this one has '%s' and '%s' (nest them in a sequential or parallel)",
                          chosen->key->str, k->str);
            reported = true;
        } else {
            chosen = &v->pairs[p];
            kind = i;
        }
    }
    if (!chosen) {
        if (!reported)
            bt_diag_error(l->diag, v->line, v->col,
                          "a section needs one of node, sequential, parallel or loop");
        return NULL;
    }

    cfg_section *s = cfg__calloc(l, 1, sizeof(*s));
    if (!s)
        return NULL;
    s->pos = cfg__pos(chosen->key);
    const yt_node *body = chosen->value;
    switch (kind) {
    case 0:
        s->kind = CFG_SEC_NODE;
        if (yt_expect(body, YT_MAP, "node", l->diag))
            load_node(g, body, &s->u.node);
        break;
    case 1:
        s->kind = CFG_SEC_SEQUENTIAL;
        load_list(g, body, "sequential", s);
        break;
    case 2:
        s->kind = CFG_SEC_PARALLEL;
        load_list(g, body, "parallel", s);
        break;
    default:
        s->kind = CFG_SEC_LOOP;
        if (yt_expect(body, YT_MAP, "loop", l->diag))
            load_loop(g, body, &s->u.loop);
        break;
    }
    return s;
}

static void load_graph(cfg__loader *l, const yt_node *v, cfg_graph *gr, cfg__names *seen)
{
    static const char *const keys[] = {"name", "inputs", "body", "optional_inputs"};
    const yt_node *f[N_OF(keys)];
    const char *peek = cfg__peek_name(v);
    char ctx[96];
    graph_ctx g = {l, {0}};

    gr->pos = cfg__pos(v);
    snprintf(ctx, sizeof(ctx), peek ? "graph '%.64s'" : "a graph", peek);
    yt_fields(v, ctx, keys, N_OF(keys), f, l->diag);
    if (!f[0])
        bt_diag_error(l->diag, v->line, v->col, "a graph needs a 'name'");
    else if (cfg__str(l, f[0], "name", &gr->name))
        cfg__names_add(l, seen, gr->name, cfg__pos(f[0]), "graph");
    if (f[1])
        load_name_list(l, f[1], "inputs", ctx, &gr->inputs, &gr->n_inputs);
    if (f[3])
        load_name_list(l, f[3], "optional_inputs", ctx, &gr->optional, &gr->n_optional);
    for (size_t i = 0; i < gr->n_optional; i++) {
        bool found = false;
        for (size_t k = 0; k < gr->n_inputs && !found; k++)
            found = strcmp(gr->inputs[k].s, gr->optional[i].s) == 0;
        if (!found)
            bt_diag_error(l->diag, gr->optional[i].pos.line, gr->optional[i].pos.col,
                          "%s: optional input '%s' is not one of its inputs", ctx,
                          gr->optional[i].s);
    }
    if (!f[2])
        bt_diag_error(l->diag, v->line, v->col, "%s needs a 'body' (a section)", ctx);
    else
        gr->body = load_section(&g, f[2], "body");
    cfg__names_free(&g.names);
}

void cfg__load_graphs(cfg__loader *l, const yt_node *v)
{
    cfg_config *c = l->c;
    cfg__names seen = {0};

    if (!yt_expect(v, YT_SEQ, "graphs", l->diag))
        return;
    c->graphs = cfg__calloc(l, v->n_items, sizeof(*c->graphs));
    for (size_t i = 0; c->graphs && i < v->n_items; i++)
        if (yt_expect(v->items[i], YT_MAP, "graphs", l->diag))
            load_graph(l, v->items[i], &c->graphs[c->n_graphs++], &seen);
    cfg__names_free(&seen);
}
