/* The arena planner: every intermediate and output of
 * an executable graph lives at a planned offset in one arena, and two
 * values share bytes only when they are never live at the same time.
 *
 * Planning works on items (a size and a lifetime [first, last] in steps of
 * an execution order, both ends inclusive).  Two items conflict when their
 * lifetimes intersect, or, where the caller passes a conflict predicate
 * (the multi-stream executor does: lifetimes there are a happens-before
 * relation, not a line), when it says so.
 *
 * The heuristic is "greedy by size" (as TFLite's and ONNX Runtime's memory
 * planners): items by size descending, each put at the offset of the
 * smallest gap between already-placed conflicting items that holds it, or
 * above all of them.  Two gap choices (best fit and lowest fit) are tried
 * and the smaller arena kept.  The peak-live lower bound (the largest sum of
 * sizes live at one step) is what no plan can beat; reports compare with it. */
#ifndef BATON_KERNELS_ARENA_H
#define BATON_KERNELS_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/graph.h"

#define KA_ALIGN 256  /* bytes; every offset is a multiple of it */
#define KA_NONE ((size_t)-1)  /* offset of a value not in the arena */

typedef struct ka_item {
    size_t size;    /* bytes */
    int first;      /* step of its definition */
    int last;       /* step of its last use (>= first) */
    size_t offset;  /* planned: bytes from the arena base */
} ka_item;

/* Whether items A and B may not share bytes; CTX is the caller's. */
typedef bool (*ka_conflict_fn)(void *ctx, size_t a, size_t b);

/* Plans ITEMS[N]: sets every offset (a multiple of ALIGN, a power of two)
 * and *ARENA to the bytes the arena needs.  CONFLICT NULL: lifetimes
 * intersect.  Returns 0 or BT_ENOMEM / BT_EINVAL. */
int ka_plan(ka_item *items, size_t n, size_t align, ka_conflict_fn conflict, void *ctx,
            size_t *arena);

/* The peak-live lower bound: the largest sum of item sizes live at one step. */
size_t ka_peak_live(const ka_item *items, size_t n);

/* A plan of a graph's arena values (intermediates and outputs). */
typedef struct ka_graph_plan {
    size_t *offset;        /* per value id; KA_NONE outside the arena; owned */
    size_t arena;          /* bytes */
    size_t lower_bound;    /* peak-live bytes in the given order */
    size_t n_items;        /* values in the arena */
} ka_graph_plan;

/* Plans G's intermediates and outputs for execution in ORDER (op ids, NULL:
 * graph order): a value lives from the step of its producer to the step of
 * its last reader; outputs live to the end of the run.  CONFLICT (NULL:
 * lifetimes) is called with value ids.  Fills *P; release with
 * ka_graph_plan_free. */
int ka_plan_graph(const kg_graph *g, const int *order, size_t align, ka_conflict_fn conflict,
                  void *ctx, ka_graph_plan *p);
void ka_graph_plan_free(ka_graph_plan *p);

#endif
