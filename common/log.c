#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char log_ident[64] = "baton";
static bt_log_level log_level = BT_LOG_INFO;
static int log_journal = -1; /* -1: not yet known */

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
    return log_level;
}

bt_log_level bt_log_level_parse(const char *name)
{
    if (name && strcmp(name, "error") == 0)
        return BT_LOG_ERROR;
    if (name && strcmp(name, "warning") == 0)
        return BT_LOG_WARNING;
    if (name && strcmp(name, "debug") == 0)
        return BT_LOG_DEBUG;
    return BT_LOG_INFO;
}

void bt_log(bt_log_level level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    if (log_journal < 0)
        log_journal = getenv("JOURNAL_STREAM") != NULL;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines whole when several processes share
     * the terminal. */
    if (log_journal) {
        fprintf(stderr, "<%d>%s: %s\n", (int)level, log_ident, msg);
        return;
    }
    static const char *names[8] = {"", "", "", "error", "warning", "", "info", "debug"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, log_ident, names[level & 7], msg);
}
