/* Graph building and validation: from cfg_graph (the YAML as typed structs)
 * to the index-based template of config/graph.h.
 *
 * The pass runs in a fixed order so that later steps can trust earlier
 * ones: shape (entities and sections in pre-order), values, edges with
 * their kinds, inputs with their producers, derived I/O, speculation.  Every
 * error is reported and the pass goes on, so a user sees all of them. */
#include "config/graph.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

#include "common/status.h"
#include "common/vec.h"

typedef struct int_vec {
    int *v;
    size_t n, cap;
} int_vec;

static int ivec_push(int_vec *iv, int x)
{
    if (BT_RESERVE(iv->v, iv->n, iv->cap, 4) < 0)
        return BT_ENOMEM;
    iv->v[iv->n++] = x;
    return 0;
}

/* Hands the vector's storage to an (array, count) pair of a struct. */
static void ivec_take(int_vec *iv, int **out, size_t *n)
{
    *out = iv->v;
    *n = iv->n;
    iv->v = NULL;
    iv->n = iv->cap = 0;
}

/* State of one graph's build. */
typedef struct builder {
    const cfg_config *cfg;
    const cfg_graph *cg;
    bt_diag *diag;
    graph *g;
    size_t cap_entities, cap_sections, cap_edges, cap_values;
    const cfg_section **entity_cfg; /* per entity: its cfg section */
    uint64_t *rejected;    /* per entity: inputs (bit k) that had an edge rejected */
    int oom;
} builder;

#define ERR(b, pos, ...) bt_diag_error((b)->diag, (pos).line, (pos).col, __VA_ARGS__)
#define WARN(b, pos, ...) bt_diag_warn((b)->diag, (pos).line, (pos).col, __VA_ARGS__)

static int add_section(builder *b, cfg_section_kind kind, int parent)
{
    graph *g = b->g;
    if (BT_RESERVE(g->sections, g->n_sections, b->cap_sections, 8) < 0) {
        b->oom = 1;
        return -1;
    }
    int idx = (int)g->n_sections++;
    g->sections[idx] = (graph_section){
        .kind = kind, .parent = parent, .entity = -1, .first = (int)g->n_entities, .last = -1};
    return idx;
}

static int add_entity(builder *b, graph_entity_kind kind, const cfg_section *cs, int parent_loop,
                      int section)
{
    graph *g = b->g;
    size_t cap = b->cap_entities;
    if (BT_RESERVE(g->entities, g->n_entities, b->cap_entities, 8) < 0) {
        b->oom = 1;
        return -1;
    }
    graph_entity *e = g->entities;
    /* entity_cfg follows entities, to the same capacity. */
    if (b->cap_entities != cap) {
        const cfg_section **ec = realloc(b->entity_cfg, b->cap_entities * sizeof(*ec));
        if (!ec) {
            b->oom = 1;
            return -1;
        }
        b->entity_cfg = ec;
    }
    int idx = (int)g->n_entities++;
    graph_entity *en = &e[idx];
    *en = (graph_entity){0};
    en->kind = kind;
    en->name = kind == GRAPH_NODE ? cs->u.node.name : cs->u.loop.name;
    en->parent_loop = parent_loop;
    en->section = section;
    en->pos = cs->pos;
    if (parent_loop >= 0) {
        const graph_entity *p = &e[parent_loop];
        en->depth = p->depth + 1;
        memcpy(en->loops, p->loops, sizeof(en->loops));
        en->loops[p->depth] = parent_loop;
    }
    b->entity_cfg[idx] = cs;
    return idx;
}

/* Walks the section tree in pre-order, creating sections and entities. */
static void walk_shape(builder *b, const cfg_section *cs, int parent_section, int parent_loop)
{
    if (!cs || b->oom)
        return;
    int si = add_section(b, cs->kind, parent_section);
    if (si < 0)
        return;
    switch (cs->kind) {
    case CFG_SEC_NODE: {
        int ei = add_entity(b, GRAPH_NODE, cs, parent_loop, si);
        if (ei < 0)
            return;
        b->g->sections[si].entity = ei;
        break;
    }
    case CFG_SEC_LOOP: {
        int depth = parent_loop >= 0 ? b->g->entities[parent_loop].depth + 1 : 0;
        if (depth >= GRAPH_MAX_DEPTH) {
            ERR(b, cs->pos, "loop '%s' is nested %d deep; at most %d levels are supported",
                cs->u.loop.name, depth + 1, GRAPH_MAX_DEPTH);
            return;
        }
        int ei = add_entity(b, GRAPH_LOOP, cs, parent_loop, si);
        if (ei < 0)
            return;
        b->g->sections[si].entity = ei;
        b->g->entities[ei].u.loop.max_iters = cs->u.loop.max_iters;
        walk_shape(b, cs->u.loop.body, si, ei);
        if (b->oom)
            return;
        b->g->entities[ei].u.loop.first = ei;
        b->g->entities[ei].u.loop.last = (int)b->g->n_entities - 1;
        break;
    }
    case CFG_SEC_SEQUENTIAL:
    case CFG_SEC_PARALLEL:
        for (size_t i = 0; i < cs->u.list.n; i++)
            walk_shape(b, cs->u.list.items[i], si, parent_loop);
        break;
    }
    if (!b->oom)
        b->g->sections[si].last = (int)b->g->n_entities - 1;
}

int graph_entity_find(const graph *g, const char *name)
{
    for (size_t i = 0; i < g->n_entities; i++)
        if (strcmp(g->entities[i].name, name) == 0)
            return (int)i;
    return -1;
}

int graph_input_index(const graph *g, const char *name)
{
    for (size_t i = 0; i < g->n_inputs; i++)
        if (strcmp(g->inputs[i], name) == 0)
            return (int)i;
    return -1;
}

static int add_value(builder *b, int producer, const char *name, graph_value_role role)
{
    graph *g = b->g;
    for (size_t i = 0; i < g->n_values; i++)
        if (g->values[i].producer == producer && g->values[i].role == role &&
            strcmp(g->values[i].name, name) == 0)
            return (int)i;
    if (BT_RESERVE(g->values, g->n_values, b->cap_values, 8) < 0) {
        b->oom = 1;
        return -1;
    }
    int idx = (int)g->n_values++;
    g->values[idx] =
        (graph_value){.name = name, .producer = producer, .role = role, .source = -1};
    return idx;
}

