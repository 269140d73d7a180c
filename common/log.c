/* The logger (common/log.h). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/status.h"

static char log_ident[128] = "baton";
/* Read by every thread that logs, written by the one that configures; an
 * atomic keeps that race defined. */
static _Atomic int log_level = BT_LOG_INFO;
static _Atomic int log_journal = -1; /* -1: not yet known */

void bt_log_init(const char *ident, bt_log_level level)
{
    snprintf(log_ident, sizeof(log_ident), "%s", ident);
    log_level = level;
    log_journal = getenv("JOURNAL_STREAM") != NULL;
}

void bt_log_set_level(bt_log_level level)
{
    log_level = level;
}

bt_log_level bt_log_get_level(void)
{
    return (bt_log_level)log_level;
}

bool bt_log_enabled(bt_log_level level)
{
    return (int)level <= log_level;
}

int bt_log_level_from_name(const char *name, bt_log_level *out)
{
    static const struct {
        const char *name;
        bt_log_level level;
    } levels[] = {{"error", BT_LOG_ERROR},
                  {"warning", BT_LOG_WARNING},
                  {"info", BT_LOG_INFO},
                  {"debug", BT_LOG_DEBUG}};
    for (size_t i = 0; name && i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcmp(name, levels[i].name) == 0) {
            *out = levels[i].level;
            return 0;
        }
    return BT_EINVAL;
}

bt_log_level bt_log_level_parse(const char *name)
{
    bt_log_level l = BT_LOG_INFO;
    bt_log_level_from_name(name, &l);
    return l;
}

bool bt_log_gate_pass(bt_log_gate *g, uint64_t now_ms, uint64_t *count)
{
    g->count++;
    if (g->last_ms && now_ms - g->last_ms < 1000)
        return false;
    *count = g->count;
    g->count = 0;
    g->last_ms = now_ms;
    return true;
}

void bt_log(bt_log_level level, const char *fmt, ...)
{
    if (!bt_log_enabled(level))
        return;
    if (log_journal < 0)
        log_journal = getenv("JOURNAL_STREAM") != NULL;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines whole when several threads or
     * processes share the stream. */
    if (log_journal) {
        fprintf(stderr, "<%d>%s: %s\n", (int)level, log_ident, msg);
        return;
    }
    static const char *const names[8] = {"", "", "", "error", "warning", "", "info", "debug"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, log_ident, names[level & 7], msg);
}
