/* The human-readable summary of a graph set: what --check-config prints
 * and what `batonctl inspect` shows: graphs, loops, producers, partition. */
#include "config/graph.h"

#include <string.h>

static void print_edge(const graph *g, const graph_edge *e, FILE *out)
{
    const graph_value *v = &g->values[e->value];
    const char *role = v->role == GRAPH_VALUE_LOOP_LAST ? " (last iteration)"
                       : v->role == GRAPH_VALUE_LOOP_ACCUM ? " (every iteration, joined)" : "";
    fprintf(out, "%s.%s%s -> %s", g->entities[e->producer].name, v->name, role,
            e->consumer < 0 ? "client" : g->entities[e->consumer].name);
    if (e->consumer < 0 && strcmp(e->client_name, v->name) != 0)
        fprintf(out, " as %s", e->client_name);
    fprintf(out, " [%s", graph_edge_kind_name(e->kind));
    if (e->loopback && e->kind != GRAPH_EDGE_LOOPBACK)
        fprintf(out, ", loop-back");
    if (e->persist)
        fprintf(out, ", persist");
    if (e->stream)
        fprintf(out, ", stream");
    if (e->new_token)
        fprintf(out, ", new_token");
    if (e->consumer < 0)
        fprintf(out, ", %s", e->modality);
    if (e->shard_dim)
        fprintf(out, ", shard_dim %u", e->shard_dim);
    fprintf(out, "]");
}

static void print_entity(const graph_set *gs, const graph *g, int idx, int indent, FILE *out)
{
    const graph_entity *en = &g->entities[idx];
    if (en->kind == GRAPH_NODE) {
        const graph_node *n = &en->u.node;
        const char *wname = n->worker >= 0 ? gs->cfg->workers[n->worker].name : "?";
        fprintf(out, "%*snode %s: model %s, mode '%s', on ", indent, "", en->name, n->model,
                n->mode);
        if (n->replicated) {
            /* Every replica, in the order listed: the request picks one. */
            const cfg_model *m = &gs->cfg->models[n->model_index];
            for (size_t k = 0; k < m->n_workers; k++)
                fprintf(out, "%s%s", k ? " or " : "", m->workers[k].s);
            fprintf(out, " (one replica per request)");
        } else {
            fprintf(out, "%s", wname);
        }
        fprintf(out, "%s%s%s\n", n->consumes_stream ? ", consumes a stream" : "",
                n->async ? ", async" : "", n->speculative ? " (speculation window)" : "");
        for (size_t k = 0; k < n->n_inputs; k++) {
            const graph_input *in = &n->inputs[k];
            fprintf(out, "%*s  input %s", indent, "", in->name);
            if (in->graph_input >= 0) {
                fprintf(out, " <- graph input\n");
                continue;
            }
            if (en->depth)
                fprintf(out, " (fan-in %u in iteration 0, %u after)", in->fanin_first,
                        in->fanin_later);
            fprintf(out, "\n");
            for (size_t x = 0; x < in->n_edges; x++) {
                fprintf(out, "%*s    <- ", indent, "");
                print_edge(g, &g->edges[in->edges[x]], out);
                fprintf(out, "\n");
            }
        }
        for (size_t ei = 0; ei < g->n_edges; ei++)
            if (g->edges[ei].producer == idx && g->edges[ei].consumer < 0) {
                fprintf(out, "%*s  output ", indent, "");
                print_edge(g, &g->edges[ei], out);
                fprintf(out, "\n");
            }
        return;
    }
    const graph_loop *l = &en->u.loop;
    const graph_section *sec = &g->sections[en->section];
    fprintf(out, "%*sloop %s: max_iters %u\n", indent, "", en->name, l->max_iters);
    for (size_t k = 0; k < sec->n_ext_inputs; k++) {
        fprintf(out, "%*s  external input: ", indent, "");
        print_edge(g, &g->edges[sec->ext_inputs[k]], out);
        fprintf(out, "\n");
    }
    for (size_t k = 0; k < sec->n_graph_inputs; k++)
        fprintf(out, "%*s  graph input: %s (bound in every iteration)\n", indent, "",
                g->inputs[sec->graph_inputs[k]]);
    for (size_t k = 0; k < l->n_loopback_edges; k++) {
        fprintf(out, "%*s  loop-back: ", indent, "");
        print_edge(g, &g->edges[l->loopback_edges[k]], out);
        fprintf(out, "\n");
    }
    for (size_t k = 0; k < sec->n_ext_outputs; k++) {
        fprintf(out, "%*s  leaves: ", indent, "");
        print_edge(g, &g->edges[sec->ext_outputs[k]], out);
        fprintf(out, "\n");
    }
    for (size_t k = 0; k < l->n_body; k++)
        print_entity(gs, g, l->body[k], indent + 2, out);
}