static void make_values(builder *b)
{
    graph *g = b->g;
    for (size_t i = 0; i < g->n_entities && !b->oom; i++) {
        const cfg_section *cs = b->entity_cfg[i];
        int_vec vals = {0};
        if (cs->kind == CFG_SEC_NODE) {
            for (size_t k = 0; k < cs->u.node.n_outputs; k++) {
                int v = add_value(b, (int)i, cs->u.node.outputs[k].name, GRAPH_VALUE_NODE);
                if (v >= 0 && (vals.n == 0 || vals.v[vals.n - 1] != v)) {
                    size_t j;
                    for (j = 0; j < vals.n && vals.v[j] != v; j++)
                        ;
                    if (j == vals.n && ivec_push(&vals, v) < 0)
                        b->oom = 1;
                }
            }
        } else {
            const cfg_loop *l = &cs->u.loop;
            for (int pass = 0; pass < 2; pass++) {
                const cfg_edge *es = pass ? l->accumulate : l->outputs;
                size_t n = pass ? l->n_accumulate : l->n_outputs;
                graph_value_role role = pass ? GRAPH_VALUE_LOOP_ACCUM : GRAPH_VALUE_LOOP_LAST;
                for (size_t k = 0; k < n; k++) {
                    size_t before = g->n_values;
                    int v = add_value(b, (int)i, es[k].name, role);
                    if (v >= 0 && g->n_values != before && ivec_push(&vals, v) < 0)
                        b->oom = 1;
                }
            }
        }
        ivec_take(&vals, &g->entities[i].values, &g->entities[i].n_values);
    }
}

/* A loop value takes the body value of the same name made at the loop's
 * own level: by a node directly in the body, or by a nested loop. */
static void resolve_loop_values(builder *b)
{
    graph *g = b->g;
    for (size_t vi = 0; vi < g->n_values && !b->oom; vi++) {
        graph_value *v = &g->values[vi];
        if (v->role == GRAPH_VALUE_NODE)
            continue;
        int loop = v->producer;
        int found = -1, count = 0;
        for (size_t wi = 0; wi < g->n_values; wi++) {
            const graph_value *w = &g->values[wi];
            if (g->entities[w->producer].parent_loop == loop && strcmp(w->name, v->name) == 0) {
                if (found < 0)
                    found = (int)wi;
                count++;
            }
        }
        const cfg_loop *cl = &b->entity_cfg[loop]->u.loop;
        cfg_pos pos = b->entity_cfg[loop]->pos;
        const cfg_edge *es = v->role == GRAPH_VALUE_LOOP_LAST ? cl->outputs : cl->accumulate;
        size_t n = v->role == GRAPH_VALUE_LOOP_LAST ? cl->n_outputs : cl->n_accumulate;
        for (size_t k = 0; k < n; k++)
            if (strcmp(es[k].name, v->name) == 0) {
                pos = es[k].pos;
                break;
            }
        if (count == 0) {
            ERR(b, pos, "loop '%s' %s '%s', but no node directly in its body produces a value "
                "of that name (declare it as an output of a body node; `to` may be omitted)",
                g->entities[loop].name,
                v->role == GRAPH_VALUE_LOOP_LAST ? "outputs" : "accumulates", v->name);
            continue;
        }
        if (count > 1) {
            ERR(b, pos, "loop '%s' takes value '%s', which %d entities of its body produce; "
                "give them distinct names", g->entities[loop].name, v->name, count);
            continue;
        }
        v->source = found;
        int_vec uses = {0};
        uses.v = g->values[found].loop_uses;
        uses.n = uses.cap = g->values[found].n_loop_uses;
        if (ivec_push(&uses, (int)vi) < 0)
            b->oom = 1;
        ivec_take(&uses, &g->values[found].loop_uses, &g->values[found].n_loop_uses);
    }
}

/* The lowest common ancestor of two sections. */
static int section_lca(const graph *g, int a, int b)
{
    int da = 0, db = 0;
    for (int s = a; g->sections[s].parent >= 0; s = g->sections[s].parent)
        da++;
    for (int s = b; g->sections[s].parent >= 0; s = g->sections[s].parent)
        db++;
    while (da > db) {
        a = g->sections[a].parent;
        da--;
    }
    while (db > da) {
        b = g->sections[b].parent;
        db--;
    }
    while (a != b) {
        a = g->sections[a].parent;
        b = g->sections[b].parent;
    }
    return a;
}

static bool entity_inside(const graph *g, int e, int loop)
{
    const graph_loop *l = &g->entities[loop].u.loop;
    return e > loop && e <= l->last;
}

static void entity_names(const graph *g, const char **names)
{
    for (size_t i = 0; i < g->n_entities; i++)
        names[i] = g->entities[i].name;
    names[g->n_entities] = "client";
}

