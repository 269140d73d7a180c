/* The conductor's client connections, by ZeroMQ routing identity: how many
 * requests each has accepted, and the replies it has not read yet.
 *
 * The client ROUTER has a finite send high-water mark and is
 * ROUTER_MANDATORY, so ZeroMQ refuses (EAGAIN) a reply to a connection
 * whose pipe is full instead of queueing it without bound.  Such a reply
 * waits here, in the connection's backlog, in order, and counts against
 * that connection's bound (client_max_reply_bytes); a connection with a
 * backlog that makes no progress for client_stall_timeout_ms is dropped.
 * The frontend admits against these counts (daemon/frontend.h), the
 * outbound module sends through the backlog (daemon/outbound.h).  A leaf:
 * it sends nothing itself. */
#ifndef BATON_DAEMON_CLIENTS_H
#define BATON_DAEMON_CLIENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/u64map.h"

/* How long a client refused for want of room still counts as busy when
 * max_inflight is shared out (daemon/frontend.c): long enough for its
 * retry to find its share kept. */
#define CL_REFUSED_KEEP_MS 1000

/* One packed reply. */
typedef struct cl_frame {
    struct cl_frame *next;
    size_t len;
    uint8_t data[];
} cl_frame;

typedef struct cl_client {
    struct cl_client *next;       /* the next client with the same hash */
    uint64_t hkey;
    uint8_t *identity;            /* owned */
    size_t identity_len;
    uint32_t inflight;            /* requests accepted and not yet answered */
    cl_frame *head, *tail;        /* the backlog: replies ZeroMQ would not take yet */
    struct cl_client *wait_prev, *wait_next; /* in cl_table.waiting while the backlog is
                                               * not empty */
    size_t n_backlog;
    uint64_t backlog_bytes;
    uint64_t stalled_since_ms;    /* monotonic ms since which the backlog made no progress;
                                   * 0: no backlog */
    uint64_t refused_ms;          /* when a request of it was last refused for want of
                                   * room (it counts as busy for a while: fair shares) */
} cl_client;

typedef struct cl_table {
    u64map by_hash;               /* hkey -> first client of the chain */
    size_t n;                     /* clients */
    size_t busy;                  /* clients with inflight > 0 */
    uint64_t backlog_bytes;       /* over every client */
    cl_client *waiting;           /* the clients with a backlog, so that it is sent on
                                   * without a walk over every client */
} cl_table;

void cl_init(cl_table *t);
/* Frees every client and its backlog. */
void cl_free(cl_table *t);

/* The client of this identity, or NULL. */
cl_client *cl_find(const cl_table *t, const uint8_t *id, size_t len);
/* The same, created when missing; NULL when out of memory. */
cl_client *cl_get(cl_table *t, const uint8_t *id, size_t len);
/* Frees C when nothing keeps it: no request, no backlog, no recent
 * refusal (before NOW_MS - KEEP_MS). */
void cl_release_if_idle(cl_table *t, cl_client *c, uint64_t now_ms, uint64_t keep_ms);
/* Removes C and frees its backlog, whatever it holds. */
void cl_remove(cl_table *t, cl_client *c);

/* A request of C was accepted, or ended. */
void cl_inflight_add(cl_table *t, cl_client *c);
void cl_inflight_sub(cl_table *t, cl_client *c);

/* Appends F (taken) to C's backlog; pops its head (the caller frees it). */
void cl_backlog_push(cl_table *t, cl_client *c, cl_frame *f, uint64_t now_ms);
cl_frame *cl_backlog_pop(cl_table *t, cl_client *c, uint64_t now_ms);

/* Every client, for a walk that may remove some: a malloc'ed array of N
 * pointers (NULL when there are none or out of memory). */
cl_client **cl_list(const cl_table *t, size_t *n);
/* Checks T's sums and lists against its entries (the fuzzer's and the
 * tests' audit; nothing calls it on the request path): 0, or -1 with the
 * first disagreement in WHY. */
int cl_check(const cl_table *t, char *why, size_t len);

#endif