void graph_set_print(const graph_set *gs, FILE *out)
{
    const cfg_config *cfg = gs->cfg;
    fprintf(out, "workers:\n");
    for (size_t w = 0; w < cfg->n_workers; w++) {
        const cfg_worker *wk = &cfg->workers[w];
        fprintf(out, "  %s: device %s, pool %llu MiB, streams %u compute + %u comm, spawn %s",
                wk->name, wk->device, (unsigned long long)wk->pool_mb, wk->streams_compute,
                wk->streams_comm, wk->spawn == CFG_SPAWN_AUTO ? "auto" : "external");
        if (wk->host)
            fprintf(out, ", host %s", wk->host);
        if (wk->peer_listen)
            fprintf(out, ", peer_listen %s", wk->peer_listen);
        fprintf(out, "\n");
    }
    fprintf(out, "models:\n");
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        fprintf(out, "  %s: backend %s, max_batch %u, on", md->name, md->backend, md->max_batch);
        for (size_t k = 0; k < md->n_workers; k++)
            fprintf(out, " %s", md->workers[k].s);
        if (md->tp > 1)
            fprintf(out, " (tensor parallel %u)", md->tp);
        if (cfg_model_replicated(md))
            fprintf(out, " (%zu replicas, routing %s)", md->n_workers,
                    cfg_routing_name(md->routing));
        fprintf(out, "\n");
    }
    for (size_t gi = 0; gi < gs->n_graphs; gi++) {
        const graph *g = &gs->graphs[gi];
        size_t nn = 0, nl = 0;
        for (size_t i = 0; i < g->n_entities; i++)
            g->entities[i].kind == GRAPH_NODE ? nn++ : nl++;
        fprintf(out, "graph %s: %zu nodes, %zu loops, %zu edges; inputs:", g->name, nn, nl,
                g->n_edges);
        for (size_t k = 0; k < g->n_inputs; k++)
            fprintf(out, " %s%s", g->inputs[k], g->optional >> k & 1 ? " (optional)" : "");
        fprintf(out, "\n");
        for (size_t k = 0; k < g->n_top; k++)
            print_entity(gs, g, g->top[k], 2, out);
    }
    fprintf(out, "partition:\n");
    for (size_t w = 0; w < cfg->n_workers; w++) {
        fprintf(out, "  %s:", cfg->workers[w].name);
        if (!gs->n_worker_nodes[w])
            fprintf(out, " (no nodes)");
        for (size_t k = 0; k < gs->n_worker_nodes[w]; k++) {
            int code = gs->worker_nodes[w][k];
            const graph *g = &gs->graphs[code >> 16];
            fprintf(out, " %s/%s", g->name, g->entities[code & 0xffff].name);
        }
        fprintf(out, "\n");
    }
    fprintf(out, "transfers:%s\n", gs->n_transfers ? "" : " none (every edge stays on its worker)");
    for (size_t t = 0; t < gs->n_transfers; t++) {
        const graph_transfer *x = &gs->transfers[t];
        const graph *g = &gs->graphs[x->graph];
        fprintf(out, "  %s: ", g->name);
        if (x->edge >= 0)
            print_edge(g, &g->edges[x->edge], out);
        else
            fprintf(out, "graph input %s", g->inputs[x->graph_input]);
        fprintf(out, ": %s -> %s, %s\n", cfg->workers[x->from_worker].name,
                cfg->workers[x->to_worker].name, graph_transfer_kind_name(x->kind));
    }
}