static void add_edge(builder *b, int producer, int value, const cfg_edge *ce)
{
    graph *g = b->g;
    const char *pname = g->entities[producer].name;
    graph_edge e = {0};
    e.value = value;
    e.producer = producer;
    e.persist = ce->persist;
    e.stream = ce->stream;
    e.new_token = ce->new_token;
    e.modality = ce->modality ? ce->modality : "tensor";
    e.shard_dim = ce->shard_dim;
    e.pos = ce->pos;
    e.common_depth = g->entities[producer].depth;
    e.consumer = -1;
    e.input = -1;

    if (strcmp(ce->to, "client") == 0) {
        e.kind = GRAPH_EDGE_CLIENT;
        e.client_name = ce->as ? ce->as : ce->name;
        if (ce->persist) {
            ERR(b, ce->pos, "edge '%s' from '%s' to the client has persist: true; persist "
                "applies only to edges that enter a loop", ce->name, pname);
            return;
        }
    } else {
        int c = graph_entity_find(g, ce->to);
        if (c < 0) {
            const char **names = malloc((g->n_entities + 1) * sizeof(*names));
            const char *hint = NULL;
            if (names) {
                entity_names(g, names);
                hint = bt_suggest(ce->to, names, g->n_entities + 1);
            }
            cfg_pos p = ce->to_pos.line ? ce->to_pos : ce->pos;
            if (hint)
                ERR(b, p, "edge '%s' from '%s' goes to '%s', which is not a node of graph '%s'; "
                    "did you mean '%s'?", ce->name, pname, ce->to, g->name, hint);
            else
                ERR(b, p, "edge '%s' from '%s' goes to '%s', which is not a node of graph '%s'",
                    ce->name, pname, ce->to, g->name);
            free(names);
            return;
        }
        const graph_entity *ce_ent = &g->entities[c];
        if (ce_ent->kind == GRAPH_LOOP) {
            ERR(b, ce->to_pos.line ? ce->to_pos : ce->pos, "edge '%s' from '%s' goes to loop '%s'; "
                "edges go to nodes (name the node inside the loop that takes the value)",
                ce->name, pname, ce->to);
            return;
        }
        const cfg_node *cn = &b->entity_cfg[c]->u.node;
        int input = -1;
        for (size_t k = 0; k < cn->n_inputs; k++)
            if (strcmp(cn->inputs[k].s, ce->name) == 0)
                input = (int)k;
        if (input < 0) {
            char list[512] = "";
            size_t off = 0;
            for (size_t k = 0; k < cn->n_inputs && off < sizeof(list) - 1; k++)
                off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", k ? ", " : "",
                                        cn->inputs[k].s);
            if (off >= sizeof(list))
                off = sizeof(list) - 1;
            ERR(b, ce->pos, "edge '%s' from '%s' goes to node '%s', which takes no input named "
                "'%s' (its inputs: %s)", ce->name, pname, ce->to, ce->name,
                cn->n_inputs ? list : "none");
            return;
        }
        e.consumer = c;
        e.input = input;
        const graph_entity *pe = &g->entities[producer];
        /* A value leaves a loop only through the loop's own outputs. */
        for (int k = 0; k < pe->depth; k++) {
            if (k >= ce_ent->depth || ce_ent->loops[k] != pe->loops[k]) {
                ERR(b, ce->pos, "edge '%s' from '%s' to '%s' leaves loop '%s'; a value leaves "
                    "a loop only through the loop's outputs, its accumulate, or an edge to the "
                    "client", ce->name, pname, ce->to, g->entities[pe->loops[pe->depth - 1]].name);
                goto reject;
            }
        }
        if (pe->kind == GRAPH_LOOP && entity_inside(g, c, producer)) {
            ERR(b, ce->pos, "loop '%s' sends '%s' to '%s', which is inside the loop; a loop's "
                "outputs go to nodes after it", pname, ce->name, ce->to);
            goto reject;
        }
        int cdepth = ce_ent->depth;
        int anc = cdepth > e.common_depth ? ce_ent->loops[e.common_depth] : c;
        int lca = section_lca(g, g->entities[producer].section, g->entities[anc].section);
        if (g->sections[lca].kind == CFG_SEC_PARALLEL) {
            ERR(b, ce->pos, "edge '%s' from '%s' to '%s' joins two branches of a parallel "
                "section; branches of a parallel share no edges", ce->name, pname, ce->to);
            goto reject;
        }
        bool backward = anc <= producer;
        if (backward && e.common_depth == 0) {
            ERR(b, ce->pos, "edge '%s' from '%s' to '%s' goes backwards outside a loop (a cycle); "
                "only edges inside a loop body may go back, and they feed the next iteration",
                ce->name, pname, ce->to);
            goto reject;
        }
        e.loopback = backward;
        e.kind = backward ? GRAPH_EDGE_LOOPBACK
                          : (cdepth > e.common_depth ? GRAPH_EDGE_EXTERNAL : GRAPH_EDGE_FORWARD);
        if (ce->persist && cdepth == e.common_depth) {
            ERR(b, ce->pos, "edge '%s' from '%s' to '%s' has persist: true but enters no loop; "
                "persist binds a value from outside a loop in every iteration", ce->name, pname,
                ce->to);
            goto reject;
        }
        if (ce->stream && backward) {
            ERR(b, ce->pos, "edge '%s' from '%s' to '%s' is a stream that loops back; stream "
                "edges must go forward", ce->name, pname, ce->to);
            goto reject;
        }
        if (ce->stream && cdepth > e.common_depth) {
            ERR(b, ce->pos, "edge '%s' from '%s' to '%s' is a stream that enters a loop; a "
                "stream must be consumed at its producer's loop level", ce->name, pname, ce->to);
            goto reject;
        }
        for (int k = e.common_depth; k < cdepth; k++)
            if (!ce->persist)
                e.must_zero |= 1u << k;
        if (backward)
            e.must_nonzero |= 1u << (e.common_depth - 1);
    }
    if (BT_RESERVE(g->edges, g->n_edges, b->cap_edges, 8) < 0) {
        b->oom = 1;
        return;
    }
    g->edges[g->n_edges++] = e;
    return;
reject:
    /* The input had a producer, just a wrong one: one error is enough. */
    if (e.input < 64)
        b->rejected[e.consumer] |= 1ull << e.input;
}

