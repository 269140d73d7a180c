/* The multi-stream scheduler on CPU threads: graphs of spin ops of known
 * cost (compute-role and comm-role ops that busy-wait COST microseconds),
 * predicted against measured makespan, and the measured speed-up of the
 * multi-stream executable over the same graph forced serial.  These are
 * CPU-thread figures (2 cores here), not CUDA streams.  Writes
 * BUILD/bench/sched.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/exec.h"
#include "tests/bench/util.h"

#define MAX_OPS 64

typedef struct costs {
    double us[MAX_OPS];
} costs;

static int spin_op(const kx_op_ctx *c)
{
    const costs *k = c->user;
    double until = bench_now_us() + k->us[c->op_id];
    while (bench_now_us() < until)
        ;
    return 0;
}

static int v(kg_graph *g, kg_kind kind)
{
    int64_t n = 64;
    return kg_value_add(g, "", kind, KD_F32, 1, &n);
}

/* Chains of compute (NA ops of A us) and comm (NC ops of C us) from one
 * input, joined by one compute op of J us; ALTERNATE instead builds one
 * chain alternating compute and comm ops (nothing can overlap). */
static kg_graph *build(costs *k, int na, double a, int nc, double c, double j, bool alternate)
{
    kg_graph *g = kg_create();
    int x = v(g, KG_INPUT), pa = x, pc = x;
    if (alternate) {
        for (int i = 0; i < na; i++) {
            int y = v(g, KG_INTER);
            int id = kg_op_add(g, i % 2 ? KOP_ALLREDUCE : KOP_MATMUL, &pa, 1, &y, 1, NULL, 0, -1, -1);
            k->us[id] = i % 2 ? c : a;
            pa = y;
        }
        int y = v(g, KG_OUTPUT);
        k->us[kg_op_add(g, KOP_ADD, &pa, 1, &y, 1, NULL, 0, -1, -1)] = j;
        return g;
    }
    for (int i = 0; i < na || i < nc; i++) {
        if (i < na) {
            int y = v(g, KG_INTER);
            k->us[kg_op_add(g, KOP_MATMUL, &pa, 1, &y, 1, NULL, 0, -1, -1)] = a;
            pa = y;
        }
        if (i < nc) {
            int y = v(g, KG_INTER);
            k->us[kg_op_add(g, KOP_ALLREDUCE, &pc, 1, &y, 1, NULL, 0, -1, -1)] = c;
            pc = y;
        }
    }
    int in[2] = {pa, pc};
    int y = v(g, KG_OUTPUT);
    k->us[kg_op_add(g, KOP_ADD, in, 2, &y, 1, NULL, 0, -1, -1)] = j;
    return g;
}

static double median_run(kx_exec *x, int runs)
{
    double t[64];
    kx_run(x);  /* warm the threads */
    for (int r = 0; r < runs; r++) {
        double t0 = bench_now_us();
        if (kx_run(x)) {
            fprintf(stderr, "bench_sched: run failed\n");
            exit(1);
        }
        t[r] = bench_now_us() - t0;
    }
    return bench_median(t, (size_t)runs);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "sched", argc, argv);
    int runs = o.quick ? 5 : 31;
    struct cas {
        const char *name;
        int na;
        double a;
        int nc;
        double c, j;
        bool alt;
        double pred_serial, pred_multi, meas_serial, meas_sched;
        bool multi;
        size_t events;
    } cases[] = {
        {"2 chains 8x500us + 8x500us", 8, 500, 8, 500, 200, false, 0, 0, 0, 0, false, 0},
        {"2 chains 10x400us + 5x400us", 10, 400, 5, 400, 200, false, 0, 0, 0, 0, false, 0},
        {"2 chains 16x100us + 16x100us", 16, 100, 16, 100, 100, false, 0, 0, 0, 0, false, 0},
        {"alternating chain 12x300us", 12, 300, 0, 300, 100, true, 0, 0, 0, 0, false, 0},
    };
    size_t nc = sizeof cases / sizeof cases[0];
    const ks_profile *cpu = ks_profile_builtin("cpu");
    char machine[256];
    bench_machine_line(machine, sizeof machine);
    printf("scheduler: predicted vs measured makespan, CPU threads as streams "
           "(1 compute + 1 comm), sync %.0f us\n%s\n", cpu->sync_overhead_us, machine);
    printf("%-30s %10s %10s %8s %10s %10s %7s %8s\n", "graph", "pred ser", "pred sch", "decision",
           "meas ser", "meas sch", "err", "speedup");
    for (size_t i = 0; i < nc; i++) {
        struct cas *c = &cases[i];
        costs k;
        memset(&k, 0, sizeof k);
        kg_graph *g = build(&k, c->na, c->a, c->nc, c->c, c->j, c->alt);
        double cost_s[MAX_OPS];
        for (size_t j = 0; j < g->n_ops; j++)
            cost_s[j] = k.us[j] * 1e-6;
        kx_op_table t = {{0}, &k};
        t.fn[KOP_MATMUL] = t.fn[KOP_ALLREDUCE] = t.fn[KOP_ADD] = spin_op;
        kx_options os = {cpu, cost_s, 1, 1, true}, om = {cpu, cost_s, 1, 1, false};
        kx_exec *xs, *xm;
        if (kx_compile(g, &t, &os, &xs) || kx_compile(g, &t, &om, &xm)) {
            fprintf(stderr, "bench_sched: compile failed\n");
            return 1;
        }
        float in[64] = {0};
        kx_input_bind(xs, 0, in, sizeof in);
        kx_input_bind(xm, 0, in, sizeof in);
        const ks_schedule *s = kx_schedule(xm);
        c->multi = s->multi;
        c->events = s->n_events;
        c->pred_serial = s->serial_s * 1e6;
        c->pred_multi = s->multi_s * 1e6;
        c->meas_serial = median_run(xs, runs);
        c->meas_sched = median_run(xm, runs);
        double pred = c->multi ? c->pred_multi : c->pred_serial;
        printf("%-30s %8.0fus %8.0fus %8s %8.0fus %8.0fus %+6.1f%% %7.2fx\n", c->name,
               c->pred_serial, c->pred_multi, c->multi ? "multi" : "serial", c->meas_serial,
               c->meas_sched, 100 * (c->meas_sched - pred) / pred, c->meas_serial / c->meas_sched);
        kx_destroy(xs);
        kx_destroy(xm);
        kg_destroy(g);
    }
    printf("err: measured makespan of the executable the scheduler chose against its prediction "
           "(target within 15%%); speedup: forced-serial over chosen, measured.\n");
    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\n  \"bench\": \"sched\",\n  ");
        bench_json_machine(f);
        fprintf(f, ",\n  \"note\": \"CPU threads as streams (1 compute + 1 comm); spin ops of known cost; "
                   "not CUDA\",\n  \"runs\": %d,\n  \"rows\": [\n", runs);
        for (size_t i = 0; i < nc; i++) {
            struct cas *c = &cases[i];
            fprintf(f, "    {\"graph\": \"%s\", \"predicted_serial_us\": %.1f, \"predicted_multi_us\": %.1f, "
                       "\"decision\": \"%s\", \"events\": %zu, \"measured_serial_us\": %.1f, "
                       "\"measured_chosen_us\": %.1f}%s\n",
                    c->name, c->pred_serial, c->pred_multi, c->multi ? "multi" : "serial", c->events,
                    c->meas_serial, c->meas_sched, i + 1 < nc ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    return 0;
}
