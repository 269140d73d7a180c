#include "worker/wlog.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static char log_name[128] = "?";
static wk_log_level log_level = WK_LOG_INFO;

int wk_log_setup(const char *name, const char *level)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    if (name)
        snprintf(log_name, sizeof(log_name), "%s", name);
    if (!level)
        return 0;
    for (int i = 0; i < 4; i++)
        if (strcmp(level, names[i]) == 0) {
            log_level = (wk_log_level)i;
            return 0;
        }
    return -1;
}

int wk_log_enabled(wk_log_level level)
{
    return level <= log_level;
}

void wk_log(wk_log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warning", "info", "debug"};
    if (!wk_log_enabled(level))
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* One call per line: lines of concurrent threads do not interleave. */
    fprintf(stderr, "baton-worker[%s]: %s: %s\n", log_name, tags[level], line);
}