static void make_edges(builder *b)
{
    graph *g = b->g;
    for (size_t i = 0; i < g->n_entities && !b->oom; i++) {
        const cfg_section *cs = b->entity_cfg[i];
        if (cs->kind == CFG_SEC_NODE) {
            for (size_t k = 0; k < cs->u.node.n_outputs; k++) {
                const cfg_edge *ce = &cs->u.node.outputs[k];
                if (!ce->to)
                    continue;
                add_edge(b, (int)i, add_value(b, (int)i, ce->name, GRAPH_VALUE_NODE), ce);
            }
        } else {
            const cfg_loop *l = &cs->u.loop;
            for (size_t k = 0; k < l->n_outputs; k++)
                if (l->outputs[k].to)
                    add_edge(b, (int)i, add_value(b, (int)i, l->outputs[k].name,
                                                  GRAPH_VALUE_LOOP_LAST), &l->outputs[k]);
            for (size_t k = 0; k < l->n_accumulate; k++)
                if (l->accumulate[k].to)
                    add_edge(b, (int)i, add_value(b, (int)i, l->accumulate[k].name,
                                                  GRAPH_VALUE_LOOP_ACCUM), &l->accumulate[k]);
        }
    }
    /* Per value, its edges in config order. */
    for (size_t ei = 0; ei < g->n_edges && !b->oom; ei++) {
        graph_value *v = &g->values[g->edges[ei].value];
        int_vec iv = {v->edges, v->n_edges, v->n_edges};
        if (ivec_push(&iv, (int)ei) < 0)
            b->oom = 1;
        ivec_take(&iv, &v->edges, &v->n_edges);
    }
}

bool graph_edge_applies(const graph_edge *e, const uint32_t *v, int depth)
{
    uint32_t nz = 0;
    for (int k = 0; k < depth; k++)
        if (v[k])
            nz |= 1u << k;
    return (nz & e->must_zero) == 0 && (nz & e->must_nonzero) == e->must_nonzero;
}

static bool mask_applies(const graph_edge *e, uint32_t nz)
{
    return (nz & e->must_zero) == 0 && (nz & e->must_nonzero) == e->must_nonzero;
}

static int pos_cmp(cfg_pos a, cfg_pos b)
{
    if (a.line != b.line)
        return a.line < b.line ? -1 : 1;
    return a.col < b.col ? -1 : a.col > b.col;
}

/* Describes the iterations of pattern NZ for node E, e.g. "iteration 0 of
 * loop 'decode_loop'" or "iterations >= 1 of loop 'a' and iteration 0 of
 * loop 'b'". */
static void describe_pattern(const graph *g, const graph_entity *e, uint32_t nz, char *buf,
                             size_t len)
{
    size_t off = 0;
    buf[0] = 0;
    for (int k = 0; k < e->depth && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s of loop '%s'", k ? " and " : "",
                                (nz >> k) & 1 ? "iterations >= 1" : "iteration 0",
                                g->entities[e->loops[k]].name);
}

static void make_inputs(builder *b)
{
    graph *g = b->g;
    bool *used = calloc(g->n_inputs + 1, sizeof(*used));
    if (!used) {
        b->oom = 1;
        return;
    }
    for (size_t i = 0; i < g->n_entities && !b->oom; i++) {
        graph_entity *en = &g->entities[i];
        if (en->kind != GRAPH_NODE)
            continue;
        const cfg_node *cn = &b->entity_cfg[i]->u.node;
        graph_node *n = &en->u.node;
        n->stream_input = -1;
        n->inputs = calloc(cn->n_inputs ? cn->n_inputs : 1, sizeof(*n->inputs));
        if (!n->inputs) {
            b->oom = 1;
            break;
        }
        n->n_inputs = cn->n_inputs;
        int n_stream = 0;
        for (size_t k = 0; k < cn->n_inputs; k++) {
            graph_input *in = &n->inputs[k];
            in->name = cn->inputs[k].s;
            in->pos = cn->inputs[k].pos;
            in->graph_input = -1;
            int_vec iv = {0};
            for (size_t ei = 0; ei < g->n_edges; ei++)
                if (g->edges[ei].consumer == (int)i && g->edges[ei].input == (int)k &&
                    ivec_push(&iv, (int)ei) < 0)
                    b->oom = 1;
            /* Fan-in parts join in the order the producers appear in the file. */
            for (size_t x = 1; x < iv.n; x++)
                for (size_t y = x; y > 0 && pos_cmp(g->edges[iv.v[y]].pos,
                                                    g->edges[iv.v[y - 1]].pos) < 0; y--) {
                    int t = iv.v[y];
                    iv.v[y] = iv.v[y - 1];
                    iv.v[y - 1] = t;
                }
            ivec_take(&iv, &in->edges, &in->n_edges);
            if (in->n_edges == 0) {
                in->graph_input = graph_input_index(g, in->name);
                if (in->graph_input < 0 && k < 64 && (b->rejected[i] >> k) & 1)
                    continue;
                if (in->graph_input < 0) {
                    ERR(b, in->pos, "input '%s' of node '%s' has no producer: no edge targets it "
                        "and graph '%s' has no input named '%s'", in->name, en->name, g->name,
                        in->name);
                    continue;
                }
                used[in->graph_input] = true;
                in->fanin_first = in->fanin_later = 1;
                continue;
            }
            bool has_persist = false, has_loopback = false;
            int n_stream_edges = 0;
            for (size_t x = 0; x < in->n_edges; x++) {
                const graph_edge *e = &g->edges[in->edges[x]];
                has_persist |= e->persist;
                has_loopback |= e->loopback;
                n_stream_edges += e->stream;
            }
            if (n_stream_edges) {
                in->is_stream = true;
                n->stream_input = (int)k;
                n_stream++;
                if (in->n_edges > 1)
                    ERR(b, in->pos, "input '%s' of node '%s' is a stream and has %zu producers; "
                        "a stream input takes exactly one", in->name, en->name, in->n_edges);
            }
            for (size_t x = 1; x < in->n_edges; x++)
                if (g->edges[in->edges[x]].shard_dim != g->edges[in->edges[0]].shard_dim) {
                    ERR(b, g->edges[in->edges[x]].pos, "the producers of input '%s' of node "
                        "'%s' disagree on shard_dim (%u here, %u first); fan-in parts join "
                        "along one dimension", in->name, en->name,
                        g->edges[in->edges[x]].shard_dim, g->edges[in->edges[0]].shard_dim);
                    break;
                }
            if (has_persist && has_loopback) {
                ERR(b, in->pos, "input '%s' of node '%s' has both a persisted external producer "
                    "and a loop-back producer; in iterations >= 1 it would take both", in->name,
                    en->name);
                continue;
            }
            /* Every combination of "iteration 0 / later" over the node's loops
             * needs a producer; conditions only depend on zero-ness. */
            uint32_t npat = 1u << en->depth;
            for (uint32_t nz = 0; nz < npat; nz++) {
                int cnt = 0;
                for (size_t x = 0; x < in->n_edges; x++)
                    cnt += mask_applies(&g->edges[in->edges[x]], nz);
                if (cnt == 0) {
                    char where[512];
                    describe_pattern(g, en, nz, where, sizeof(where));
                    const char *why = nz == 0 || !((nz >> (en->depth - 1)) & 1)
                        ? "its producers are loop-back edges, which deliver from the next "
                          "iteration on; add an edge from before the loop"
                        : "an edge from outside a loop delivers to iteration 0 only; give it "
                          "persist: true or add a loop-back edge";
                    ERR(b, in->pos, "input '%s' of node '%s' has no producer in %s: %s",
                        in->name, en->name, where, why);
                    break;
                }
            }
            uint32_t inner = en->depth ? 1u << (en->depth - 1) : 0;
            for (size_t x = 0; x < in->n_edges; x++) {
                in->fanin_first += mask_applies(&g->edges[in->edges[x]], 0);
                in->fanin_later += mask_applies(&g->edges[in->edges[x]], inner);
            }
        }
        if (n_stream > 1)
            ERR(b, en->pos, "node '%s' has %d stream inputs; a node takes at most one",
                en->name, n_stream);
        if (cn->consumes_stream && n_stream == 0)
            ERR(b, en->pos, "node '%s' has consumes_stream: true but none of its inputs arrives "
                "on a stream edge (an edge with stream: true)", en->name);
    }
    for (size_t k = 0; k < g->n_inputs && !b->oom; k++)
        if (!used[k])
            WARN(b, b->cg->inputs[k].pos, "graph input '%s' of graph '%s' feeds no node "
                 "(no node input of that name lacks an edge)", g->inputs[k], g->name);
    free(used);
}

