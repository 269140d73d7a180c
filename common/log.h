/* Logging to stderr, the one logger of every baton process.  Under systemd
 * (JOURNAL_STREAM set) each line starts with its syslog priority, "<3>" for
 * errors, so journald files it right; on a terminal it starts with a time
 * stamp, the process's name ("batond", "baton-worker[gpu0]") and the level
 * name.  Thread-safe: one write per line, so lines of concurrent threads
 * (and of processes sharing a terminal) never interleave. */
#ifndef BATON_COMMON_LOG_H
#define BATON_COMMON_LOG_H

#include <stdbool.h>
#include <stdint.h>

typedef enum bt_log_level {
    BT_LOG_ERROR = 3,   /* syslog LOG_ERR */
    BT_LOG_WARNING = 4, /* LOG_WARNING */
    BT_LOG_INFO = 6,    /* LOG_INFO */
    BT_LOG_DEBUG = 7    /* LOG_DEBUG */
} bt_log_level;

/* Sets the name printed on every line (copied) and the threshold.  Call it
 * before other threads log. */
void bt_log_init(const char *ident, bt_log_level level);
void bt_log_set_level(bt_log_level level);
bt_log_level bt_log_get_level(void);
/* Whether a message of LEVEL would be printed. */
bool bt_log_enabled(bt_log_level level);
/* Parses "error", "warning", "info", "debug"; returns BT_LOG_INFO otherwise. */
bt_log_level bt_log_level_parse(const char *name);
/* The same, but says whether NAME was one of them: 0, or BT_EINVAL with
 * *OUT left alone. */
int bt_log_level_from_name(const char *name, bt_log_level *out);

void bt_log(bt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define bt_error(...) bt_log(BT_LOG_ERROR, __VA_ARGS__)
#define bt_warn(...) bt_log(BT_LOG_WARNING, __VA_ARGS__)
#define bt_info(...) bt_log(BT_LOG_INFO, __VA_ARGS__)
/* A warning a peer can provoke again and again (a client retrying every
 * 100 ms, a forged registration) is printed at most once a second, saying
 * how many came meanwhile.  Zero-initialised; one per kind of warning. */
typedef struct bt_log_gate {
    uint64_t last_ms;             /* when one was last let through, monotonic ms; 0: never */
    uint64_t count;               /* occurrences since then, this one included */
} bt_log_gate;
/* Counts one occurrence at NOW_MS (monotonic ms); true when it is to be
 * printed now, with *COUNT the occurrences it stands for (itself and those
 * held back since the last one printed). */
bool bt_log_gate_pass(bt_log_gate *g, uint64_t now_ms, uint64_t *count);

/* Debug lines are many and off by default: their arguments are not even
 * formatted unless debug is on. */
#define bt_debug(...)                                                                          \
    do {                                                                                       \
        if (bt_log_enabled(BT_LOG_DEBUG))                                                      \
            bt_log(BT_LOG_DEBUG, __VA_ARGS__);                                                 \
    } while (0)

#endif
