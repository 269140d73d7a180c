/* The registry: how values reach the nodes that consume them.  A value a
 * producer emits is delivered along each edge to the slot of the consumer
 * iteration it is for (or bound for a whole loop instance when the edge
 * persists); a node whose current iteration has every input it needs is
 * dispatched.  Sits above core.c and speculation.c, below progress.c. */
#ifndef BATON_RUNTIME_REGISTRY_H
#define BATON_RUNTIME_REGISTRY_H

#include "runtime/core.h"

/* Producer iteration P of value VALUE emitted tensor T (id 0: none) and,
 * with FINAL, closed its production: deliver it along every edge, to the
 * client, and into the loop values made from it. */
void reg_emit(rt_runtime *rt, rt_request *r, int value, const rt_iter *p, rt_tensor t,
              bool final);
/* Dispatches (NODE, V) when V is its current iteration and its inputs are
 * all there; inside a speculation window it is marked running and replayed
 * instead. */
void reg_try_dispatch(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);
/* reg_try_dispatch for every node among entities FIRST..LAST at its
 * current iteration. */
void reg_try_dispatch_range(rt_runtime *rt, rt_request *r, int first, int last);

#endif