/* Speculation, narrower than the original design allowed (see
 * docs/architecture.md): the worker can run iteration i+1 by itself only when every input it needs from then on is its own loop-back
 * output or a value bound for the whole loop (graph input, persisted). */
static void mark_speculation(builder *b)
{
    graph *g = b->g;
    for (size_t i = 0; i < g->n_entities; i++) {
        graph_entity *en = &g->entities[i];
        if (en->kind != GRAPH_NODE)
            continue;
        graph_node *n = &en->u.node;
        if (!n->async)
            continue;
        const char *why = NULL;
        if (en->depth == 0)
            why = "it is not inside a loop";
        else if (n->stream_input >= 0)
            why = "it has a stream input";
        int self_loopback = 0;
        uint32_t inner = 1u << (en->depth ? en->depth - 1 : 0);
        for (size_t k = 0; k < n->n_inputs && !why; k++) {
            const graph_input *in = &n->inputs[k];
            for (size_t x = 0; x < in->n_edges && !why; x++) {
                const graph_edge *e = &g->edges[in->edges[x]];
                if (e->must_zero & inner)
                    continue; /* only in iteration 0 */
                if (e->loopback && e->producer == (int)i && e->common_depth == en->depth)
                    self_loopback++;
                else if (!(e->persist && e->common_depth < en->depth))
                    why = "an input it needs in later iterations comes from another node";
            }
        }
        if (!why && !self_loopback)
            why = "it has no loop-back input from itself";
        if (why)
            WARN(b, en->pos, "node '%s' is async but cannot be run ahead: %s", en->name, why);
        else
            n->speculative = true;
    }
}

static void make_nodes_meta(builder *b)
{
    graph *g = b->g;
    const cfg_config *cfg = b->cfg;
    for (size_t i = 0; i < g->n_entities; i++) {
        graph_entity *en = &g->entities[i];
        if (en->kind != GRAPH_NODE)
            continue;
        const cfg_node *cn = &b->entity_cfg[i]->u.node;
        graph_node *n = &en->u.node;
        n->model = cn->model;
        n->mode = cn->mode ? cn->mode : "";
        n->consumes_stream = cn->consumes_stream;
        n->async = cn->async;
        n->model_index = -1;
        n->worker = -1;
        for (size_t m = 0; m < cfg->n_models; m++)
            if (cn->model && strcmp(cfg->models[m].name, cn->model) == 0)
                n->model_index = (int)m;
        if (n->model_index < 0) {
            ERR(b, cn->model_pos, "node '%s' runs model '%s', which is not defined", en->name,
                cn->model ? cn->model : "");
            continue;
        }
        const cfg_model *m = &cfg->models[n->model_index];
        n->replicated = cfg_model_replicated(m);
        for (size_t w = 0; m->n_workers && w < cfg->n_workers; w++)
            if (strcmp(cfg->workers[w].name, m->workers[0].s) == 0)
                n->worker = (int)w;
    }
}

