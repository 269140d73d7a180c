/* Shared pieces of the benchmarks in tests/bench/ (README.md there):
 * clocks and order statistics, a batond started from a config template in a
 * private folder, helper processes, command-line options, and the machine
 * description every JSON report starts with.
 *
 * Benchmarks are not tests: nothing here asserts a time.  A benchmark exits
 * non-zero only when the system answered wrongly (a status other than OK, a
 * token out of order), never because a target was missed. */
#ifndef BATON_BENCH_UTIL_H
#define BATON_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "baton/client.h"

/* Monotonic clock in microseconds (and nanoseconds). */
double bench_now_us(void);
uint64_t bench_now_ns(void);

/* ---- order statistics ----------------------------------------------------- */

/* Sorts V in place, ascending. */
void bench_sort(double *v, size_t n);

/* The P-quantile (0..1) of sorted V by linear interpolation; 0 when N is 0. */
double bench_quantile(const double *sorted, size_t n, double p);

/* The median of V (N values, not modified). */
double bench_median(const double *v, size_t n);

/* The arithmetic mean of V. */
double bench_mean(const double *v, size_t n);

/* ---- options -------------------------------------------------------------- */

typedef struct bench_opts {
    const char *build;   /* build folder: $BUILD or "build" */
    char batond[512];    /* the daemon: BUILD/batond unless --batond */
    char configs[512];   /* config templates: tests/bench/configs unless --configs */
    char json[512];      /* report: BUILD/bench/NAME.json unless --json */
    bool quick;          /* --quick: a fraction of the samples, for a smoke run */
} bench_opts;

/* Parses the options every benchmark takes (--quick, --json PATH,
 * --batond PATH, --configs DIR, --help); exits with a usage line on an
 * unknown one. */
void bench_opts_parse(bench_opts *o, const char *name, int argc, char **argv);

/* ---- a daemon under test -------------------------------------------------- */

typedef struct bench_daemon {
    pid_t pid;           /* batond; 0 when not running */
    char dir[256];       /* private folder: config, sockets, log */
    char endpoint[300];  /* ipc://DIR/baton.sock */
    char log[300];       /* DIR/batond.log */
} bench_daemon;

/* Starts O->batond on the config template TEMPLATE (a file name inside
 * O->configs) with every "/tmp/baton-bench" replaced by a fresh private
 * folder, and waits until its health says ready (30 s).  SUBST (NULL: none)
 * holds more (from, to) string pairs to replace first, NULL-terminated.
 * Returns 0, or -1 with the reason (and the daemon's log tail) on stderr. */
int bench_daemon_start(bench_daemon *d, const bench_opts *o, const char *template_name,
                       const char *const *subst);

/* As bench_daemon_start, for a daemon whose clients connect to ENDPOINT
 * (NULL: ipc://DIR/baton.sock; otherwise used as given) with COPTS (NULL:
 * defaults): a tcp:// endpoint with CURVE keys, say. */
int bench_daemon_start_with(bench_daemon *d, const bench_opts *o, const char *template_name,
                            const char *const *subst, const char *endpoint,
                            const baton_client_options *copts);

/* SIGTERM, wait (10 s, then SIGKILL), remove the private folder. */
void bench_daemon_stop(bench_daemon *d);

/* ---- helper processes ----------------------------------------------------- */

/* Forks a child that runs FN(ARG) and exits with its return value; the child
 * gets SIGTERM when this process dies.  Call before any ZeroMQ context is
 * created in this process.  Returns the pid, or -1. */
pid_t bench_spawn(int (*fn)(void *), void *arg);

/* SIGTERM then reap (SIGKILL after 5 s). */
void bench_reap(pid_t pid);

/* Creates a private folder /tmp/baton-bench-XXXXXX into BUF; removes it. */
int bench_mkdtemp(char *buf, size_t len);
void bench_rmtree(const char *dir);

/* Waits until the server at ENDPOINT answers health with ready (TIMEOUT_MS).
 * Returns 0 or -1. */
int bench_wait_ready(const char *endpoint, int timeout_ms);
/* The same with client options COPTS (NULL: defaults). */
int bench_wait_ready_with(const char *endpoint, const baton_client_options *copts,
                          int timeout_ms);

/* ---- where the CPU goes --------------------------------------------------- */

/* CPU time and context switches of every thread of a process so far, read
 * from /proc/PID/task/TID/schedstat (nanoseconds) and .../status. */
typedef struct bench_cpu {
    uint64_t cpu_ns;  /* on-CPU time, all threads */
    uint64_t ctxsw;   /* voluntary + involuntary context switches, all threads */
} bench_cpu;

/* Reads PID's totals into *OUT (zeros when the process is gone). */
void bench_cpu_read(pid_t pid, bench_cpu *out);

/* The pids of PID's children, up to MAX (from /proc/N/stat); returns how
 * many. */
size_t bench_children(pid_t pid, pid_t *out, size_t max);

/* The child of PID whose command line holds the argument NAME (a worker's
 * config name follows --name), or 0. */
pid_t bench_child_named(pid_t pid, const char *name);

/* ---- reports -------------------------------------------------------------- */

/* Writes `"machine": {...}` (no trailing comma): CPU model, online CPUs,
 * memory, kernel, and that no GPU was used. */
void bench_json_machine(FILE *f);

/* One line describing the machine, for the table headers. */
void bench_machine_line(char *buf, size_t len);

/* Opens O->json for writing, creating its folder; NULL with a message. */
FILE *bench_json_open(const bench_opts *o);

#endif
