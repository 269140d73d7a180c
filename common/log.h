/* Logging to stderr.  Under systemd (JOURNAL_STREAM set) each line starts
 * with its syslog priority, "<3>" for errors, so journald files it right;
 * on a terminal it starts with a time stamp and the level name. */
#ifndef BATON_COMMON_LOG_H
#define BATON_COMMON_LOG_H

typedef enum bt_log_level {
    BT_LOG_ERROR = 3,   /* syslog LOG_ERR */
    BT_LOG_WARNING = 4, /* LOG_WARNING */
    BT_LOG_INFO = 6,    /* LOG_INFO */
    BT_LOG_DEBUG = 7    /* LOG_DEBUG */
} bt_log_level;

/* Sets the process name printed on every line and the threshold. */
void bt_log_init(const char *ident, bt_log_level level);
void bt_log_set_level(bt_log_level level);
bt_log_level bt_log_get_level(void);
/* Parses "error", "warning", "info", "debug"; returns BT_LOG_INFO otherwise. */
bt_log_level bt_log_level_parse(const char *name);

void bt_log(bt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define bt_error(...) bt_log(BT_LOG_ERROR, __VA_ARGS__)
#define bt_warn(...) bt_log(BT_LOG_WARNING, __VA_ARGS__)
#define bt_info(...) bt_log(BT_LOG_INFO, __VA_ARGS__)
#define bt_debug(...) bt_log(BT_LOG_DEBUG, __VA_ARGS__)

#endif
