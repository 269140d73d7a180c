/* The cost model and multi-stream scheduler of executable graphs.
 *
 * Costs come from an analytic roofline over a device profile: a compute op
 * takes max(flops / peak, bytes / (memory bandwidth x efficiency)), a
 * collective bytes / (link bandwidth x efficiency), a fused compute +
 * collective op the sum of the two (conservative: the overlap inside a fused
 * kernel is not modelled).  An op without figures is costed by the bytes of
 * its inputs and outputs over the bandwidth of its resource.  Every cost is
 * at least KS_MIN_COST_S, so ranks strictly decrease along every edge.
 *
 * Scheduling: upward ranks (an op's cost plus the largest rank among its
 * consumers plus the cross-stream sync overhead), ops taken by rank
 * descending (ties: graph order), each put on the allowed stream where it
 * finishes earliest (ties: lowest stream).  Compute ops go on compute
 * streams, collectives on the comm stream, fused ops on a compute stream
 * while holding the comm stream too.  An input produced on another stream
 * costs the sync overhead.  Event record/wait pairs are placed only on
 * cross-stream edges.  The multi-stream schedule is used only when its
 * predicted makespan beats the serial one (the sum of the costs); otherwise
 * every op runs on stream 0 in graph order. */
#ifndef BATON_KERNELS_SCHED_H
#define BATON_KERNELS_SCHED_H

#include <stdbool.h>
#include <stddef.h>

#include "baton/backend.h"
#include "kernels/graph.h"

#define KS_MIN_COST_S 1e-6  /* floor on every op's cost, seconds */
#define KS_MAX_STREAMS 8

/* A device profile is the backend ABI's (include/baton/backend.h, the
 * bottom layer): the ABI, the YAML `devices:` entries (config/config.h
 * cfg_profile) and the cost model share its one definition, so a profile
 * passes from the config through the worker to a backend and into the
 * scheduler without a copy field by field. */
typedef baton_device_profile ks_profile;

/* The built-in profile "cpu", "h100" or "h200", or NULL; sched.c says
 * where their figures come from.  ks_profile_builtins lists them all. */
const ks_profile *ks_profile_builtin(const char *name);
const ks_profile *ks_profile_builtins(size_t *n);

/* The cost in seconds of op OP of G on profile P (floored). */
double ks_op_cost(const ks_profile *p, const kg_graph *g, size_t op);

/* Streams: compute streams are ids 0..n_compute-1, the comm stream (at most
 * one) is id n_compute. */
typedef struct ks_config {
    int n_compute;            /* >= 1 */
    int n_comm;               /* 0 or 1; 0 puts collectives on compute streams */
    double sync_s;            /* cross-stream sync overhead, seconds */
    bool force_serial;        /* skip the multi-stream attempt */
} ks_config;

typedef struct ks_schedule {
    size_t n_ops;
    int n_streams;            /* compute streams + comm stream */
    int n_compute;
    bool multi;               /* the multi-stream schedule is in use */
    double serial_s;          /* predicted serial makespan, seconds */
    double multi_s;           /* predicted multi-stream makespan, seconds */
    double *cost;             /* per op, seconds */
    double *rank;             /* per op, upward rank, seconds */
    int *stream;              /* per op: the stream it runs on (fused: its compute stream) */
    double *start, *end;      /* per op, predicted, seconds (of the schedule in use) */
    int *order;               /* ops in dispatch order (predicted start, ties by id) */
    /* Per stream, the entries it executes in order.  An entry is an op id;
     * on the comm stream a fused op appears too, as a reservation: the comm
     * stream holds still until the fused op on its compute stream is done. */
    int *stream_ops[KS_MAX_STREAMS];
    size_t stream_n[KS_MAX_STREAMS];
    /* Per op, the ops on other streams it waits for (event waits), CSR:
     * wait_op[wait_off[i] .. wait_off[i+1]) ; an op in there records an
     * event after it runs. */
    size_t *wait_off;
    int *wait_op;
    bool *records;            /* per op: records an event */
    size_t n_events;          /* ops that record */
} ks_schedule;

/* Builds the schedule of G with per-op costs COST_S (seconds; NULL: all
 * KS_MIN_COST_S) under CFG.  Returns 0 or a KG_E* status. */
int ks_schedule_build(const kg_graph *g, const double *cost_s, const ks_config *cfg,
                      ks_schedule **out);
void ks_schedule_destroy(ks_schedule *s);

/* A human-readable report: predicted serial and multi-stream makespans, the
 * decision, and each stream's ops.  Returns what snprintf would. */
int ks_schedule_report(const ks_schedule *s, const kg_graph *g, char *buf, size_t len);

#endif