static void make_derived(builder *b)
{
    graph *g = b->g;
    for (size_t s = 0; s < g->n_sections && !b->oom; s++) {
        graph_section *sec = &g->sections[s];
        int_vec in = {0}, out = {0}, gin = {0};
        for (size_t ei = 0; ei < g->n_edges; ei++) {
            const graph_edge *e = &g->edges[ei];
            bool p_in = e->producer >= sec->first && e->producer <= sec->last;
            bool c_in = e->consumer >= sec->first && e->consumer <= sec->last;
            if (c_in && !p_in && ivec_push(&in, (int)ei) < 0)
                b->oom = 1;
            if (p_in && !c_in && ivec_push(&out, (int)ei) < 0)
                b->oom = 1;
        }
        for (int en = sec->first; en <= sec->last; en++) {
            if (g->entities[en].kind != GRAPH_NODE)
                continue;
            const graph_node *n = &g->entities[en].u.node;
            for (size_t k = 0; k < n->n_inputs; k++) {
                int gi = n->inputs[k].graph_input;
                if (gi < 0)
                    continue;
                size_t x;
                for (x = 0; x < gin.n && gin.v[x] != gi; x++)
                    ;
                if (x == gin.n && ivec_push(&gin, gi) < 0)
                    b->oom = 1;
            }
        }
        ivec_take(&in, &sec->ext_inputs, &sec->n_ext_inputs);
        ivec_take(&out, &sec->ext_outputs, &sec->n_ext_outputs);
        ivec_take(&gin, &sec->graph_inputs, &sec->n_graph_inputs);
    }
    for (size_t ei = 0; ei < g->n_edges && !b->oom; ei++) {
        const graph_edge *e = &g->edges[ei];
        if (!e->loopback)
            continue;
        graph_entity *loop = &g->entities[g->entities[e->producer].loops[e->common_depth - 1]];
        int_vec iv = {loop->u.loop.loopback_edges, loop->u.loop.n_loopback_edges,
                      loop->u.loop.n_loopback_edges};
        if (ivec_push(&iv, (int)ei) < 0)
            b->oom = 1;
        ivec_take(&iv, &loop->u.loop.loopback_edges, &loop->u.loop.n_loopback_edges);
    }
    int_vec top = {0};
    for (size_t i = 0; i < g->n_entities && !b->oom; i++) {
        graph_entity *en = &g->entities[i];
        if (en->depth > g->max_depth)
            g->max_depth = en->depth;
        if (en->parent_loop < 0) {
            if (ivec_push(&top, (int)i) < 0)
                b->oom = 1;
        } else {
            graph_loop *l = &g->entities[en->parent_loop].u.loop;
            int_vec iv = {l->body, l->n_body, l->n_body};
            if (ivec_push(&iv, (int)i) < 0)
                b->oom = 1;
            ivec_take(&iv, &l->body, &l->n_body);
        }
    }
    ivec_take(&top, &g->top, &g->n_top);
}

static void graph_free(graph *g)
{
    for (size_t i = 0; i < g->n_entities; i++) {
        graph_entity *en = &g->entities[i];
        free(en->values);
        if (en->kind == GRAPH_NODE) {
            for (size_t k = 0; k < en->u.node.n_inputs; k++)
                free(en->u.node.inputs[k].edges);
            free(en->u.node.inputs);
        } else {
            free(en->u.loop.body);
            free(en->u.loop.loopback_edges);
        }
    }
    for (size_t i = 0; i < g->n_values; i++) {
        free(g->values[i].edges);
        free(g->values[i].loop_uses);
    }
    for (size_t i = 0; i < g->n_sections; i++) {
        free(g->sections[i].ext_inputs);
        free(g->sections[i].ext_outputs);
        free(g->sections[i].graph_inputs);
    }
    free(g->entities);
    free(g->edges);
    free(g->values);
    free(g->sections);
    free(g->top);
    free(g->inputs);
}

static int graph_build_one(const cfg_config *cfg, const cfg_graph *cg, bt_diag *diag, graph *g)
{
    builder b = {.cfg = cfg, .cg = cg, .diag = diag, .g = g};
    size_t errors_before = diag->n_errors;
    g->name = cg->name;
    /* The conductor tracks a request's inputs in 64-slot tables. */
    if (cg->n_inputs > GRAPH_MAX_INPUTS)
        bt_diag_error(diag, cg->pos.line, cg->pos.col, "graph '%s' has %zu inputs; at most %d "
                      "are supported", cg->name, cg->n_inputs, GRAPH_MAX_INPUTS);
    g->inputs = calloc(cg->n_inputs ? cg->n_inputs : 1, sizeof(*g->inputs));
    if (!g->inputs)
        return BT_ENOMEM;
    g->n_inputs = cg->n_inputs;
    for (size_t i = 0; i < cg->n_inputs; i++) {
        g->inputs[i] = cg->inputs[i].s;
        for (size_t k = 0; k < cg->n_optional && i < GRAPH_MAX_INPUTS; k++)
            if (strcmp(cg->optional[k].s, cg->inputs[i].s) == 0)
                g->optional |= UINT64_C(1) << i;
    }
    walk_shape(&b, cg->body, -1, -1);
    b.rejected = calloc(g->n_entities + 1, sizeof(*b.rejected));
    if (!b.rejected)
        b.oom = 1;
    if (!b.oom)
        make_nodes_meta(&b);
    if (!b.oom)
        make_values(&b);
    if (!b.oom)
        resolve_loop_values(&b);
    if (!b.oom)
        make_edges(&b);
    if (!b.oom)
        make_inputs(&b);
    if (!b.oom)
        mark_speculation(&b);
    if (!b.oom)
        make_derived(&b);
    free(b.entity_cfg);
    free(b.rejected);
    if (b.oom)
        return BT_ENOMEM;
    return diag->n_errors > errors_before ? BT_ECONFIG : 0;
}

/* The node whose worker a value physically lives on: for a loop value,
 * the node that made the body value it takes. */
static const graph_node *value_node(const graph *g, int value)
{
    for (int guard = 0; value >= 0 && guard < GRAPH_MAX_DEPTH + 2; guard++) {
        const graph_value *v = &g->values[value];
        const graph_entity *p = &g->entities[v->producer];
        if (p->kind == GRAPH_NODE)
            return &p->u.node;
        value = v->source;
    }
    return NULL;
}

graph_transfer_kind graph_transfer_kind_of(bool same_host, bool gpu_from, bool gpu_to)
{
    if (!same_host)
        return gpu_from && gpu_to   ? GRAPH_XFER_NCCL
               : gpu_from || gpu_to ? GRAPH_XFER_NONE
                                    : GRAPH_XFER_SOCKET;
    if (gpu_from && gpu_to)
        return GRAPH_XFER_CUDA_IPC;
    if (!gpu_from && !gpu_to)
        return GRAPH_XFER_SHM;
    return GRAPH_XFER_HOST_STAGED;
}

const char *graph_worker_host(const cfg_worker *w, const char *local_host)
{
    if (w->host)
        return w->host;
    return w->spawn == CFG_SPAWN_AUTO ? local_host : NULL;
}

/* The kind of the transfer FROM -> TO when the config tells both hosts;
 * GRAPH_XFER_REMOTE (decided when both have registered) otherwise. */
