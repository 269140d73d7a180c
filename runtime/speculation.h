/* Speculation windows: an `async` loop node may run ahead of its loop on
 * its worker, feeding itself its own loop-back outputs.  Dispatching it
 * grants a window (iterations up to spec_upto); each completion the loop
 * takes moves the window on (EXTEND); the end of the loop or the request
 * closes it (DROP).  Events the worker reports for iterations the loop has
 * not reached yet are buffered on the node until it does.  Sits above
 * core.c, below registry.c. */
#ifndef BATON_RUNTIME_SPECULATION_H
#define BATON_RUNTIME_SPECULATION_H

#include "runtime/core.h"

/* True when (NODE, V) lies inside the node's open window, past the
 * iteration that was dispatched. */
bool spec_in_window(const rt_request *r, int node, const rt_iter *v);

/* Opens a window for NODE dispatched at V when it may run ahead; returns
 * the last iteration it may run to, or 0 when no window opens. */
uint32_t spec_grant(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);

/* NODE completed iteration V: moves its window on (EXTEND), or closes it
 * when the loop ends with V. */
void spec_advance(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);

/* Closes NODE's window after LAST, the last valid iteration: DROP what lies
 * past it and forget what was buffered. */
void spec_close(rt_runtime *rt, rt_request *r, int node, uint32_t last);

/* The request ends: DROP every open window past what was processed. */
void spec_drop_all(rt_runtime *rt, rt_request *r);

/* Buffers an event of a speculative iteration (holding its tensors). */
void spec_pend_push(rt_runtime *rt, rt_request *r, int node, const pend *src);

#endif
