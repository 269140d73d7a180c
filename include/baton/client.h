/* baton C client library.
 *
 * A client talks to batond over one ZeroMQ DEALER socket (docs/protocol.md):
 * it sends serialized ClientMessage frames and receives ServerMessage frames.
 * This library hides the protobuf encoding behind plain C types:
 *
 *     baton_client *c;
 *     baton_client_request *r;
 *     baton_client_event *ev;
 *     baton_client_create("ipc:///run/baton/baton.sock", &c);
 *     baton_client_request_create("chat", NULL, &r);
 *     baton_client_request_add_text(r, "prompt", "Hello");
 *     baton_client_request_set_stream(r, true);
 *     baton_client_send(c, r);
 *     while (baton_client_recv(c, 60000, &ev) == 0) {
 *         int last = ev->kind == BATON_CLIENT_EVENT_RESPONSE;
 *         ...                                  (use ev->value, ev->outputs)
 *         baton_client_event_free(ev);
 *         if (last) break;
 *     }
 *     baton_client_request_destroy(r);
 *     baton_client_destroy(c);
 *
 * Conventions: every function that can fail returns 0 or a negative
 * baton_client_err (baton_client_strerror names it); an output pointer is
 * written only on success. Everything the library allocates is released by
 * the matching _destroy / _free function, and those accept NULL. A handle is
 * not thread-safe (a ZeroMQ socket may be used by one thread at a time); use
 * one handle per thread, or serialize calls on it.
 *
 * Every public name starts with baton_client_ / BATON_CLIENT_ so that this
 * header can be included beside include/baton/backend.h. */
#ifndef BATON_CLIENT_H
#define BATON_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The endpoint batond listens on when its config does not say otherwise. */
#define BATON_CLIENT_DEFAULT_ENDPOINT "ipc:///run/baton/baton.sock"

/* Longest request_id the daemon accepts, in bytes. */
#define BATON_CLIENT_MAX_REQUEST_ID 256

/* Errors of this library (negative); 0 is success. */
typedef enum baton_client_err {
    BATON_CLIENT_OK = 0,
    BATON_CLIENT_ENOMEM = -1,    /* an allocation failed */
    BATON_CLIENT_EINVAL = -2,    /* an argument is malformed (the call changed nothing) */
    BATON_CLIENT_ECONNECT = -3,  /* the endpoint is invalid, or no connection came up in time */
    BATON_CLIENT_ETIMEDOUT = -4, /* no answer arrived within the timeout */
    BATON_CLIENT_EPROTO = -5,    /* the server sent a frame that is not a valid ServerMessage */
    BATON_CLIENT_EIO = -6,       /* a ZeroMQ call failed for another reason */
    BATON_CLIENT_EINTR = -7      /* a signal interrupted the wait; the call may be repeated */
} baton_client_err;

/* Element types; the numbers equal proto enum DType. */
typedef enum baton_client_dtype {
    BATON_CLIENT_DTYPE_UNSPECIFIED = 0, /* never valid in a tensor */
    BATON_CLIENT_DTYPE_F32 = 1,
    BATON_CLIENT_DTYPE_F16 = 2,
    BATON_CLIENT_DTYPE_BF16 = 3,
    BATON_CLIENT_DTYPE_I32 = 4,
    BATON_CLIENT_DTYPE_I64 = 5,
    BATON_CLIENT_DTYPE_U8 = 6, /* text is U8 of UTF-8 bytes */
    BATON_CLIENT_DTYPE_BOOL = 7
} baton_client_dtype;

/* Status codes of a response; the numbers equal proto enum Code (gRPC's). */
typedef enum baton_client_code {
    BATON_CLIENT_CODE_OK = 0,
    BATON_CLIENT_CODE_CANCELLED = 1,
    BATON_CLIENT_CODE_UNKNOWN = 2,
    BATON_CLIENT_CODE_INVALID_ARGUMENT = 3,
    BATON_CLIENT_CODE_DEADLINE_EXCEEDED = 4,
    BATON_CLIENT_CODE_NOT_FOUND = 5,
    BATON_CLIENT_CODE_ALREADY_EXISTS = 6,
    BATON_CLIENT_CODE_RESOURCE_EXHAUSTED = 8,
    BATON_CLIENT_CODE_FAILED_PRECONDITION = 9,
    BATON_CLIENT_CODE_INTERNAL = 13,
    BATON_CLIENT_CODE_UNAVAILABLE = 14
} baton_client_code;

