/* The op-graph IR of executable graphs.
 *
 * A graph is a list of values (tensors with a dtype, a shape and a size in
 * bytes) and a list of ops over them, kept in topological order: an op may
 * only read values that exist before it runs (graph inputs, parameters,
 * persistent handles, or the outputs of earlier ops).  The arena planner
 * (kernels/arena.h), the cost model and scheduler (kernels/sched.h) and the
 * compiler to an executable (kernels/exec.h) all read it; nothing here
 * allocates tensor memory.
 *
 * Values are named by their index (an int id); ops likewise.  Names of
 * values are for parameters and handles (set and read by name) and for
 * reports. */
#ifndef BATON_KERNELS_GRAPH_H
#define BATON_KERNELS_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"
#include "kernels/ops.h"

#define KG_MAX_DIMS 4
#define KG_MAX_IO 8     /* inputs, and outputs, of one op */
#define KG_MAX_ATTRS 8
#define KG_NAME_LEN 48

/* Who owns a value's memory and how long it lives. */
typedef enum kg_kind {
    KG_INPUT = 0,   /* bound by the caller per run, by slot; read-only */
    KG_OUTPUT,      /* in the arena, readable after a run until the next one */
    KG_PARAM,       /* weights: set once by name, owned by the executable */
    KG_INTER,       /* in the arena, dead after its last use */
    KG_HANDLE       /* persistent state (a KV cache): outlives runs, not in the arena */
} kg_kind;

typedef struct kg_value {
    char name[KG_NAME_LEN];
    kg_kind kind;
    kdtype dtype;
    int ndim;
    int64_t shape[KG_MAX_DIMS];  /* elements per dim, outermost first */
    size_t bytes;                /* kdtype_bytes(dtype, product of shape) */
    int slot;                    /* KG_INPUT: input slot; KG_OUTPUT: output index; else -1 */
    int producer;                /* the op that writes it (the last one for handles); -1 */
    int dynamic;                 /* 1: shape[0] is a bucketed dim (compiled at its upper extent) */
} kg_value;

typedef struct kg_op {
    kop op;
    int n_in, n_out;
    int in[KG_MAX_IO];           /* value ids */
    int out[KG_MAX_IO];          /* value ids */
    int n_attr;
    int64_t attr[KG_MAX_ATTRS];  /* op-specific integers (heads, eps in 1e-9, ...) */
    double flops;                /* floating-point operations; -1 when unknown */
    double bytes;                /* bytes moved to and from memory; -1 when unknown */
} kg_op;

typedef struct kg_graph {
    kg_value *values;            /* owned; n_values of them */
    size_t n_values, cap_values;
    kg_op *ops;                  /* owned; in topological order */
    size_t n_ops, cap_ops;
    int n_inputs;                /* input slots 0..n_inputs-1 */
    int n_outputs;               /* output indices 0..n_outputs-1 */
} kg_graph;

kg_graph *kg_create(void);
void kg_destroy(kg_graph *g);  /* NULL is a no-op */

/* Adds a value; returns its id (>= 0) or a negative bt_err.  Inputs and
 * outputs get the next slot / output index in the order they are added. */
int kg_value_add(kg_graph *g, const char *name, kg_kind kind, kdtype dtype, int ndim,
                 const int64_t *shape);

/* Marks value V's outermost dim as dynamic (bucketed compilation). */
int kg_value_set_dynamic(kg_graph *g, int v);

/* Adds op OP reading IN[N_IN] and writing OUT[N_OUT] with attributes
 * ATTR[N_ATTR] and the given cost figures (-1: unknown).  Checks the
 * topological order: every input is an input, parameter, handle or an
 * earlier op's output; every output is an intermediate or output not yet
 * written, or a handle (updated in place).  Returns the op id or a status. */
int kg_op_add(kg_graph *g, kop op, const int *in, int n_in, const int *out, int n_out,
              const int64_t *attr, int n_attr, double flops, double bytes);

/* kg_op_add for an op with the one output OUT, costed as streaming its
 * operands: BYTES is the size of every input and of the output, once
 * each, which is what a roofline wants from such a kernel. */
int kg_op_add_streamed(kg_graph *g, kop op, const int *in, int n_in, int out,
                       const int64_t *attr, int n_attr, double flops);

/* A real-valued attribute as int64 (the bits of a double), and back. */
static inline int64_t kg_attr_f(double v)
{
    int64_t i;
    memcpy(&i, &v, sizeof(i));
    return i;
}
static inline double kg_attr_to_f(int64_t a)
{
    double d;
    memcpy(&d, &a, sizeof(d));
    return d;
}

/* The value called NAME, or -1. */
int kg_value_find(const kg_graph *g, const char *name);

/* The bytes an op's inputs and outputs occupy (the byte-count heuristic of
 * the cost model where an op carries no figures of its own). */
double kg_op_io_bytes(const kg_graph *g, size_t op);

/* For every value, the last op (by index in ORDER, a permutation of the ops
 * given as op ids; NULL: graph order) that reads it, written into
 * LAST_USE[n_values] as a position in ORDER (-1: never read).  Outputs are
 * not special-cased here. */
void kg_last_uses(const kg_graph *g, const int *order, int *last_use);

const char *kg_kind_name(kg_kind k);

#endif
