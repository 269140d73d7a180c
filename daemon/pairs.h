/* The conductor's view of the pair communicators of cross-host GPU
 * transfers (docs/architecture.md, "Transfers"), and the numbering of the
 * transfers on each.
 *
 * A pair of workers (a, b) has at most one communicator the conductor
 * relays transfers to: the one whose id the lower-indexed worker sent last
 * (PairId, with its epoch).  Every transfer on it gets the next number of
 * the pair's one counter, for both directions: NCCL matches a pair's sends
 * and receives by the order the two ranks issue them, and each worker
 * issues them in the order the conductor sends them, which is the order
 * of these numbers.  When either worker is lost or registers again the
 * pair is forgotten until the next PairId. */
#ifndef BATON_DAEMON_PAIRS_H
#define BATON_DAEMON_PAIRS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pair_table pair_table;

/* A table for N_WORKERS workers; NULL when out of memory. */
pair_table *pairs_create(size_t n_workers);
void pairs_destroy(pair_table *t);

/* Workers A and B (in either order, distinct) formed communicator EPOCH:
 * transfers on it are numbered from 1 again.  BT_EINVAL for a bad pair. */
int pairs_made(pair_table *t, int a, int b, uint32_t epoch);
/* Worker W is lost or starts over: its pairs have no communicator. */
void pairs_forget(pair_table *t, int w);
/* Reserves N consecutive transfer numbers on the communicator of (A, B):
 * the first in *SEQ, its epoch in *EPOCH.  False when the pair has none. */
bool pairs_reserve(pair_table *t, int a, int b, uint32_t n, uint32_t *epoch, uint64_t *seq);

#endif
