/* The HTTP gateway (daemon/gateway.h).
 *
 * libmicrohttpd runs a thread per connection, so a handler may block on
 * the conductor's answer without holding up other connections.  The
 * conductor's answers to health and stats probes come back on one client
 * connection shared under a mutex: each is a short round trip on the
 * conductor's loop. */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "baton/client.h"
#include "common/log.h"
#include "common/status.h"
#include "common/utf8.h"
#include "common/vec.h"
#include "daemon/gateway.h"
#include "daemon/openai.h"

#define GW_MAX_CONNECTIONS 256   /* default of gateway_options.max_connections */
#define GW_IDLE_S 30             /* a connection idle this long is closed */
#define GW_PROBE_MS 1000         /* how long /health and /metrics wait for the conductor */
#define GW_MAX_BODY (1u << 20)   /* default of gateway_options.max_body_bytes */
/* Bytes of a transcription's prompt (Whisper keeps its last 223 tokens),
 * and of the options JSON that carries it to the Whisper backend, which
 * takes no more. */
#define GW_MAX_PROMPT 2000
#define GW_MAX_OPTIONS 4096
#define GW_IDLE_CLIENTS 32       /* client connections kept for reuse */
#define GW_RECV_MS 1000          /* one wait for the conductor's next message */
#define GW_DRAIN_MS 10000        /* how long a cancelled request's end is awaited */
#define GW_STREAM_BLOCK 16384    /* bytes MHD asks of a stream at a time */
#define GW_KEEPALIVE_MS 15000    /* a silent stream gets an SSE comment this often */
/* Bytes of a client message left for what a request carries besides an
 * uploaded file (options, names, framing).  A message over the conductor's
 * limit is refused before its request id is read, so the gateway must
 * never send one: an upload may be the limit less this. */
#define GW_UPLOAD_ROOM 65536u

/* One model of the OpenAI API (cfg_openai, copied). */
typedef struct gw_model {
    char *name, *graph, *input, *output, *loop;
    bool audio;                  /* api audio: the audio endpoints serve it, not chat */
    bool voice;                  /* api voice: a chat whose one message is audio */
    char *options;               /* audio, voice: the graph input of the options JSON */
    char *transcript;            /* voice: the text stream of what was heard */
    char *context;               /* voice: the graph input of the turns before the audio
                                  * (as messages); NULL: the audio alone is taken */
    char *segments;              /* audio: the text stream of segment JSON lines; NULL */
} gw_model;

struct gateway {
    struct MHD_Daemon *mhd;      /* owned */
    int listen_fd;               /* owned until MHD has it; then MHD closes it */
    char *endpoint;              /* owned: the conductor's client endpoint */
    bool curve;                  /* connect with CURVE: server_public and keys are set */
    char server_public[BT_CURVE_Z85_SIZE]; /* the conductor's public key, Z85 */
    bt_curve_keypair keys;       /* the gateway's own pair; wiped at destroy */
    uint32_t max_body;           /* bytes */
    uint64_t max_chat_body;      /* bytes of a chat body: more with a voice model's audio */
    uint64_t max_upload;         /* bytes of an audio form */
    pthread_mutex_t admin_mu;    /* guards admin */
    baton_client *admin;         /* owned: health and stats probes */
    gw_model *models;            /* owned */
    size_t n_models;
    pthread_mutex_t pool_mu;     /* guards idle */
    baton_client *idle[GW_IDLE_CLIENTS]; /* owned: connections no request uses */
    size_t n_idle;
    _Atomic uint64_t seq;        /* request ids */
};

/* The fields of an audio request's multipart form, as MHD's post
 * processor hands them over in pieces. */
enum { F_MODEL, F_LANGUAGE, F_PROMPT, F_FORMAT, F_TEMPERATURE, F_STREAM, F_GRANULARITY,
       F_COUNT };
static const char *const form_names[F_COUNT] = {
    "model", "language", "prompt", "response_format", "temperature", "stream",
    "timestamp_granularities[]"};
#define GW_FIELD_MAX 4096        /* bytes of one form field but the file */

typedef struct gw_form {
    struct MHD_PostProcessor *pp; /* owned; NULL: the body is no form */
    char *file;                  /* owned: the uploaded file's bytes */
    size_t file_len, file_cap;
    bool has_file;
    char *field[F_COUNT];        /* owned, NUL-terminated; NULL: not given */
    size_t field_len[F_COUNT];
    char bad[160];               /* the first problem of the form ("" none) */
    uint64_t bytes;              /* body bytes so far */
} gw_form;

/* What one HTTP request carries between MHD's calls: its body so far. */
typedef struct gw_conn {
    char *body;                  /* owned, NUL-terminated */
    size_t len, cap;
    bool too_big;                /* past max_body (or the upload limit): answered 413 */
    gw_form *form;               /* owned: an audio request's form, else NULL */
} gw_conn;

/* ---- replies -------------------------------------------------------------- */

/* Queues BODY (LEN bytes, copied) with STATUS and CTYPE.  MHD_NO closes the
 * connection, which is what a reply that cannot even be allocated gets. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *ctype,
                             const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* An error in the shape OpenAI's API gives, so that its clients show it:
 * {"error": {"message", "type", "param", "code": null}}; PARAM may be NULL. */
static enum MHD_Result reply_oa_error(struct MHD_Connection *conn, unsigned status,
                                      const char *type, const char *msg, const char *param)
{
    char *body = oa_error(msg, type, param);
    if (!body)
        return MHD_NO;
    enum MHD_Result ok = reply(conn, status, "application/json", body, strlen(body));
    free(body);
    return ok;
}

/* ---- the conductor's answers ---------------------------------------------- */

/* Health from the conductor: 1 ready, 0 not (DETAIL says why), -1 no answer. */
static int probe_health(gateway *g, char *detail, size_t len)
{
    baton_client_event *ev = NULL;
    pthread_mutex_lock(&g->admin_mu);
    int rc = baton_client_health(g->admin, GW_PROBE_MS, &ev);
    pthread_mutex_unlock(&g->admin_mu);
    if (rc != 0 || !ev) {
        snprintf(detail, len, "the conductor did not answer: %s", baton_client_strerror(rc));
        return -1;
    }
    int ready = ev->ready ? 1 : 0;
    snprintf(detail, len, "%s", ev->message && *ev->message ? ev->message
                                : ready ? "ready" : "starting or draining");
    baton_client_event_free(ev);
    return ready;
}

