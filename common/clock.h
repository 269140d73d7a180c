/* The monotonic clock, in the units callers keep: deadlines and timers in
 * milliseconds, latencies in microseconds, the worker's item times in
 * nanoseconds. */
#ifndef BATON_COMMON_CLOCK_H
#define BATON_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t bt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec;
}

static inline uint64_t bt_now_us(void)
{
    return bt_now_ns() / 1000;
}

static inline uint64_t bt_now_ms(void)
{
    return bt_now_us() / 1000;
}

#endif