/* Sampling parameters of a request (proto message Sampling). */
typedef struct baton_client_sampling {
    float temperature; /* 0: greedy; > 0 divides the logits */
    uint32_t top_k;    /* 0: no top-k cut */
    float top_p;       /* 0 or 1: no nucleus cut */
    uint64_t seed;     /* 0: the daemon draws one (reported in the response) */
} baton_client_sampling;

/* A tensor received from the daemon. Every pointer points into the event
 * that holds the tensor and lives as long as it. */
typedef struct baton_client_tensor {
    const char *name;         /* value name */
    baton_client_dtype dtype; /* always a valid dtype (checked on receipt) */
    const int64_t *dims;      /* ndims entries, each >= 0; NULL for a scalar */
    size_t ndims;             /* 0: a scalar of one element */
    const uint8_t *data;      /* nbytes bytes, little-endian, row-major */
    size_t nbytes;            /* exactly numel * dtype size (checked on receipt) */
    const char *modality;     /* "text", "image", "audio", "tensor", or "" */
} baton_client_tensor;

/* One node execution of a finished request (proto message NodeTiming). */
typedef struct baton_client_timing {
    const char *node;   /* node name */
    uint32_t iteration; /* iteration of the node's innermost loop (0 outside loops) */
    const char *worker; /* worker that ran it */
    uint64_t queue_us;  /* microseconds queued on the worker */
    uint64_t exec_us;   /* microseconds of execution */
} baton_client_timing;

/* How a loop of a finished request ended (proto enum LoopEnd). */
typedef enum baton_client_loop_end_kind {
    BATON_CLIENT_LOOP_FINISH = 1,        /* a node raised the finish signal (EOS) */
    BATON_CLIENT_LOOP_MAX_ITERS = 2,     /* it ran max_iters iterations */
} baton_client_loop_end_kind;

typedef struct baton_client_loop_end {
    const char *loop;                    /* loop name */
    baton_client_loop_end_kind how;
} baton_client_loop_end;

/* What ended an OK request's text before its graph did (proto enum
 * FinishReason). */
typedef enum baton_client_finish_reason {
    BATON_CLIENT_FINISH_NONE = 0,        /* neither: the graph ran to its end (loop_ends
                                            says how its loops did), or it failed */
    BATON_CLIENT_FINISH_STOP = 1,        /* a stop string (add_stop) */
    BATON_CLIENT_FINISH_LENGTH = 2,      /* max_tokens (set_max_tokens) */
} baton_client_finish_reason;

/* What a received frame was. */
typedef enum baton_client_event_kind {
    BATON_CLIENT_EVENT_CHUNK = 1,    /* a streamed value: request_id, seq, value */
    BATON_CLIENT_EVENT_RESPONSE = 2, /* the terminal answer: request_id, code, message,
                                        outputs, timings, total_us */
    BATON_CLIENT_EVENT_HEALTH = 3,   /* live, ready, workers_ready, message */
    BATON_CLIENT_EVENT_STATS = 4,    /* text (Prometheus text format) */
    BATON_CLIENT_EVENT_INSPECT = 5,  /* text (graph, partition, schedule) */
    BATON_CLIENT_EVENT_CANCEL = 6    /* the answer to a cancel: request_id, code (OK: found
                                        and being ended; NOT_FOUND: no such request in
                                        flight; FAILED_PRECONDITION: ambiguous), message */
} baton_client_event_kind;

/* One decoded ServerMessage. Only the fields its kind names are meaningful;
 * the others are zero, NULL or "". Strings are never NULL. */