static enum MHD_Result serve_health(gateway *g, struct MHD_Connection *conn)
{
    char detail[384], body[512];
    int ready = probe_health(g, detail, sizeof(detail));
    /* The detail names workers and states: keep it JSON-safe. */
    for (char *p = detail; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            *p = ' ';
    int n = snprintf(body, sizeof(body), "{\"status\":\"%s\",\"detail\":\"%s\"}\n",
                     ready == 1 ? "ready" : ready == 0 ? "not ready" : "unavailable", detail);
    return reply(conn, ready == 1 ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                 "application/json", body, (size_t)n);
}

static enum MHD_Result serve_metrics(gateway *g, struct MHD_Connection *conn)
{
    baton_client_event *ev = NULL;
    pthread_mutex_lock(&g->admin_mu);
    int rc = baton_client_stats(g->admin, GW_PROBE_MS, &ev);
    pthread_mutex_unlock(&g->admin_mu);
    if (rc != 0 || !ev || !ev->text) {
        baton_client_event_free(ev);
        return reply_oa_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                              "the conductor did not answer the stats request", NULL);
    }
    enum MHD_Result ok = reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                               ev->text, strlen(ev->text));
    baton_client_event_free(ev);
    return ok;
}

/* ---- connections to the conductor --------------------------------------- */

/* A new connection to the conductor, with the gateway's CURVE pair when
 * the client socket is tcp with CURVE.  TIMEOUT_MS: the connect timeout
 * (0: the library's default). */
static int client_connect(gateway *g, int timeout_ms, baton_client **out)
{
    baton_client_options o = {.connect_timeout_ms = timeout_ms};
    if (g->curve) {
        o.server_public_key = g->server_public;
        o.public_key = g->keys.public_z85;
        o.secret_key = g->keys.secret_z85;
    }
    return baton_client_create_with(g->endpoint, &o, out);
}

/* A client connection for one request: an idle one, or a new one.  Each
 * HTTP request uses its own, so that one request's wait never holds up
 * another's. */
static baton_client *client_take(gateway *g)
{
    baton_client *c = NULL;
    pthread_mutex_lock(&g->pool_mu);
    if (g->n_idle)
        c = g->idle[--g->n_idle];
    pthread_mutex_unlock(&g->pool_mu);
    if (!c && client_connect(g, 0, &c) != 0)
        c = NULL;
    return c;
}

/* Returns C for reuse; only a connection whose requests have all ended may
 * come back (a late message would be read by the next request). */
