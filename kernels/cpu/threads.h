/* A persistent pool of threads for the CPU kernels.
 *
 * A decode step of a small model is a few hundred ops of tens of
 * microseconds each, so starting threads per op (or waking them through a
 * condition variable, which costs about as much as the op) would eat the
 * gain.  The pool's threads are started once and, between runs, spin on a
 * generation counter for a short while before they sleep on a futex: ops
 * that follow each other within a step find them awake.
 *
 * The model is ggml's: kth_run calls FN(ARG, ith, nth) on every thread of
 * the pool at once, the caller's thread being ith 0, and returns when all
 * have returned; each call splits its work by ith itself.
 *
 * One run at a time: a pool belongs to whoever holds it (kth_acquire), so
 * two streams of one executable that reach a parallel op together do not
 * share threads: the second runs its op alone on its own thread. */
#ifndef BATON_KERNELS_CPU_THREADS_H
#define BATON_KERNELS_CPU_THREADS_H

#include <stddef.h>

typedef struct kth_pool kth_pool;

/* Starts N_THREADS - 1 threads (the caller is the N-th).  N_THREADS 1 gives a
 * pool with no thread of its own, whose runs are plain calls.  Returns 0 or
 * -errno; *OUT NULL on error. */
int kth_pool_create(int n_threads, kth_pool **out);

/* Stops and joins the threads.  NULL is a no-op.  No run may be in flight. */
void kth_pool_destroy(kth_pool *p);

/* Threads a run uses, the caller's included; 1 for NULL. */
int kth_pool_size(const kth_pool *p);

/* Takes the pool for the calling thread: 0, or -EBUSY when another thread
 * holds it.  NULL: -EBUSY (there are no threads to take). */
int kth_acquire(kth_pool *p);
void kth_release(kth_pool *p);

typedef void (*kth_fn)(void *arg, int ith, int nth);

/* Runs FN on every thread of P, the caller as ith 0, and returns when all
 * have returned.  The caller must hold P (kth_acquire).  Every run is a full
 * barrier: what the threads wrote is visible to the caller afterwards. */
void kth_run(kth_pool *p, kth_fn fn, void *arg);

/* Scratch memory of at least BYTES, 64-byte aligned, owned by P and valid
 * until the next call or kth_release; for the holder only.  NULL when out of
 * memory. */
void *kth_scratch(kth_pool *p, size_t bytes);

/* Rows [*lo, *hi) of N that thread ITH of NTH takes, in chunks of GRAIN rows
 * (the last chunk may be short). */
void kth_split(int n, int grain, int ith, int nth, int *lo, int *hi);

#endif
