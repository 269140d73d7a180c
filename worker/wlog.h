/* Logging of the worker: one line per message on stderr, prefixed
 * "baton-worker[NAME]" so that lines of several workers under one conductor
 * read apart, with the level after it.  Thread-safe (one fprintf per line). */
#ifndef BATON_WORKER_WLOG_H
#define BATON_WORKER_WLOG_H

typedef enum wk_log_level {
    WK_LOG_ERROR = 0,
    WK_LOG_WARNING = 1,
    WK_LOG_INFO = 2,
    WK_LOG_DEBUG = 3
} wk_log_level;

/* Sets the prefix's NAME (copied) and the level: error|warning|info|debug;
 * an unknown or NULL level keeps info.  Returns 0, or -1 for an unknown
 * level (which is then reported by the caller). */
int wk_log_setup(const char *name, const char *level);

int wk_log_enabled(wk_log_level level);

void wk_log(wk_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define wk_error(...) wk_log(WK_LOG_ERROR, __VA_ARGS__)
#define wk_warn(...) wk_log(WK_LOG_WARNING, __VA_ARGS__)
#define wk_info(...) wk_log(WK_LOG_INFO, __VA_ARGS__)
#define wk_debug(...)                                                                          \
    do {                                                                                       \
        if (wk_log_enabled(WK_LOG_DEBUG))                                                      \
            wk_log(WK_LOG_DEBUG, __VA_ARGS__);                                                 \
    } while (0)

#endif