typedef struct baton_client_event {
    baton_client_event_kind kind;
    const char *request_id;              /* chunk, response */
    uint64_t seq;                        /* chunk: 0, 1, 2... per request */
    baton_client_tensor value;           /* chunk: the streamed value */
    baton_client_code code;              /* response: OK or why the request ended */
    const char *message;                 /* response: status message; health: detail */
    const baton_client_tensor *outputs;  /* response: n_outputs client-bound values */
    size_t n_outputs;
    const baton_client_timing *timings;  /* response: n_timings, in completion order */
    size_t n_timings;
    uint64_t total_us;                   /* response: microseconds from acceptance */
    bool live;                           /* health: the conductor's loop runs */
    bool ready;                          /* health: every worker and model is ready */
    const char *const *workers_ready;    /* health: n_workers_ready worker names */
    size_t n_workers_ready;
    const char *text;                    /* stats, inspect */
    uint64_t seed;                       /* response: the sampling seed the request ran
                                            with (the daemon's draw when it sent 0) */
    uint32_t prompt_tokens;              /* response: usage, as the model counted it */
    uint32_t completion_tokens;          /* (both 0 when no node counted tokens) */
    const baton_client_loop_end *loop_ends; /* response: n_loop_ends loops that ended */
    size_t n_loop_ends;
    baton_client_finish_reason finish_reason; /* response: a stop string or max_tokens
                                                 ended the text (OK responses only) */
    uint32_t cached_tokens;              /* response: of prompt_tokens, those read from a
                                            prefix cache instead of computed */
} baton_client_event;

typedef struct baton_client baton_client;                 /* a connection (opaque) */
typedef struct baton_client_request baton_client_request; /* an InferRequest being built */

/* ---- Connection ---------------------------------------------------------- */

/* Creates a handle connected to ENDPOINT (ipc://PATH or tcp://HOST:PORT;
 * NULL: BATON_CLIENT_DEFAULT_ENDPOINT). ZeroMQ connects in the background,
 * so a daemon that is not up yet is not an error here: the first send waits
 * for the connection up to the connect timeout (5000 ms unless set).
 * Returns BATON_CLIENT_ECONNECT for an endpoint ZeroMQ rejects. */
int baton_client_create(const char *endpoint, baton_client **out);

/* Connection options for baton_client_create_with. Zero-initialize it and
 * set what you need.
 *
 * CURVE: a daemon listening on tcp:// with daemon.curve set accepts only
 * CURVE clients whose public key is listed in its client_keys file
 * (docs/operations.md, "Security"). Keys are given as Z85 text, the 40
 * characters of the key files `batonctl keygen NAME` writes (NAME.key holds
 * the secret key, NAME.pub the public one); reading the files is the
 * caller's business (batonctl's --client-key does it). The library copies
 * the keys into the socket and keeps no pointer to them. A client whose key
 * the daemon does not authorize gets no error from this library: the
 * handshake never completes, so a send fails with BATON_CLIENT_ECONNECT
 * after the connect timeout (or a probe times out). */
typedef struct baton_client_options {
    int connect_timeout_ms;        /* how long a send waits for the connection to
                                      come up: 0 means 5000 ms, -1 forever */
    const char *server_public_key; /* the daemon's CURVE public key, Z85 (40 chars,
                                      the daemon's .pub file); required for a tcp://
                                      daemon with CURVE; NULL: no CURVE */
    const char *public_key;        /* this client's CURVE key pair, Z85 (40 chars each):
                                      the .pub and .key files of `batonctl keygen`; */
    const char *secret_key;        /* both or neither. Both NULL: a fresh pair is made,
                                      which a daemon with client_keys refuses (it
                                      serves only a daemon set up without CURVE
                                      client checks, e.g. a test server) */
} baton_client_options;

/* As baton_client_create, with OPTS (NULL: defaults). BATON_CLIENT_EINVAL:
 * a key that is not 40 Z85 characters, one of public_key / secret_key
 * without the other, or CURVE asked of a libzmq built without it. */
int baton_client_create_with(const char *endpoint, const baton_client_options *opts,
                             baton_client **out);

/* Closes the connection and frees the handle and every event still queued
 * in it. Frames not yet delivered get at most one second to leave (so that a
 * cancel sent just before is not lost). NULL is a no-op. */
void baton_client_destroy(baton_client *c);

/* Sets how long a send waits for the connection to come up, in ms
 * (-1: forever). Past it the send fails with BATON_CLIENT_ECONNECT. */
