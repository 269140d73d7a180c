/* The HTTP side of batond: a libmicrohttpd server in threads of its own,
 * which speaks to the conductor as an ordinary client over its ZeroMQ
 * endpoint (the C client library).  So nothing HTTP runs on the conductor's
 * loop: a slow or idle HTTP client holds one of the gateway's connection
 * threads, never the loop, and what the gateway asks goes through the same
 * door, limits and accounting as any other client's request.
 *
 * Paths:
 *   GET /metrics   the Prometheus text (the conductor's StatsResponse)
 *   GET /health    200 {"status":"ready"} when every worker and model is
 *                  ready; 503 while starting, draining, or when the
 *                  conductor does not answer within a second
 *   GET /v1/models              the model names of the config's `openai:`
 *   POST /v1/chat/completions   OpenAI's chat completions, whole or streamed
 *                               as server-sent events (daemon/openai.h)
 *   POST /v1/completions        OpenAI's (legacy) completions, the same way;
 *                               the prompt reaches the model as raw text
 *   POST /v1/audio/transcriptions, /v1/audio/translations
 *                               speech to text for the models of `api:
 *                               audio`: a multipart form (file, model,
 *                               language, response_format, temperature,
 *                               stream) in; the text whole in a format, or
 *                               streamed as transcript.text.delta events
 * Anything else is 404, a wrong method 405, each with a JSON error body in
 * OpenAI's shape. */
#ifndef BATON_DAEMON_GATEWAY_H
#define BATON_DAEMON_GATEWAY_H

#include <stddef.h>

#include "common/curve.h"
#include "config/config.h"

typedef struct gateway gateway;

typedef struct gateway_options {
    const char *hostport;        /* where to listen: "host:port" (host may be empty) */
    const char *endpoint;        /* the conductor's client endpoint */
    unsigned max_connections;    /* HTTP connections served at once; 0: 256 */
    const cfg_openai *openai;    /* the models served by the OpenAI API (copied) */
    size_t n_openai;
    uint32_t max_body_bytes;     /* a larger request body is refused (413); 0: 1 MiB */
    uint64_t max_message_bytes;  /* the conductor's limit on a client message: an upload
                                  * (an audio file) may be as large, less room for the
                                  * rest of the request; 0: max_body_bytes */
    const char *server_public;   /* the client socket's CURVE public key (Z85), or NULL */
    const bt_curve_keypair *own; /* the gateway's key pair (copied), authorized by the
                                  * conductor; with server_public, NULL otherwise */
} gateway_options;

/* Listens on OPTS->hostport and starts serving.  Returns 0 or a negative
 * bt_err, having logged what failed (a port in use, an unresolvable host). */
int gateway_create(const gateway_options *opts, gateway **out);
/* Stops accepting, closes every connection and frees.  NULL is a no-op. */
void gateway_destroy(gateway *g);

#endif