static void client_give(gateway *g, baton_client *c)
{
    pthread_mutex_lock(&g->pool_mu);
    if (g->n_idle < GW_IDLE_CLIENTS) {
        g->idle[g->n_idle++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&g->pool_mu);
    baton_client_destroy(c);
}

/* ---- chat completions ------------------------------------------------------- */

/* One chat completion in flight: the native request, the text so far, and
 * what the stream has sent. */
typedef struct gw_chat {
    gateway *g;                  /* borrowed */
    const gw_model *model;       /* borrowed */
    oa_chat req;                 /* owned */
    baton_client *client;        /* owned while the request runs */
    char id[64];                 /* request id, also the completion's id */
    int64_t created;             /* unix seconds */
    char *text;                  /* owned: generated bytes not yet sent (stream) or all */
    size_t len, cap;
    bool completion;             /* POST /v1/completions: a text_completion, no chat */
    bool audio;                  /* an audio endpoint: transcript events and formats */
    char *all;                   /* owned (audio, voice): the whole transcript */
    size_t all_len, all_cap;
    size_t heard_sent;           /* voice, streamed: bytes of ALL sent as events */
    char *segs;                  /* owned (audio): the segments' JSON lines */
    size_t segs_len, segs_cap;
    double duration;             /* audio: seconds, from the response's `duration`; -1 */
    uint32_t tokens;             /* text chunks received */
    bool ended;                  /* the terminal response came */
    bool cancelled;              /* we cancelled it (the client went away) */
    int code;                    /* the response's code */
    char message[512];           /* the response's message */
    const char *finish;          /* "stop" or "length" once ended OK */
    uint32_t prompt_tokens;      /* the response's usage: the prompt's tokens */
    uint32_t completion_tokens;  /* and the answer's, up to the one that ended it */
    uint32_t cached_tokens;      /* of the prompt's, those read from a prefix cache */
    bool sent_role, sent_finish, sent_usage, sent_done;
    char *out;                   /* owned: the stream's next bytes, not yet taken by MHD */
    size_t out_len, out_at;      /* bytes in OUT, and how many MHD has taken */
} gw_chat;

/* Waits for the next message of the request and takes it in: a text chunk
 * of the model's output, or the end.  Returns 0, or -1 when the conductor
 * stays silent (the request is then ended as UNAVAILABLE). */
static int chat_step(gw_chat *ch, int timeout_ms)
{
    baton_client_event *ev = NULL;
    int rc = baton_client_recv(ch->client, timeout_ms, &ev);
    if (rc == BATON_CLIENT_ETIMEDOUT || rc == BATON_CLIENT_EINTR)
        return 0;
    if (rc != 0 || !ev) {
        ch->ended = true;
        ch->code = BATON_CLIENT_CODE_UNAVAILABLE;
        snprintf(ch->message, sizeof(ch->message), "lost the conductor: %s",
                 baton_client_strerror(rc));
        return -1;
    }
    if (strcmp(ev->request_id, ch->id) != 0) {
        baton_client_event_free(ev);     /* an earlier request's late message */
        return 0;
    }
    /* Stop strings and max_tokens are the conductor's (the native request
     * carries them): the text that comes is the answer's, and the response
     * says what ended it. */
    const char *name = ev->kind == BATON_CLIENT_EVENT_CHUNK && !ch->cancelled ? ev->value.name
                                                                               : NULL;
    bool heard = name && ch->model->transcript && strcmp(name, ch->model->transcript) == 0;
    const uint8_t *p = name ? ev->value.data : NULL;
    size_t n = name ? ev->value.nbytes : 0;
    rc = 0;
    if (name && ch->audio && ch->model->segments && strcmp(name, ch->model->segments) == 0) {
        /* Kept for verbose_json and subtitles; a stream sends text only. */
        rc = bt_bytes_add(&ch->segs, &ch->segs_len, &ch->segs_cap, p, n);
    } else if (name && (heard || strcmp(name, ch->model->output) == 0)) {
        /* A voice chat's transcript is kept whole (and streamed from
         * there); an audio transcription's text both whole and as it
         * comes; an answer's as it comes. */
        if (heard || ch->audio)
            rc = bt_bytes_add(&ch->all, &ch->all_len, &ch->all_cap, p, n);
        if (!heard) {
            ch->tokens++;
            if (rc == 0)
                rc = bt_bytes_add(&ch->text, &ch->len, &ch->cap, p, n);
        }
    } else if (ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
        ch->ended = true;
        ch->code = ev->code;
        snprintf(ch->message, sizeof(ch->message), "%s", ev->message);
        ch->prompt_tokens = ev->prompt_tokens;
        ch->completion_tokens = ev->completion_tokens;
        ch->cached_tokens = ev->cached_tokens;
        for (size_t i = 0; i < ev->n_outputs; i++)
            if (strcmp(ev->outputs[i].name, "duration") == 0 &&
                ev->outputs[i].dtype == BATON_CLIENT_DTYPE_F32 && ev->outputs[i].nbytes == 4) {
                float d;
                memcpy(&d, ev->outputs[i].data, 4);
                ch->duration = d;
            }
        if (ev->finish_reason == BATON_CLIENT_FINISH_STOP)
            ch->finish = "stop";
        else if (ev->finish_reason == BATON_CLIENT_FINISH_LENGTH)
            ch->finish = "length";
        if (!ch->finish) {
            /* The model's end of turn, unless the loop that carries the
             * text ran out of iterations (the graph's max_iters). */
            ch->finish = "stop";
            for (size_t i = 0; ch->model->loop && i < ev->n_loop_ends; i++)
                if (strcmp(ev->loop_ends[i].loop, ch->model->loop) == 0 &&
                    ev->loop_ends[i].how == BATON_CLIENT_LOOP_MAX_ITERS)
                    ch->finish = "length";
        }
    }
    if (rc != 0) {
        /* Out of memory keeping what came: the request is given up. */
        ch->cancelled = true;
        baton_client_cancel(ch->client, ch->id);
    }
    baton_client_event_free(ev);
    return 0;
}

static unsigned http_status(int code)
{
    switch (code) {
    case BATON_CLIENT_CODE_INVALID_ARGUMENT: return MHD_HTTP_BAD_REQUEST;
    case BATON_CLIENT_CODE_NOT_FOUND: return MHD_HTTP_NOT_FOUND;
    case BATON_CLIENT_CODE_RESOURCE_EXHAUSTED: return MHD_HTTP_TOO_MANY_REQUESTS;
    case BATON_CLIENT_CODE_UNAVAILABLE: return MHD_HTTP_SERVICE_UNAVAILABLE;
    case BATON_CLIENT_CODE_DEADLINE_EXCEEDED: return MHD_HTTP_GATEWAY_TIMEOUT;
    default: return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}


static void chat_free(gw_chat *ch)
{
    if (!ch)
        return;
    if (ch->client) {
        /* A request still running (the client went away mid-stream) is
         * cancelled, and its end awaited so the connection can be reused;
         * one that does not end in time takes its connection with it. */
        if (!ch->ended) {
            if (!ch->cancelled)
                baton_client_cancel(ch->client, ch->id);
            ch->cancelled = true;
            for (int waited = 0; !ch->ended && waited < GW_DRAIN_MS; waited += GW_RECV_MS)
                chat_step(ch, GW_RECV_MS);
        }
        if (ch->ended)
            client_give(ch->g, ch->client);
        else
            baton_client_destroy(ch->client);
    }
    oa_chat_free(&ch->req);
    free(ch->all);
    free(ch->segs);
    free(ch->text);
    free(ch->out);
    free(ch);
}

/* Makes EV (malloc'd, or NULL when out of memory) the stream's next bytes. */
static int set_out(gw_chat *ch, char *ev)
{
    free(ch->out);
    ch->out = ev;
    ch->out_len = ev ? strlen(ev) : 0;
    ch->out_at = 0;
    return ev ? 0 : -1;
}

/* The stream's next event into CH->out: text, the finish (or the error),
 * then [DONE].  Blocks (this connection's own thread) until the model has
 * produced something, sending an SSE comment every GW_KEEPALIVE_MS of
 * silence so that proxies and clients with read timeouts keep the stream.
 * Returns 0, 1 at the end of the stream, or -1. */
static int next_event(gw_chat *ch)
{
    int waited_ms = 0;
    for (;;) {
        if (ch->sent_done)
            return 1;
        if (ch->model->voice && ch->all_len > ch->heard_sent) {
            /* A voice chat's transcript streams before the answer (whose
             * prompt it is), as chunks with no choices. */
            const char *h = ch->all + ch->heard_sent;
            /* Once the answer has begun the transcript is whole (it was
             * the answer's prompt): a tail that is not whole UTF-8 goes
             * now, before the answer, not at the end. */
            size_t n = oa_utf8_ready(h, ch->all_len - ch->heard_sent, ch->ended || ch->tokens);
            if (n) {
                ch->heard_sent += n;
                return set_out(ch, oa_transcript_event(ch->id, ch->created, ch->req.model, h, n));
            }
        }
        size_t ready = oa_utf8_ready(ch->text, ch->len, ch->ended);
        if (ready > 4096) {
            /* Long text goes in pieces, each cut between characters. */
            ready = 4096;
            while (ready > 0 && ((unsigned char)ch->text[ready] & 0xC0) == 0x80)
                ready--;
        }
        if (ready && ch->audio) {
            char *ev = oa_audio_delta_event(ch->text, ready);
            memmove(ch->text, ch->text + ready, ch->len - ready);
            ch->len -= ready;
            return set_out(ch, ev);
        }
        if (ch->ended && ch->audio) {
            /* The transcript's end, or the error; no [DONE] (OpenAI's audio
             * streams end with the connection). */
            if (ch->sent_done)
                return 1;
            ch->sent_done = true;
            if (ch->code == BATON_CLIENT_CODE_OK) {
                oa_usage u = {ch->prompt_tokens, ch->completion_tokens, ch->cached_tokens};
                return set_out(ch, oa_audio_done_event(ch->all ? ch->all : "", ch->all_len, &u));
            }
            char *err = oa_error(ch->message, "server_error", NULL);
            char *ev = err ? malloc(strlen(err) + 9) : NULL;
            if (ev)
                sprintf(ev, "data: %s\n\n", err);
            free(err);
            return set_out(ch, ev);
        }
        if (ready) {
            char *ev = ch->completion
                           ? oa_completion_event(ch->id, ch->created, ch->req.model, ch->text,
                                                 ready, NULL)
                           : oa_chat_event(ch->id, ch->created, ch->req.model, ch->text, ready,
                                           !ch->sent_role, NULL);
            ch->sent_role = true;
            memmove(ch->text, ch->text + ready, ch->len - ready);
            ch->len -= ready;
            return set_out(ch, ev);
        }
        if (ch->ended && !ch->sent_finish) {
            ch->sent_finish = true;
            if (ch->code == BATON_CLIENT_CODE_OK) {
                char *ev = ch->completion
                               ? oa_completion_event(ch->id, ch->created, ch->req.model, "", 0,
                                                     ch->finish)
                               : oa_chat_event(ch->id, ch->created, ch->req.model, "", 0,
                                               !ch->sent_role, ch->finish);
                ch->sent_role = true;
                return set_out(ch, ev);
            }
            /* Headers are gone: a failure mid-stream is an error event. */
            char *err = oa_error(ch->message, "server_error", NULL);
            char *ev = err ? malloc(strlen(err) + 9) : NULL;
            if (ev)
                sprintf(ev, "data: %s\n\n", err);
            free(err);
            return set_out(ch, ev);
        }
        if (ch->ended && ch->req.include_usage && ch->code == BATON_CLIENT_CODE_OK &&
            !ch->sent_usage) {
            ch->sent_usage = true;
            oa_usage u = {ch->prompt_tokens, ch->completion_tokens, ch->cached_tokens};
            return set_out(ch, ch->completion
                                   ? oa_completion_usage_event(ch->id, ch->created,
                                                               ch->req.model, &u)
                                   : oa_chat_usage_event(ch->id, ch->created, ch->req.model,
                                                         &u));
        }
        if (ch->ended) {
            ch->sent_done = true;
            return set_out(ch, strdup("data: [DONE]\n\n"));
        }
        if (waited_ms >= GW_KEEPALIVE_MS)
            return set_out(ch, strdup(": keep-alive\n\n"));
        chat_step(ch, GW_RECV_MS);
        waited_ms += GW_RECV_MS;
    }
}

/* MHD asks for the stream's next bytes, at most MAX: what it has not yet
 * taken of the current event, else the next event.  MAX may be smaller
 * than an event when the client reads slowly; the rest waits in CH. */
static ssize_t chat_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gw_chat *ch = cls;
    if (ch->out_at == ch->out_len) {
        int rc = next_event(ch);
        if (rc > 0)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (rc < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = ch->out_len - ch->out_at;
    if (n > max)
        n = max;
    memcpy(buf, ch->out + ch->out_at, n);
    ch->out_at += n;
    return (ssize_t)n;
}

static void chat_read_free(void *cls)
{
    chat_free(cls);
}

static const gw_model *find_model(const gateway *g, const char *name)
{
    for (size_t i = 0; i < g->n_models; i++)
        if (strcmp(g->models[i].name, name) == 0)
            return &g->models[i];
    return NULL;
}

/* Sends R (destroyed here) for CH on a connection of the pool, streamed,
 * unless RC (the building of R) already failed.  0 or RC, or the client's
 * error; CH->client is set only when the request went out. */
static int chat_send(gw_chat *ch, baton_client_request *r, int rc)
{
    if (rc == 0) {
        baton_client_request_set_stream(r, true);
        if (!(ch->client = client_take(ch->g)))
            rc = BATON_CLIENT_ECONNECT;
    }
    if (rc == 0 && (rc = baton_client_send(ch->client, r)) != 0) {
        baton_client_destroy(ch->client);
        ch->client = NULL;
    }
    baton_client_request_destroy(r);
    return rc;
}

/* CH's failed response as an OpenAI error (CH freed): a 400 is the
 * request's fault, about PARAM when given; anything else the server's. */
static enum MHD_Result chat_error(struct MHD_Connection *conn, gw_chat *ch, const char *param)
{
    unsigned status = http_status(ch->code);
    bool bad = status == MHD_HTTP_BAD_REQUEST;
    enum MHD_Result ok = reply_oa_error(conn, status, bad ? "invalid_request_error"
                                                          : "server_error",
                                        ch->message, bad ? param : NULL);
    chat_free(ch);
    return ok;
}

/* Answers CH (handed over) as server-sent events.  The first message
 * decides the status: a request refused at once (a full daemon, a bad
 * input) gets its HTTP error (chat_error with PARAM), not a stream. */
static enum MHD_Result chat_stream(struct MHD_Connection *conn, gw_chat *ch, const char *param)
{
    while (!ch->ended && !ch->tokens && !ch->all_len)
        chat_step(ch, GW_RECV_MS);
    if (ch->ended && ch->code != BATON_CLIENT_CODE_OK && !ch->tokens && !ch->all_len)
        return chat_error(conn, ch, param);
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, GW_STREAM_BLOCK, chat_read, ch, chat_read_free);
    if (!resp) {
        chat_free(ch);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* POST /v1/chat/completions, or /v1/completions when COMPLETION. */
static enum MHD_Result serve_chat(gateway *g, struct MHD_Connection *conn, const gw_conn *hc,
                                  bool completion)
{
    char err[512], param[64];
    gw_chat *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return MHD_NO;
    ch->g = g;
    ch->completion = completion;
    /* The idle timeout is for clients that send nothing; once a request is
     * read, a generation may take longer than that between two bytes (a
     * long prefill, a queue behind other requests), and MHD would close the
     * connection under it. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    int rc = (completion ? oa_completion_parse : oa_chat_parse)(hc->body, hc->len, &ch->req, err,
                                                                sizeof(err), param,
                                                                sizeof(param));
    if (rc != 0) {
        free(ch);
        return rc == BT_ENOMEM ? MHD_NO
                               : reply_oa_error(conn, MHD_HTTP_BAD_REQUEST,
                                                "invalid_request_error", err, param);
    }
    if (!(ch->model = find_model(g, ch->req.model))) {
        snprintf(err, sizeof(err), "the model '%.200s' does not exist (GET /v1/models lists them)",
                 ch->req.model);
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_NOT_FOUND, "invalid_request_error", err, "model");
    }
    if (ch->model->audio) {
        snprintf(err, sizeof(err), "the model '%.200s' turns speech into text: POST "
                 "/v1/audio/transcriptions or /v1/audio/translations", ch->req.model);
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request_error", err, "model");
    }
    const gw_model *m = ch->model;
    const oa_msg *last = ch->req.n_msgs ? &ch->req.msgs[ch->req.n_msgs - 1] : NULL;
    err[0] = 0;
    if (m->voice && completion)
        snprintf(err, sizeof(err), "the model '%.200s' answers speech: POST "
                 "/v1/chat/completions with an input_audio part", m->name);
    else if (m->voice && (!ch->req.audio || ch->req.audio_msg != ch->req.n_msgs - 1 ||
                          strcmp(last->role, "user") != 0 || last->content[0]))
        /* What was heard is the last user turn: text beside it, or audio
         * in an earlier turn, has no place in the graph's prompt and would
         * be dropped without a word, so it is refused. */
        snprintf(err, sizeof(err), "the model '%.200s' answers a spoken question: the last "
                 "message is the user's, and its content is one input_audio part alone (text "
                 "that goes with it belongs in a system message)", m->name);
    else if (m->voice && !m->context && ch->req.n_msgs != 1)
        /* The graph takes the audio alone: a system prompt or earlier turns
         * would be dropped without a word, so they are refused. */
        snprintf(err, sizeof(err), "the model '%.200s' answers one user message whose content "
                 "is one input_audio part (graph '%.100s' takes the audio alone: its openai "
                 "entry names no context input for a system prompt or earlier turns)", m->name,
                 m->graph);
    else if (!m->voice && ch->req.audio)
        snprintf(err, sizeof(err), "the model '%.200s' takes text: an input_audio part is for "
                 "a voice model", m->name);
    if (err[0]) {
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_request_error", err,
                              completion ? "model" : "messages");
    }
    if (m->voice && ch->req.audio_len > g->max_upload) {
        snprintf(err, sizeof(err), "the audio is over %llu bytes (daemon.max_message_bytes less "
                 "64 KiB for the rest of the request)", (unsigned long long)g->max_upload);
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", err,
                              "messages");
    }
    snprintf(ch->id, sizeof(ch->id), "%s-%d-%llu", completion ? "cmpl" : "chatcmpl",
             (int)getpid(), (unsigned long long)++g->seq);
    ch->created = (int64_t)time(NULL);
    baton_client_request *r = NULL;
    baton_client_sampling sp = {ch->req.temperature, ch->req.top_k, ch->req.top_p,
                                ch->req.seed};
    rc = baton_client_request_create(ch->model->graph, ch->id, &r);
    if (m->voice) {
        /* The audio file, and the transcription's options: greedy, so
         * that the request's temperature samples the answer only. */
        int64_t n = (int64_t)ch->req.audio_len;
        if (rc == 0)
            rc = baton_client_request_add_input(r, m->input, BATON_CLIENT_DTYPE_U8, &n, 1,
                                                ch->req.audio, ch->req.audio_len);
        if (rc == 0)
            rc = baton_client_request_add_text(r, m->options, "{\"temperature\": 0}");
        /* The turns before it, which the graph puts before the transcript
         * in the LLM's chat template; without any, the input is left out. */
        for (size_t i = 0; rc == 0 && i + 1 < ch->req.n_msgs; i++)
            rc = baton_client_request_add_message(r, ch->req.msgs[i].role,
                                                  ch->req.msgs[i].content);
        if (rc == 0 && ch->req.n_msgs > 1)
            rc = baton_client_request_set_messages_input(r, m->context);
    } else {
        /* A chat goes as messages, which the model renders with its chat
         * template; a completion's prompt as raw text, which it takes as is. */
        for (size_t i = 0; rc == 0 && i < ch->req.n_msgs; i++)
            rc = baton_client_request_add_message(r, ch->req.msgs[i].role,
                                                  ch->req.msgs[i].content);
        if (rc == 0 && completion)
            rc = baton_client_request_add_text(r, ch->model->input, ch->req.prompt);
        if (rc == 0 && completion)
            rc = baton_client_request_add_raw_input(r, ch->model->input);
        if (rc == 0 && !completion)
            rc = baton_client_request_set_messages_input(r, ch->model->input);
    }
    if (rc == 0)
        rc = baton_client_request_set_sampling(r, &sp);
    /* max_tokens and stop are the native request's own, on the model's
     * output; the loop's cap on top only keeps a worker from running far
     * ahead of a request that is about to end. */
    if (rc == 0)
        baton_client_request_set_max_tokens(r, ch->req.max_tokens);
    for (size_t i = 0; rc == 0 && i < ch->req.n_stop; i++)
        rc = baton_client_request_add_stop(r, ch->req.stop[i]);
    if (rc == 0 && (ch->req.max_tokens || ch->req.n_stop))
        rc = baton_client_request_set_text_output(r, ch->model->output);
    if (rc == 0 && ch->req.max_tokens && ch->model->loop)
        rc = baton_client_request_set_max_iters(r, ch->model->loop, ch->req.max_tokens);
    if ((rc = chat_send(ch, r, rc)) != 0) {
        snprintf(err, sizeof(err), "cannot send the request to the conductor: %s",
                 baton_client_strerror(rc));
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", err, NULL);
    }
    /* A voice model's bad audio is the message's fault: the decoder's
     * refusal names it. */
    const char *bad_param = m->voice ? "messages" : NULL;
    if (ch->req.stream)
        return chat_stream(conn, ch, bad_param);
    while (!ch->ended)
        chat_step(ch, GW_RECV_MS);
    if (ch->code != BATON_CLIENT_CODE_OK)
        return chat_error(conn, ch, bad_param); /* frees CH */
    oa_usage u = {ch->prompt_tokens, ch->completion_tokens, ch->cached_tokens};
    const char *answer = ch->text ? ch->text : "";
    char *body = m->voice ? oa_voice_response(ch->id, ch->created, ch->req.model, answer, ch->len,
                                              ch->finish, &u, ch->all ? ch->all : "",
                                              ch->all_len)
                 : (completion ? oa_completion_response : oa_chat_response)(
                       ch->id, ch->created, ch->req.model, answer, ch->len, ch->finish, &u);
    enum MHD_Result ok = body ? reply(conn, MHD_HTTP_OK, "application/json", body, strlen(body))
                              : MHD_NO;
    free(body);
    chat_free(ch);
    return ok;
}

/* ---- audio ---------------------------------------------------------------- */

/* MHD's post processor hands over a piece of form field KEY (at OFF). */
static enum MHD_Result form_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *filename, const char *ctype, const char *enc,
                                  const char *data, uint64_t off, size_t size)
{
    (void)kind, (void)filename, (void)ctype, (void)enc, (void)off;
    gw_form *f = cls;
    if (f->bad[0])
        return MHD_YES;
    if (strcmp(key, "file") == 0) {
        f->has_file = true;
        if (size && BT_RESERVE_N(f->file, f->file_len, f->file_cap, size, 65536) < 0) {
            snprintf(f->bad, sizeof(f->bad), "out of memory reading the file");
            return MHD_YES;
        }
        if (size)
            memcpy(f->file + f->file_len, data, size);
        f->file_len += size;
        return MHD_YES;
    }
    int k = 0;
    while (k < F_COUNT && strcmp(key, form_names[k]) != 0)
        k++;
    if (k == F_COUNT) {
        snprintf(f->bad, sizeof(f->bad), "unknown form field '%.64s'", key);
        return MHD_YES;
    }
    size_t have = f->field[k] ? f->field_len[k] : 0;
    if (have + size > GW_FIELD_MAX) {
        snprintf(f->bad, sizeof(f->bad), "form field '%s' is over %d bytes", key, GW_FIELD_MAX);
        return MHD_YES;
    }
    char *p = realloc(f->field[k], have + size + 1);
    if (!p) {
        snprintf(f->bad, sizeof(f->bad), "out of memory reading the form");
        return MHD_YES;
    }
    memcpy(p + have, data, size);
    p[have + size] = 0;
    f->field[k] = p, f->field_len[k] = have + size;
    return MHD_YES;
}

static void form_free(gw_form *f)
{
    if (!f)
        return;
    if (f->pp)
        MHD_destroy_post_processor(f->pp);
    free(f->file);
    for (int k = 0; k < F_COUNT; k++)
        free(f->field[k]);
    free(f);
}

/* The options JSON of an audio request: the language asked for (not for
 * a translation, whose text is English), the task and the prompt (checked
 * to be UTF-8 before).  As Whisper's and faster-whisper's defaults, each
 * 30-second window is conditioned on the text before it, and a
 * temperature of 0, as OpenAI's API has it, is greedy decoding that falls
 * back through higher temperatures when a window fails the model's checks;
 * FALLBACK says so. */
static char *audio_options(const gw_form *f, bool translate, bool fallback)
{
    json_t *o = json_object();
    const char *lang = f->field[F_LANGUAGE], *prompt = f->field[F_PROMPT];
    if (o && lang && *lang && !translate)
        json_object_set_new(o, "language", json_string(lang));
    if (o)
        json_object_set_new(o, "condition_on_previous_text", json_true());
    if (o && fallback)
        json_object_set_new(o, "temperature", json_pack("[f, f, f, f, f, f]", 0.0, 0.2, 0.4, 0.6,
                                                        0.8, 1.0));
    if (o && prompt && *prompt && json_object_set_new(o, "prompt", json_string(prompt))) {
        json_decref(o);
        return NULL;
    }
    if (o && translate)
        json_object_set_new(o, "task", json_string("translate"));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* POST /v1/audio/transcriptions, or /v1/audio/translations (TRANSLATE). */
static enum MHD_Result serve_audio(gateway *g, struct MHD_Connection *conn, gw_conn *hc,
                                   bool translate)
{
    gw_form *f = hc->form;
    char err[512];
    const char *param = NULL;
    const gw_model *m = NULL;
    double temperature = 0;
    int format = OA_AUDIO_JSON;
    bool stream = false;
    const char *fmt = f->field[F_FORMAT], *temp = f->field[F_TEMPERATURE];
    const char *prompt = f->field[F_PROMPT] && *f->field[F_PROMPT] ? f->field[F_PROMPT] : NULL;
    const char *st = f->field[F_STREAM], *gran = f->field[F_GRANULARITY];
    /* Built once: its length is checked below, then it is sent.  Only an
     * absent temperature or one that reads as 0 falls back, and not in a
     * stream: a window decoded again would hold its text back until its
     * end, while a stream sends each segment as it is decoded. */
    bool fallback = (!temp || strtod(temp, NULL) == 0) && !(st && !strcmp(st, "true"));
    char *options = audio_options(f, translate, fallback);
    err[0] = 0;
    if (!f->pp) {
        snprintf(err, sizeof(err), "the body is not a form: send multipart/form-data with the "
                 "file and the model");
    } else if (f->bad[0]) {
        snprintf(err, sizeof(err), "%s", f->bad);
    } else if (!f->field[F_MODEL] || !*f->field[F_MODEL]) {
        snprintf(err, sizeof(err), "the form has no model"), param = "model";
    } else if (!(m = find_model(g, f->field[F_MODEL])) || !m->audio) {
        snprintf(err, sizeof(err), m ? "the model '%.200s' is no speech-to-text model"
                                     : "the model '%.200s' does not exist (GET /v1/models lists "
                                       "them)", f->field[F_MODEL]);
        param = "model";
    } else if (!f->has_file || !f->file_len) {
        snprintf(err, sizeof(err), f->has_file ? "the file is empty" : "the form has no file");
        param = "file";
    } else if (fmt && (format = oa_audio_format_of(fmt)) < 0) {
        snprintf(err, sizeof(err), "response_format '%.64s' is json, text, srt, vtt or "
                 "verbose_json", fmt);
        param = "response_format";
    } else if (temp && (sscanf(temp, "%lf", &temperature) != 1 || !(temperature >= 0) ||
                        temperature > 1)) {
        snprintf(err, sizeof(err), "temperature '%.64s' is not a number from 0 to 1", temp);
        param = "temperature";
    } else if (st && strcmp(st, "true") && strcmp(st, "false")) {
        snprintf(err, sizeof(err), "stream is true or false");
        param = "stream";
    } else if (prompt && strlen(prompt) > GW_MAX_PROMPT) {
        snprintf(err, sizeof(err), "prompt is %zu bytes; at most %d are taken", strlen(prompt),
                 GW_MAX_PROMPT);
        param = "prompt";
    } else if (prompt && !bt_utf8_valid(prompt, strlen(prompt))) {
        snprintf(err, sizeof(err), "prompt is not valid UTF-8");
        param = "prompt";
    } else if (prompt && options && strlen(options) > GW_MAX_OPTIONS) {
        snprintf(err, sizeof(err), "prompt is too long once written as JSON (its quotes and "
                 "control characters escaped): the options take at most %d bytes",
                 GW_MAX_OPTIONS);
        param = "prompt";
    } else if (gran && strcmp(gran, "segment") != 0) {
        snprintf(err, sizeof(err), "timestamp_granularities '%.32s': only segment", gran);
        param = "timestamp_granularities[]";
    }
    if (err[0]) {
        /* A model that is not there is 404, as for a chat; the rest 400. */
        bool missing = param && !strcmp(param, "model") && !m && f->field[F_MODEL] &&
                       *f->field[F_MODEL];
        free(options);
        return reply_oa_error(conn, missing ? MHD_HTTP_NOT_FOUND : MHD_HTTP_BAD_REQUEST,
                              "invalid_request_error", err, param);
    }
    stream = st && strcmp(st, "true") == 0;
    gw_chat *ch = calloc(1, sizeof(*ch));
    if (!ch || !options || !(ch->req.model = strdup(m->name))) {
        free(ch), free(options);
        return MHD_NO;
    }
    ch->g = g, ch->model = m, ch->audio = true, ch->duration = -1;
    ch->req.stream = stream;
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    snprintf(ch->id, sizeof(ch->id), "audio-%d-%llu", (int)getpid(),
             (unsigned long long)++g->seq);
    ch->created = (int64_t)time(NULL);
    baton_client_request *r = NULL;
    baton_client_sampling sp = {(float)temperature, 0, 1.0f, 0};
    int64_t n = (int64_t)f->file_len;
    int rc = baton_client_request_create(m->graph, ch->id, &r);
    if (rc == 0)
        rc = baton_client_request_add_input(r, m->input, BATON_CLIENT_DTYPE_U8, &n, 1, f->file,
                                            f->file_len);
    if (rc == 0)
        rc = baton_client_request_add_text(r, m->options, options);
    if (rc == 0)
        rc = baton_client_request_set_sampling(r, &sp);
    free(options);
    if ((rc = chat_send(ch, r, rc)) != 0) {
        snprintf(err, sizeof(err), "cannot send the request to the conductor: %s",
                 baton_client_strerror(rc));
        chat_free(ch);
        return reply_oa_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", err, NULL);
    }
    /* A bad file is the request's fault: the decoder's refusal names it. */
    if (stream)
        return chat_stream(conn, ch, "file");
    while (!ch->ended)
        chat_step(ch, GW_RECV_MS);
    if (ch->code != BATON_CLIENT_CODE_OK)
        return chat_error(conn, ch, "file"); /* frees CH */
    oa_usage u = {ch->prompt_tokens, ch->completion_tokens, ch->cached_tokens};
    const char *ctype;
    const char *lang = f->field[F_LANGUAGE] && !translate ? f->field[F_LANGUAGE] : "";
    char *body = oa_audio_response((oa_audio_format)format, ch->all ? ch->all : "",
                                   ch->all_len, ch->segs, ch->segs_len, ch->duration,
                                   translate ? "translate" : "transcribe",
                                   translate ? "en" : lang, &u, &ctype);
    enum MHD_Result ok = body ? reply(conn, MHD_HTTP_OK, ctype, body, strlen(body)) : MHD_NO;
    free(body);
    chat_free(ch);
    return ok;
}

static enum MHD_Result serve_models(gateway *g, struct MHD_Connection *conn)
{
    const char **names = calloc(g->n_models + 1, sizeof(*names));
    if (!names)
        return MHD_NO;
    for (size_t i = 0; i < g->n_models; i++)
        names[i] = g->models[i].name;
    char *body = oa_models(names, g->n_models, (int64_t)time(NULL));
    free(names);
    enum MHD_Result ok = body ? reply(conn, MHD_HTTP_OK, "application/json", body, strlen(body))
                              : MHD_NO;
    free(body);
    return ok;
}

/* ---- routing -------------------------------------------------------------- */

/* Collects a request body in HC, up to MAX bytes. */
static void body_add(gw_conn *hc, const char *data, size_t n, uint64_t max)
{
    if (hc->too_big || hc->len + n > max) {
        hc->too_big = true;
        return;
    }
    if (bt_bytes_add(&hc->body, &hc->len, &hc->cap, data, n) < 0)
        hc->too_big = true;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)cls, (void)conn, (void)why;
    gw_conn *hc = *con_cls;
    if (hc) {
        form_free(hc->form);
        free(hc->body);
        free(hc);
        *con_cls = NULL;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    gateway *g = cls;
    /* The first call for a request comes with its headers only; the body
     * follows in pieces, and the answer comes on the call after the last. */
    bool transcribe = strcmp(url, "/v1/audio/transcriptions") == 0;
    bool translate = strcmp(url, "/v1/audio/translations") == 0;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    if (!*con_cls) {
        gw_conn *hc = calloc(1, sizeof(*hc));
        if (!hc)
            return MHD_NO;
        *con_cls = hc;
        if ((transcribe || translate) && post) {
            /* An upload is a multipart form, parsed as it arrives; a body
             * that is no form leaves PP NULL and is refused at the end. */
            if (!(hc->form = calloc(1, sizeof(*hc->form))))
                return MHD_NO;
            hc->form->pp = MHD_create_post_processor(conn, 65536, form_field, hc->form);
        }
        return MHD_YES;
    }
    gw_conn *hc = *con_cls;
    if (*upload_data_size) {
        if (hc->form) {
            gw_form *f = hc->form;
            f->bytes += *upload_data_size;
            if (f->bytes > g->max_upload)
                hc->too_big = true;
            else if (f->pp && !hc->too_big &&
                     MHD_post_process(f->pp, upload_data, *upload_data_size) != MHD_YES &&
                     !f->bad[0])
                snprintf(f->bad, sizeof(f->bad), "the multipart form is malformed");
        } else {
            body_add(hc, upload_data, *upload_data_size, g->max_chat_body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (transcribe || translate) {
        if (!post)
            return reply_oa_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                                  "this path takes POST", NULL);
        if (hc->too_big) {
            char msg[160];
            snprintf(msg, sizeof(msg), "the upload is over %llu bytes (daemon.max_message_bytes "
                     "less 64 KiB for the rest of the request)",
                     (unsigned long long)g->max_upload);
            return reply_oa_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", msg,
                                  "file");
        }
        return serve_audio(g, conn, hc, translate);
    }
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
               strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    bool chat = strcmp(url, "/v1/chat/completions") == 0;
    if (chat || strcmp(url, "/v1/completions") == 0) {
        if (!post)
            return reply_oa_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                                  "this path takes POST", NULL);
        if (hc->too_big)
            return reply_oa_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error",
                                  "the request body is too large", NULL);
        return serve_chat(g, conn, hc, !chat);
    }
    bool health = strcmp(url, "/health") == 0, metrics = strcmp(url, "/metrics") == 0;
    bool models = strcmp(url, "/v1/models") == 0;
    if (!health && !metrics && !models)
        return reply_oa_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such path", NULL);
    if (!get)
        return reply_oa_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                              "this path takes GET", NULL);
    return health ? serve_health(g, conn) : metrics ? serve_metrics(g, conn)
                                                    : serve_models(g, conn);
}

