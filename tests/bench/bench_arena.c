/* Arena planning on the transformer graphs: SmolLM2-135M shapes (hidden
 * 576, 30 layers, 9/3 heads of 64, FFN 1536, vocab 49152), prefill of 128
 * tokens and one decode step against a KV cache of 512, batch 1 and 16.
 * Prints the planned arena against the peak-live lower bound (target: at
 * most 1.10x) and writes BUILD/bench/arena.json.  Planning only: nothing
 * is timed and no kernel runs. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/arena.h"
#include "backends/transformer/model.h"
#include "tests/bench/util.h"

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "arena", argc, argv);
    ktf_shape s = ktf_shape_smollm2_135m();
    struct row {
        const char *graph;
        int batch;
        kg_graph *g;
        ka_graph_plan p;
    } rows[4] = {{"prefill T=128", 1, NULL, {0}},
                 {"prefill T=128", 16, NULL, {0}},
                 {"decode ctx=512", 1, NULL, {0}},
                 {"decode ctx=512", 16, NULL, {0}}};
    int bad = 0;
    printf("arena planning, SmolLM2-135M shapes (greedy by size, %d-byte alignment)\n", KA_ALIGN);
    printf("%-16s %5s %6s %14s %14s %7s\n", "graph", "batch", "values", "arena bytes", "lower bound",
           "ratio");
    for (int i = 0; i < 4; i++) {
        struct row *r = &rows[i];
        r->g = i < 2 ? ktf_build_prefill(&s, r->batch, 128, 512) : ktf_build_decode(&s, r->batch, 512);
        if (!r->g || ka_plan_graph(r->g, NULL, KA_ALIGN, NULL, NULL, &r->p)) {
            fprintf(stderr, "bench_arena: cannot build or plan %s\n", r->graph);
            return 1;
        }
        double ratio = (double)r->p.arena / (double)r->p.lower_bound;
        bad |= r->p.arena < r->p.lower_bound;  /* a plan below the bound is a planner bug */
        printf("%-16s %5d %6zu %14zu %14zu %6.3fx\n", r->graph, r->batch, r->p.n_items, r->p.arena,
               r->p.lower_bound, ratio);
    }
    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\n  \"bench\": \"arena\",\n  ");
        bench_json_machine(f);
        fprintf(f, ",\n  \"model\": \"SmolLM2-135M shapes\",\n  \"target_ratio\": 1.10,\n  \"rows\": [\n");
        for (int i = 0; i < 4; i++)
            fprintf(f, "    {\"graph\": \"%s\", \"batch\": %d, \"ops\": %zu, \"values\": %zu, "
                       "\"arena_bytes\": %zu, \"lower_bound_bytes\": %zu, \"ratio\": %.4f}%s\n",
                    rows[i].graph, rows[i].batch, rows[i].g->n_ops, rows[i].p.n_items, rows[i].p.arena,
                    rows[i].p.lower_bound, (double)rows[i].p.arena / (double)rows[i].p.lower_bound,
                    i < 3 ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    for (int i = 0; i < 4; i++) {
        ka_graph_plan_free(&rows[i].p);
        kg_destroy(rows[i].g);
    }
    return bad;
}