static graph_transfer_kind transfer_kind(const cfg_config *cfg, const char *local_host, int from,
                                         int to)
{
    const cfg_worker *a = &cfg->workers[from], *b = &cfg->workers[to];
    const char *ha = graph_worker_host(a, local_host), *hb = graph_worker_host(b, local_host);
    if (!ha || !hb)
        return GRAPH_XFER_REMOTE;
    return graph_transfer_kind_of(strcmp(ha, hb) == 0, a->cuda_index >= 0, b->cuda_index >= 0);
}

/* Warns once per pair of workers about a cross-host transfer the config
 * already dooms: a CPU producer with no peer_listen, or a CPU and a GPU
 * worker on two hosts. */
static void warn_cross_host(const graph_set *gs, bt_diag *diag, const char *local_host)
{
    const cfg_config *cfg = gs->cfg;
    for (size_t t = 0; t < gs->n_transfers; t++) {
        const graph_transfer *x = &gs->transfers[t];
        bool seen = false;
        for (size_t u = 0; u < t && !seen; u++)
            seen = gs->transfers[u].from_worker == x->from_worker &&
                   gs->transfers[u].to_worker == x->to_worker;
        if (seen)
            continue;
        const cfg_worker *a = &cfg->workers[x->from_worker], *b = &cfg->workers[x->to_worker];
        const char *ha = graph_worker_host(a, local_host), *hb = graph_worker_host(b, local_host);
        if (x->kind == GRAPH_XFER_SOCKET && !a->peer_listen)
            bt_diag_warn(diag, a->pos.line, a->pos.col,
                         "worker '%s' (host %s) feeds worker '%s' (host %s) but has no "
                         "'peer_listen': those requests will fail until it gets one", a->name,
                         ha, b->name, hb);
        if (x->kind == GRAPH_XFER_NONE)
            bt_diag_warn(diag, a->pos.line, a->pos.col,
                         "worker '%s' (host %s) feeds worker '%s' (host %s), a CPU and a GPU "
                         "worker on two hosts: that transfer is not built, those requests will "
                         "fail", a->name, ha, b->name, hb);
    }
}

/* The workers node N may run on: its own, or each replica of its model. */
static size_t node_workers(const cfg_config *cfg, const graph_node *n, int *out, size_t cap)
{
    if (n->worker < 0)
        return 0;
    if (!n->replicated) {
        out[0] = n->worker;
        return 1;
    }
    const cfg_model *m = &cfg->models[n->model_index];
    size_t k = 0;
    for (size_t i = 0; i < m->n_workers && k < cap; i++) {
        const cfg_worker *w = cfg_worker_find(cfg, m->workers[i].s);
        if (w)
            out[k++] = (int)(w - cfg->workers);
    }
    return k;
}

/* Records the transfers from node A's worker to node B's for edge EDGE (or
 * graph input INPUT when EDGE < 0).  A replicated end may be any of its
 * replicas, except that two nodes of one replicated model share theirs:
 * a request stays on the replica it picked. */
static int add_transfers(graph_set *gs, size_t *cap, const char *local_host, int gi, int edge,
                         int input, const graph_node *a, const graph_node *b)
{
    const cfg_config *cfg = gs->cfg;
    if (a->replicated && b->replicated && a->model_index == b->model_index)
        return 0;
    int from[64], to[64];
    size_t nf = node_workers(cfg, a, from, 64), nt = node_workers(cfg, b, to, 64);
    for (size_t i = 0; i < nf; i++)
        for (size_t j = 0; j < nt; j++) {
            if (from[i] == to[j])
                continue;
            if (BT_RESERVE(gs->transfers, gs->n_transfers, *cap, 8))
                return BT_ENOMEM;
            gs->transfers[gs->n_transfers++] = (graph_transfer){
                gi, edge, input, from[i], to[j], transfer_kind(cfg, local_host, from[i], to[j])};
        }
    return 0;
}

/* Fills gs->reaches: each graph's transfers, closed transitively, then
 * joined.  A backend may return an input as its output without a copy
 * (echo does), so a tensor can travel several edges of its graph while it
 * stays in its first owner's pool; the closure names every pool a worker
 * may be asked to read.  Tensors never pass from one graph to another, so
 * the closure is taken per graph. */
static int reach(graph_set *gs)
{
    size_t n = gs->cfg->n_workers;
    gs->reaches = calloc(n ? n * n : 1, sizeof(*gs->reaches));
    bool *r = calloc(n ? n * n : 1, sizeof(*r));
    if (!gs->reaches || !r) {
        free(r);
        return BT_ENOMEM;
    }
    for (size_t gi = 0; gi < gs->n_graphs; gi++) {
        memset(r, 0, n * n * sizeof(*r));
        for (size_t t = 0; t < gs->n_transfers; t++) {
            const graph_transfer *x = &gs->transfers[t];
            if (x->graph == (int)gi)
                r[(size_t)x->to_worker * n + (size_t)x->from_worker] = true;
        }
        for (size_t k = 0; k < n; k++)
            for (size_t to = 0; to < n; to++)
                if (r[to * n + k])
                    for (size_t from = 0; from < n; from++)
                        r[to * n + from] |= r[k * n + from];
        for (size_t i = 0; i < n * n; i++)
            gs->reaches[i] |= r[i];
    }
    free(r);
    return 0;
}

