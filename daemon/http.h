/* A deliberately tiny HTTP/1.0 responder on the conductor's loop, for
 * Prometheus scrapes: one short GET every few seconds.  Every connection is
 * non-blocking and served in one callback; at most HTTP_CONNS are open (a
 * new one closes the oldest) and one that sends no request line within
 * HTTP_IDLE_MS is closed, so a slow or idle scraper cannot stall the loop.
 * It knows nothing of what it serves: a handler answers each path. */
#ifndef BATON_DAEMON_HTTP_H
#define BATON_DAEMON_HTTP_H

#include <stdint.h>

#include "daemon/evloop.h"

typedef struct http_server http_server;

/* Answers GET PATH: returns the body (malloc'ed; the server frees it) with
 * status 200, or NULL for 404. */
typedef char *(*http_get_fn)(void *arg, const char *path);

/* Listens on HOSTPORT ("host:port", host may be empty) on LOOP.  Returns 0
 * or a negative bt_err, having logged what failed. */
int http_create(evloop *loop, const char *hostport, http_get_fn get, void *arg,
                http_server **out);
void http_destroy(http_server *h);
/* Closes connections idle past their time; call it from a timer. */
void http_tick(http_server *h, uint64_t now_ms);

#endif
