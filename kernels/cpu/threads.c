/* The CPU kernels' thread pool (threads.h).
 *
 * A run publishes FN and ARG, then bumps the generation counter; each
 * thread that sees a new generation calls FN and decrements the count of
 * threads still running, which the caller spins on.  Threads that see no
 * new generation for SPIN_NS sleep on the counter with FUTEX_WAIT, and the
 * caller wakes them only when some are asleep (the `sleepers` count), so a
 * run between busy ops costs a few cache-line transfers and no system call. */
#include "kernels/cpu/threads.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long an idle thread spins before it sleeps: long enough to span the
 * gap between two ops of a step and between two decode steps of a busy
 * worker, short enough that an idle worker stops costing CPU at once. */
#define SPIN_NS 200000

/* Pause instructions the caller of a run spends waiting for the other
 * threads before it yields its CPU instead (a few microseconds). */
#define YIELD_AFTER 2000

typedef struct kth_thread {
    kth_pool *p;
    int ith;
    pthread_t t;
} kth_thread;

struct kth_pool {
    int n;                            /* threads per run, the caller's included */
    kth_thread *th;                   /* [n - 1], owned */
    _Atomic uint32_t gen;             /* bumped once per run (and at stop) */
    _Atomic int running;              /* threads of the current run not done */
    _Atomic int sleepers;             /* threads in FUTEX_WAIT or about to be */
    _Atomic int stop;
    kth_fn fn;                        /* the current run's; written before gen */
    void *arg;
    pthread_mutex_t hold;             /* kth_acquire */
    void *scratch;                    /* kth_scratch, owned */
    size_t scratch_bytes;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Waits for the generation to move past SEEN and returns the new one. */
static uint32_t wait_gen(kth_pool *p, uint32_t seen)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
        if ((i & 255) != 255)
            continue;
        /* Between polls of the clock, let a runnable thread that shares
         * this CPU go first: the thread that will start the next run may be
         * that one. */
        if (i > 4096)
            sched_yield();
        uint64_t t = now_ns();
        if (!t0) {
            t0 = t;
            continue;
        }
        if (t - t0 < SPIN_NS)
            continue;
        /* Announce the sleep before checking once more, so that a run
         * started in between either sees the sleeper and wakes it or was
         * published before the check. */
        atomic_fetch_add(&p->sleepers, 1);
        if (atomic_load(&p->gen) == seen)
            futex_wait(&p->gen, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        t0 = 0;
    }
}

static void *thread_main(void *arg)
{
    kth_thread *t = arg;
    kth_pool *p = t->p;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load(&p->stop))
            return NULL;
        p->fn(p->arg, t->ith, p->n);
        atomic_fetch_sub_explicit(&p->running, 1, memory_order_release);
    }
}

int kth_pool_create(int n_threads, kth_pool **out)
{
    *out = NULL;
    if (n_threads < 1)
        return -EINVAL;
    kth_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->hold, NULL);
    if (n_threads > 1 && !(p->th = calloc((size_t)n_threads - 1, sizeof(*p->th)))) {
        kth_pool_destroy(p);
        return -ENOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        kth_thread *t = &p->th[i - 1];
        t->p = p;
        t->ith = i;
        int rc = pthread_create(&t->t, NULL, thread_main, t);
        if (rc) {
            p->n = i; /* kth_pool_destroy joins the ones that started */
            kth_pool_destroy(p);
            return -rc;
        }
    }
    *out = p;
    return 0;
}

void kth_pool_destroy(kth_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->th[i - 1].t, NULL);
    free(p->th);
    free(p->scratch);
    pthread_mutex_destroy(&p->hold);
    free(p);
}

int kth_pool_size(const kth_pool *p)
{
    return p ? p->n : 1;
}

int kth_acquire(kth_pool *p)
{
    if (!p)
        return -EBUSY;
    return pthread_mutex_trylock(&p->hold) == 0 ? 0 : -EBUSY;
}

void kth_release(kth_pool *p)
{
    if (p)
        pthread_mutex_unlock(&p->hold);
}

void kth_run(kth_pool *p, kth_fn fn, void *arg)
{
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->running, p->n - 1, memory_order_relaxed);
    /* Sequentially consistent, like the sleeper's increment and check in
     * wait_gen: of the two, one sees the other. */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
    fn(arg, 0, p->n);
    /* Spin for the others, but not for long: on a machine with more
     * runnable threads than CPUs, one of them may have been descheduled,
     * and spinning through its time slice would hold the CPU it needs. */
    for (unsigned i = 0; atomic_load_explicit(&p->running, memory_order_acquire) > 0; i++) {
        if (i < YIELD_AFTER)
            cpu_relax();
        else
            sched_yield();
    }
}

void *kth_scratch(kth_pool *p, size_t bytes)
{
    if (bytes <= p->scratch_bytes)
        return p->scratch;
    free(p->scratch);
    size_t want = (bytes + 63) & ~(size_t)63;
    p->scratch = aligned_alloc(64, want);
    p->scratch_bytes = p->scratch ? want : 0;
    return p->scratch;
}

void kth_split(int n, int grain, int ith, int nth, int *lo, int *hi)
{
    if (grain < 1)
        grain = 1;
    int chunks = (n + grain - 1) / grain;
    int c0 = (int)((int64_t)chunks * ith / nth), c1 = (int)((int64_t)chunks * (ith + 1) / nth);
    *lo = c0 * grain < n ? c0 * grain : n;
    *hi = c1 * grain < n ? c1 * grain : n;
}
