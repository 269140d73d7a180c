/* The op-graph IR (kernels/graph.h): growable arrays of values and ops with
 * the topological-order check done as ops are added, so every later pass can
 * walk ops in index order without sorting. */
#include "kernels/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

kg_graph *kg_create(void)
{
    return calloc(1, sizeof(kg_graph));
}

void kg_destroy(kg_graph *g)
{
    if (!g)
        return;
    free(g->values);
    free(g->ops);
    free(g);
}

int kg_value_add(kg_graph *g, const char *name, kg_kind kind, kdtype dtype, int ndim,
                 const int64_t *shape)
{
    if (!g || ndim < 0 || ndim > KG_MAX_DIMS || (ndim > 0 && !shape) || kind > KG_HANDLE)
        return BT_EINVAL;
    if (BT_RESERVE(g->values, g->n_values, g->cap_values, 16))
        return BT_ENOMEM;
    kg_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof(*v));
    snprintf(v->name, sizeof(v->name), "%s", name ? name : "");
    v->kind = kind;
    v->dtype = dtype;
    v->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return BT_EINVAL;
        v->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    v->bytes = kdtype_bytes(dtype, n);
    v->producer = -1;
    v->slot = kind == KG_INPUT ? g->n_inputs++ : kind == KG_OUTPUT ? g->n_outputs++ : -1;
    return (int)g->n_values++;
}

int kg_value_set_dynamic(kg_graph *g, int v)
{
    if (!g || v < 0 || (size_t)v >= g->n_values || g->values[v].ndim < 1)
        return BT_EINVAL;
    g->values[v].dynamic = 1;
    return 0;
}

int kg_op_add(kg_graph *g, kop op, const int *in, int n_in, const int *out, int n_out,
              const int64_t *attr, int n_attr, double flops, double bytes)
{
    if (!g || op >= KOP_COUNT || n_in < 0 || n_in > KG_MAX_IO || n_out < 1 ||
        n_out > KG_MAX_IO || n_attr < 0 || n_attr > KG_MAX_ATTRS)
        return BT_EINVAL;
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || (size_t)in[i] >= g->n_values)
            return BT_EINVAL;
        const kg_value *v = &g->values[in[i]];
        if ((v->kind == KG_INTER || v->kind == KG_OUTPUT) && v->producer < 0)
            return BT_EORDER;
    }
    for (int i = 0; i < n_out; i++) {
        if (out[i] < 0 || (size_t)out[i] >= g->n_values)
            return BT_EINVAL;
        const kg_value *v = &g->values[out[i]];
        if (v->kind == KG_INPUT || v->kind == KG_PARAM)
            return BT_EREDEF;
        if (v->kind != KG_HANDLE && v->producer >= 0)
            return BT_EREDEF;
        for (int j = 0; j < i; j++)
            if (out[j] == out[i])
                return BT_EREDEF;
    }
    if (BT_RESERVE(g->ops, g->n_ops, g->cap_ops, 16))
        return BT_ENOMEM;
    kg_op *o = &g->ops[g->n_ops];
    memset(o, 0, sizeof(*o));
    o->op = op;
    o->n_in = n_in;
    o->n_out = n_out;
    if (n_in)
        memcpy(o->in, in, (size_t)n_in * sizeof(int));
    memcpy(o->out, out, (size_t)n_out * sizeof(int));
    o->n_attr = n_attr;
    if (n_attr)
        memcpy(o->attr, attr, (size_t)n_attr * sizeof(int64_t));
    o->flops = flops;
    o->bytes = bytes;
    for (int i = 0; i < n_out; i++)
        g->values[out[i]].producer = (int)g->n_ops;
    return (int)g->n_ops++;
}

int kg_value_find(const kg_graph *g, const char *name)
{
    for (size_t i = 0; g && name && i < g->n_values; i++)
        if (strcmp(g->values[i].name, name) == 0)
            return (int)i;
    return -1;
}

double kg_op_io_bytes(const kg_graph *g, size_t op)
{
    const kg_op *o = &g->ops[op];
    double b = 0;
    for (int i = 0; i < o->n_in; i++)
        b += (double)g->values[o->in[i]].bytes;
    for (int i = 0; i < o->n_out; i++)
        b += (double)g->values[o->out[i]].bytes;
    return b;
}

void kg_last_uses(const kg_graph *g, const int *order, int *last_use)
{
    for (size_t v = 0; v < g->n_values; v++)
        last_use[v] = -1;
    for (size_t p = 0; p < g->n_ops; p++) {
        const kg_op *o = &g->ops[order ? (size_t)order[p] : p];
        for (int i = 0; i < o->n_in; i++)
            if (last_use[o->in[i]] < (int)p)
                last_use[o->in[i]] = (int)p;
    }
}

const char *kg_kind_name(kg_kind k)
{
    static const char *names[] = {"input", "output", "param", "inter", "handle"};
    return k <= KG_HANDLE ? names[k] : "?";
}

int kg_op_add_streamed(kg_graph *g, kop op, const int *in, int n_in, int out,
                       const int64_t *attr, int n_attr, double flops)
{
    if (!g || out < 0 || (size_t)out >= g->n_values || n_in < 0 || n_in > KG_MAX_IO)
        return BT_EINVAL;
    double bytes = (double)g->values[out].bytes;
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || (size_t)in[i] >= g->n_values)
            return BT_EINVAL;
        bytes += (double)g->values[in[i]].bytes;
    }
    return kg_op_add(g, op, in, n_in, &out, 1, attr, n_attr, flops, bytes);
}