void baton_client_set_connect_timeout(baton_client *c, int timeout_ms);

/* ---- Building an InferRequest ------------------------------------------- */

/* Starts a request for GRAPH. REQUEST_ID is copied; NULL generates one that
 * is unique across processes (random 64 bits plus a counter). Defaults: no
 * inputs, stream off, timeout 0 (the daemon's), no sampling, no max_iters.
 * BATON_CLIENT_EINVAL: GRAPH is NULL or empty, or REQUEST_ID is empty or
 * longer than BATON_CLIENT_MAX_REQUEST_ID. */
int baton_client_request_create(const char *graph, const char *request_id,
                                baton_client_request **out);

/* Frees a request. A request may be destroyed right after it was sent. NULL
 * is a no-op. */
void baton_client_request_destroy(baton_client_request *r);

/* The request's id (given or generated); valid until the request is
 * destroyed. */
const char *baton_client_request_id(const baton_client_request *r);

/* Adds an input tensor; NAME, DIMS and DATA are copied. DIMS has NDIMS
 * entries (NDIMS 0: a scalar); NBYTES must equal the product of the dims
 * times the dtype's size. BATON_CLIENT_EINVAL: a bad dtype, a negative dim, a
 * size that overflows or does not match, or a name already added. */
int baton_client_request_add_input(baton_client_request *r, const char *name,
                                   baton_client_dtype dtype, const int64_t *dims, size_t ndims,
                                   const void *data, size_t nbytes);

/* Adds the NUL-terminated UTF-8 string TEXT as a U8 tensor of dims
 * [strlen(TEXT)], the way the daemon takes text. Errors as add_input. */
int baton_client_request_add_text(baton_client_request *r, const char *name, const char *text);

/* Appends a turn to the request's conversation: ROLE "system", "user" or
 * "assistant", CONTENT UTF-8 (both copied).  The daemon gives the turns to
 * one graph input instead of a tensor (set_messages_input; by default the
 * graph's only input), and a model with a chat template renders them, the
 * turns' text never parsed for special tokens.  BATON_CLIENT_EINVAL: another
 * role, or a NULL argument. */
int baton_client_request_add_message(baton_client_request *r, const char *role,
                                     const char *content);

/* Names the graph input that takes the messages (copied; NULL or "": the
 * graph's only input). */
int baton_client_request_set_messages_input(baton_client_request *r, const char *name);

/* Asks for InferChunk events for the graph's new_token edges (default off:
 * those values arrive joined in the response's outputs). */
void baton_client_request_set_stream(baton_client_request *r, bool stream);

/* Sets the request's deadline in ms, counted by the daemon from acceptance
 * (0: the daemon's request_timeout_ms). */
void baton_client_request_set_timeout(baton_client_request *r, uint32_t timeout_ms);

/* Sets the sampling parameters (copied). BATON_CLIENT_EINVAL: a negative or
 * non-finite temperature, or top_p outside [0, 1]. */
int baton_client_request_set_sampling(baton_client_request *r, const baton_client_sampling *s);

/* Caps loop LOOP at MAX_ITERS iterations for this request (it can only lower
 * the config's cap). Setting the same loop again replaces the value.
 * BATON_CLIENT_EINVAL: LOOP empty or MAX_ITERS 0 (the daemon rejects 0). */
int baton_client_request_set_max_iters(baton_client_request *r, const char *loop,
                                       uint32_t max_iters);

/* Adds a stop string (copied): the text stream's text ends before the first
 * stop string found in it, even one that spans several tokens, and the
 * rest of the request is dropped; the response is OK with finish_reason
 * BATON_CLIENT_FINISH_STOP.  The daemon takes at most 16, each 1 to 256
 * bytes of UTF-8.  BATON_CLIENT_EINVAL: NULL or empty. */
int baton_client_request_add_stop(baton_client_request *r, const char *stop);

/* Caps the text stream at MAX_TOKENS non-empty values (tokens); then the
 * rest of the request is dropped and the response is OK with finish_reason
 * BATON_CLIENT_FINISH_LENGTH.  0: no cap (the default). */
void baton_client_request_set_max_tokens(baton_client_request *r, uint32_t max_tokens);

