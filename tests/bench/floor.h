/* The floor of the dispatch round trip (bench_roundtrip.c): a conductor and
 * a worker with nothing but ZeroMQ and protobuf-c, each in a process of its
 * own, speaking baton's own messages.
 *
 *   client DEALER ──▶ conductor ROUTER ──▶ worker DEALER
 *                     parses the ClientMessage,  parses the Dispatch,
 *                     packs a Dispatch           packs a Done
 *   client ◀───────── conductor ◀──────────────── worker
 *                     parses the Done, packs the InferResponse
 *
 * The conductor answers health probes (ready once the worker said hello),
 * so the C client library drives it exactly as it drives batond.  What it
 * lacks is everything baton adds: the graph runtime, a pool, the worker's
 * executor and its threads, releases and sessions.
 *
 * A request for the graph "pattern" instead exchanges the messages batond
 * exchanges for a one-node request, in the same order, still without any of
 * the machinery: Put → Placed, Dispatch → Done, then SessionClose and
 * Release before the response.  It is a diagnostic: the difference between
 * the two floors is what baton's message pattern costs, and the rest of
 * baton's time is its own code and threads.  Any other graph is answered by
 * the plain floor. */
#ifndef BATON_BENCH_FLOOR_H
#define BATON_BENCH_FLOOR_H

#include <sys/types.h>

typedef struct bench_floor_args {
    char front[300]; /* client endpoint (the conductor's ROUTER binds it) */
    char back[300];  /* worker endpoint (the conductor's ROUTER binds it) */
} bench_floor_args;

/* Process bodies for bench_spawn: they run until killed. */
int bench_floor_conductor_main(void *args);
int bench_floor_worker_main(void *args);

/* A running floor: its two processes and the private folder of their
 * ipc:// endpoints. */
typedef struct bench_floor {
    char dir[256];
    bench_floor_args a;     /* a.front: where clients connect */
    pid_t conductor, worker;
} bench_floor;

/* Forks the floor's processes.  Call before any ZeroMQ context exists in
 * this process (forking one that holds a context is undefined).  Returns 0,
 * or -1 with nothing left behind. */
int bench_floor_start(bench_floor *f);
/* Stops both processes and removes the folder. */
void bench_floor_stop(bench_floor *f);

#endif