/* ---- create / destroy ------------------------------------------------------- */

/* A listening, close-on-exec TCP socket on HOSTPORT, or -1 with *RC set. */
static int listen_on(const char *hostport, int *rc)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", hostport);
    char *colon = strrchr(host, ':');
    *rc = BT_EINVAL;
    if (!colon) {
        bt_error("http listen '%s' is not host:port", hostport);
        return -1;
    }
    *colon = 0;
    /* "[::1]:8000": the brackets are the URL's, not the address's. */
    char *h = host;
    if (*h == '[' && colon > h + 1 && colon[-1] == ']')
        h++, colon[-1] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(*h ? h : NULL, colon + 1, &hints, &ai) != 0 || !ai) {
        bt_error("http listen '%s': cannot resolve", hostport);
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    /* Without SO_REUSEADDR a restart within TIME_WAIT could not bind: fail
     * now, saying so, rather than later and by surprise. */
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        bt_error("http listen '%s': %s", hostport, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        *rc = BT_EIO;
        return -1;
    }
    freeaddrinfo(ai);
    *rc = 0;
    return fd;
}

static void mhd_log(void *arg, const char *fmt, va_list ap)
{
    (void)arg;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    bt_warn("http: %s", msg);
}

int gateway_create(const gateway_options *opts, gateway **out)
{
    *out = NULL;
    gateway *g = calloc(1, sizeof(*g));
    if (!g)
        return BT_ENOMEM;
    g->listen_fd = -1;
    pthread_mutex_init(&g->admin_mu, NULL);
    pthread_mutex_init(&g->pool_mu, NULL);
    g->max_body = opts->max_body_bytes ? opts->max_body_bytes : GW_MAX_BODY;
    uint64_t most = opts->max_message_bytes ? opts->max_message_bytes : g->max_body;
    g->max_upload = most > 2 * GW_UPLOAD_ROOM ? most - GW_UPLOAD_ROOM : most / 2;
    int rc = BT_ENOMEM;
    if (!(g->endpoint = strdup(opts->endpoint)))
        goto err;
    if (opts->n_openai && !(g->models = calloc(opts->n_openai, sizeof(*g->models))))
        goto err;
    for (size_t i = 0; i < opts->n_openai; i++, g->n_models++) {
        const cfg_openai *o = &opts->openai[i];
        gw_model *m = &g->models[i];
        m->name = strdup(o->model), m->graph = strdup(o->graph), m->input = strdup(o->input);
        m->output = strdup(o->output), m->loop = o->loop ? strdup(o->loop) : NULL;
        m->audio = o->api == CFG_OPENAI_AUDIO;
        m->voice = o->api == CFG_OPENAI_VOICE;
        m->options = o->options ? strdup(o->options) : NULL;
        m->transcript = o->transcript ? strdup(o->transcript) : NULL;
        m->context = o->context ? strdup(o->context) : NULL;
        m->segments = o->segments ? strdup(o->segments) : NULL;
        if (!m->name || !m->graph || !m->input || !m->output || (o->loop && !m->loop) ||
            (o->options && !m->options) || (o->transcript && !m->transcript) ||
            (o->context && !m->context) ||
            (o->segments && !m->segments)) {
            g->n_models++;
            goto err;
        }
    }
    /* A voice chat's body carries its audio file in base64 (4 bytes for
     * 3), up to the upload limit, besides the JSON around it. */
    g->max_chat_body = g->max_body;
    for (size_t i = 0; i < g->n_models; i++)
        if (g->models[i].voice && g->max_upload / 3 * 4 + GW_UPLOAD_ROOM > g->max_chat_body)
            g->max_chat_body = g->max_upload / 3 * 4 + GW_UPLOAD_ROOM;
    if (opts->server_public && opts->own) {
        g->curve = true;
        memcpy(g->server_public, opts->server_public, sizeof(g->server_public));
        g->keys = *opts->own;
    }
    rc = client_connect(g, GW_PROBE_MS, &g->admin);
    if (rc != 0) {
        bt_error("http: cannot connect to %s: %s", opts->endpoint, baton_client_strerror(rc));
        rc = BT_EIO;
        goto err;
    }
    baton_client_set_connect_timeout(g->admin, GW_PROBE_MS);
    if ((g->listen_fd = listen_on(opts->hostport, &rc)) < 0)
        goto err;
    unsigned limit = opts->max_connections ? opts->max_connections : GW_MAX_CONNECTIONS;
    /* The logger first, as MHD asks, so that it hears every message. */
    g->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                  MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, g, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                              NULL, MHD_OPTION_NOTIFY_COMPLETED, on_completed, g,
                              MHD_OPTION_LISTEN_SOCKET, g->listen_fd,
                              MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)GW_IDLE_S, MHD_OPTION_END);
    if (!g->mhd) {
        bt_error("http: cannot start the server on %s", opts->hostport);
        rc = BT_EIO;
        goto err;
    }
    g->listen_fd = -1;           /* MHD's now */
    bt_info("http on http://%s (/health, /metrics%s)", opts->hostport,
            g->n_models ? ", /v1/models, /v1/chat/completions, /v1/completions, /v1/audio/*"
                        : "");
    *out = g;
    return 0;
err:
    gateway_destroy(g);
    return rc;
}

void gateway_destroy(gateway *g)
{
    if (!g)
        return;
    if (g->mhd)
        MHD_stop_daemon(g->mhd);
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    baton_client_destroy(g->admin);
    for (size_t i = 0; i < g->n_idle; i++)
        baton_client_destroy(g->idle[i]);
    for (size_t i = 0; i < g->n_models; i++) {
        gw_model *m = &g->models[i];
        free(m->name), free(m->graph), free(m->input), free(m->output), free(m->loop);
        free(m->options), free(m->transcript), free(m->segments), free(m->context);
    }
    free(g->models);
    free(g->endpoint);
    bt_curve_keypair_wipe(&g->keys);
    pthread_mutex_destroy(&g->admin_mu);
    pthread_mutex_destroy(&g->pool_mu);
    free(g);
}