/* Names the text stream that stop strings and max_tokens apply to (copied;
 * NULL or "": the graph's only one, an output with to: client, new_token:
 * true, modality: text). */
int baton_client_request_set_text_output(baton_client_request *r, const char *name);

/* Marks graph input NAME (copied) as raw text: the model takes it as it
 * is, without its chat template (a completion rather than a chat turn).
 * BATON_CLIENT_EINVAL: NULL or empty. */
int baton_client_request_add_raw_input(baton_client_request *r, const char *name);

/* ---- Talking to the daemon ----------------------------------------------- */

/* Sends R. Several requests may be in flight on one handle; their events
 * arrive interleaved and name their request_id. R is not consumed.
 * BATON_CLIENT_ECONNECT: no connection within the connect timeout. */
int baton_client_send(baton_client *c, const baton_client_request *r);

/* Asks the daemon to end the in-flight request REQUEST_ID of this handle
 * (or, when this handle has none, the one other connection's request of that
 * id).  The daemon answers with an event of kind CANCEL, which
 * baton_client_recv returns like any other; the request's own terminal
 * response (CANCELLED unless it had already ended) follows on its
 * connection. */
int baton_client_cancel(baton_client *c, const char *request_id);

/* As baton_client_cancel, then waits up to TIMEOUT_MS (-1: forever) for
 * the CANCEL event that answers it, returned in *OUT; other events that
 * arrive meanwhile are kept, in order, for baton_client_recv. */
int baton_client_cancel_wait(baton_client *c, const char *request_id, int timeout_ms,
                             baton_client_event **out);

/* Receives the next event: a chunk or response of a request in flight, in
 * the order the daemon sent them. TIMEOUT_MS: -1 waits forever, 0 only
 * looks. The event is the caller's; free it with baton_client_event_free.
 * BATON_CLIENT_ETIMEDOUT: nothing arrived in time. BATON_CLIENT_EPROTO: a
 * frame that does not decode, or decodes to a malformed message (a tensor
 * whose size does not match its dims, a chunk without a value); the frame
 * is consumed and the handle stays usable. */
int baton_client_recv(baton_client *c, int timeout_ms, baton_client_event **out);

/* Frees an event and everything its fields point to. NULL is a no-op. */
void baton_client_event_free(baton_client_event *ev);

/* Blocking probes: send a HealthRequest / StatsRequest / InspectRequest and
 * wait up to TIMEOUT_MS (-1: forever) for its answer, returned as an event
 * of kind HEALTH / STATS / INSPECT. Chunks and responses of requests in
 * flight that arrive meanwhile are kept, in order, for baton_client_recv.
 * An answer that arrives after its call timed out is recognised and dropped
 * (these answers carry no id; the daemon sends them in the order asked).
 * GRAPH NULL or "": every graph. */
int baton_client_health(baton_client *c, int timeout_ms, baton_client_event **out);
int baton_client_stats(baton_client *c, int timeout_ms, baton_client_event **out);
int baton_client_inspect(baton_client *c, const char *graph, int timeout_ms,
                         baton_client_event **out);

/* ---- Names and sizes ----------------------------------------------------- */

/* A sentence naming ERR (a baton_client_err); "unknown error" otherwise. */
const char *baton_client_strerror(int err);

/* The proto name of CODE ("OK", "NOT_FOUND"...); "UNKNOWN" for a number the
 * protocol does not define. */
const char *baton_client_code_name(int code);

/* The lower-case name of DTYPE ("f32", "bf16", "u8"...); "?" when invalid. */
const char *baton_client_dtype_name(int dtype);

/* Parses a dtype name, case-insensitive ("f32", "F32", "float32", "i64",
 * "int64", "u8", "uint8", "bool"...). BATON_CLIENT_EINVAL when unknown. */
int baton_client_dtype_from_name(const char *name, baton_client_dtype *out);

/* Bytes per element of DTYPE; 0 when invalid. */
size_t baton_client_dtype_size(int dtype);

/* Number of elements of T (the product of its dims; 1 for a scalar). */
uint64_t baton_client_tensor_numel(const baton_client_tensor *t);

#ifdef __cplusplus
}
#endif

#endif