static int partition(graph_set *gs, bt_diag *diag)
{
    const cfg_config *cfg = gs->cfg;
    /* Workers batond spawns without a `host:` run here. */
    char local_host[256] = "";
    if (gethostname(local_host, sizeof(local_host) - 1) != 0)
        snprintf(local_host, sizeof(local_host), "localhost");
    size_t nw = cfg->n_workers;
    int_vec *per = calloc(nw ? nw : 1, sizeof(*per));
    size_t cap = 0;
    int rc = 0;
    if (!per)
        return BT_ENOMEM;
    for (size_t gi = 0; gi < gs->n_graphs && !rc; gi++) {
        const graph *g = &gs->graphs[gi];
        for (size_t i = 0; i < g->n_entities && !rc; i++) {
            const graph_entity *en = &g->entities[i];
            if (en->kind != GRAPH_NODE || en->u.node.model_index < 0)
                continue;
            /* A tensor-parallel node runs on every worker of its model, a
             * replicated one on any of them. */
            const cfg_model *m = &cfg->models[en->u.node.model_index];
            for (size_t k = 0; k < m->n_workers && !rc; k++) {
                const cfg_worker *w = cfg_worker_find(cfg, m->workers[k].s);
                if (w)
                    rc = ivec_push(&per[w - cfg->workers], (int)(gi << 16 | i));
            }
        }
        for (size_t ei = 0; ei < g->n_edges && !rc; ei++) {
            const graph_edge *e = &g->edges[ei];
            if (e->consumer < 0)
                continue;
            const graph_node *from = value_node(g, e->value);
            if (from)
                rc = add_transfers(gs, &cap, local_host, (int)gi, (int)ei, -1, from,
                                   &g->entities[e->consumer].u.node);
        }
        /* A graph input lands on the worker of its first consumer; the
         * others read it from there. */
        for (size_t k = 0; k < g->n_inputs && !rc; k++) {
            const graph_node *home = NULL;
            for (size_t i = 0; i < g->n_entities && !rc; i++) {
                const graph_entity *en = &g->entities[i];
                if (en->kind != GRAPH_NODE)
                    continue;
                for (size_t x = 0; x < en->u.node.n_inputs && !rc; x++) {
                    if (en->u.node.inputs[x].graph_input != (int)k || en->u.node.worker < 0)
                        continue;
                    if (!home)
                        home = &en->u.node;
                    else
                        rc = add_transfers(gs, &cap, local_host, (int)gi, -1, (int)k, home,
                                           &en->u.node);
                }
            }
        }
    }
    if (rc) {
        rc = BT_ENOMEM;
        goto out;
    }
    gs->worker_nodes = calloc(nw ? nw : 1, sizeof(*gs->worker_nodes));
    gs->n_worker_nodes = calloc(nw ? nw : 1, sizeof(*gs->n_worker_nodes));
    if (!gs->worker_nodes || !gs->n_worker_nodes) {
        rc = BT_ENOMEM;
        goto out;
    }
    for (size_t w = 0; w < nw; w++)
        ivec_take(&per[w], &gs->worker_nodes[w], &gs->n_worker_nodes[w]);
    if ((rc = reach(gs)) != 0)
        goto out;
    if (diag)
        warn_cross_host(gs, diag, local_host);
out:
    for (size_t w = 0; w < nw; w++)
        free(per[w].v);
    free(per);
    return rc;
}

int graph_set_build(const cfg_config *cfg, bt_diag *diag, graph_set **out)
{
    int rc = BT_ENOMEM;
    *out = NULL;
    graph_set *gs = calloc(1, sizeof(*gs));
    if (!gs)
        return BT_ENOMEM;
    gs->cfg = cfg;
    gs->graphs = calloc(cfg->n_graphs ? cfg->n_graphs : 1, sizeof(*gs->graphs));
    if (!gs->graphs)
        goto err;
    gs->n_graphs = cfg->n_graphs;
    bool failed = false;
    for (size_t i = 0; i < cfg->n_graphs; i++) {
        gs->graphs[i].index = i;
        rc = graph_build_one(cfg, &cfg->graphs[i], diag, &gs->graphs[i]);
        if (rc == BT_ENOMEM)
            goto err;
        failed |= rc != 0;
    }
    if (failed) {
        rc = BT_ECONFIG;
        goto err;
    }
    rc = partition(gs, diag);
    if (rc)
        goto err;
    *out = gs;
    return 0;
err:
    graph_set_destroy(gs);
    return rc;
}

void graph_set_destroy(graph_set *gs)
{
    if (!gs)
        return;
    for (size_t i = 0; i < gs->n_graphs; i++)
        graph_free(&gs->graphs[i]);
    free(gs->graphs);
    if (gs->worker_nodes)
        for (size_t w = 0; w < gs->cfg->n_workers; w++)
            free(gs->worker_nodes[w]);
    free(gs->worker_nodes);
    free(gs->n_worker_nodes);
    free(gs->transfers);
    free(gs->reaches);
    free(gs);
}

bool graph_set_reaches(const graph_set *gs, int from, int to)
{
    size_t n = gs->cfg->n_workers;
    assert(from >= 0 && to >= 0 && (size_t)from < n && (size_t)to < n);
    return gs->reaches[(size_t)to * n + (size_t)from];
}

const graph *graph_set_find(const graph_set *gs, const char *name)
{
    for (size_t i = 0; i < gs->n_graphs; i++)
        if (strcmp(gs->graphs[i].name, name) == 0)
            return &gs->graphs[i];
    return NULL;
}

const char *graph_edge_kind_name(graph_edge_kind k)
{
    switch (k) {
    case GRAPH_EDGE_FORWARD: return "forward";
    case GRAPH_EDGE_LOOPBACK: return "loop-back";
    case GRAPH_EDGE_EXTERNAL: return "external";
    case GRAPH_EDGE_CLIENT: return "client";
    }
    return "?";
}

const char *graph_transfer_kind_name(graph_transfer_kind k)
{
    switch (k) {
    case GRAPH_XFER_SHM: return "shm (map the producer's pool, read in place)";
    case GRAPH_XFER_CUDA_IPC:
        return "cuda-ipc (open the producer's pool once; read in place on one GPU, copied "
               "between two)";
    case GRAPH_XFER_HOST_STAGED:
        return "host-staged (the consumer copies between host and GPU memory)";
    case GRAPH_XFER_REMOTE:
        return "decided at registration (a host the config does not give)";
    case GRAPH_XFER_SOCKET:
        return "socket (cross-host: the consumer pulls the bytes from the producer's peer_listen)";
    case GRAPH_XFER_NCCL:
        return "nccl (cross-host GPU: send and receive over the pair's communicator)";
    case GRAPH_XFER_NONE: return "none (a CPU and a GPU on two hosts: not built, requests fail)";
    }
    return "?";
}
