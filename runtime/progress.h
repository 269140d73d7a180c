/* Progress: what moves a request on.  A node's completion closes the
 * values it made (registry.c delivers them), raises its loop's finish
 * signal, moves its speculation window on, and completes its iteration; a
 * loop whose body has completed an iteration ends (its last and
 * accumulated values leave) or advances; a request whose top-level
 * entities have completed ends with one RESPONSE.  The top of the layers
 * below runtime.c. */
#ifndef BATON_RUNTIME_PROGRESS_H
#define BATON_RUNTIME_PROGRESS_H

#include "runtime/core.h"

/* (NODE, V) completed with OUTS; FINISH raises its loop's finish signal,
 * USAGE (may be NULL) adds to the request's token counts.  An event for an
 * iteration inside the node's speculation window that the loop has not
 * reached is buffered; any other unexpected one is ignored. */
void prog_node_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                    const rt_value_out *outs, size_t n_outs, bool finish, const rt_usage *usage);
void prog_node_chunk(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, int value,
                     rt_tensor t, bool final);
void prog_node_failed(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                      bt_code code, const char *message);
/* Plays the events buffered for (NODE, V), which the loop has now reached. */
void prog_replay(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);

/* Ends R: one RESPONSE (outputs only with OK), DROPs for open windows, a
 * RELEASE for every tensor it still holds; R is freed after the event. */
void prog_end(rt_runtime *rt, rt_request *r, bt_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
