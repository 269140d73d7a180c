/* The C client library (include/baton/client.h): requests are built straight
 * into protobuf-c structs, sent as one frame each on a DEALER socket, and
 * answers are decoded into events that point into the unpacked message, so
 * a large output tensor is never copied after ZeroMQ hands it over. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "baton/client.h"
#include "proto/baton.pb-c.h"

/* The three probes whose answers carry no id (docs/protocol.md). */
enum { PROBE_HEALTH, PROBE_STATS, PROBE_INSPECT, PROBE_COUNT };

/* A received event and what its fields point into. ev comes first so that
 * baton_client_event_free can get back from the public pointer. */
typedef struct event_box {
    baton_client_event ev;
    Baton__V1__ServerMessage *msg; /* owned: the unpacked frame */
    baton_client_tensor *outputs;  /* owned: views of msg's outputs */
    baton_client_timing *timings;  /* owned: views of msg's timings */
    baton_client_loop_end *loop_ends; /* owned: views of msg's loop ends */
    struct event_box *next;        /* in the handle's pending queue */
} event_box;

struct baton_client {
    void *ctx;                /* owned ZeroMQ context: one per handle keeps handles independent */
    void *sock;               /* DEALER */
    event_box *head, *tail;   /* chunks/responses that arrived during a blocking probe */
    unsigned stale[PROBE_COUNT]; /* probe answers still due for calls that gave up */
};

struct baton_client_request {
    Baton__V1__InferRequest req; /* every pointer in it is owned by the request */
    Baton__V1__Sampling sampling; /* req.sampling points here once set */
};

/* ---- names and sizes ------------------------------------------------------ */

const char *baton_client_strerror(int err)
{
    switch (err) {
    case BATON_CLIENT_OK: return "success";
    case BATON_CLIENT_ENOMEM: return "out of memory";
    case BATON_CLIENT_EINVAL: return "invalid argument";
    case BATON_CLIENT_ECONNECT: return "cannot connect to the daemon";
    case BATON_CLIENT_ETIMEDOUT: return "timed out waiting for the daemon";
    case BATON_CLIENT_EPROTO: return "malformed message from the daemon";
    case BATON_CLIENT_EIO: return "socket error";
    case BATON_CLIENT_EINTR: return "interrupted";
    }
    return "unknown error";
}

const char *baton_client_code_name(int code)
{
    switch (code) {
    case BATON_CLIENT_CODE_OK: return "OK";
    case BATON_CLIENT_CODE_CANCELLED: return "CANCELLED";
    case BATON_CLIENT_CODE_UNKNOWN: return "UNKNOWN";
    case BATON_CLIENT_CODE_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case BATON_CLIENT_CODE_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case BATON_CLIENT_CODE_NOT_FOUND: return "NOT_FOUND";
    case BATON_CLIENT_CODE_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case BATON_CLIENT_CODE_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case BATON_CLIENT_CODE_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case BATON_CLIENT_CODE_INTERNAL: return "INTERNAL";
    case BATON_CLIENT_CODE_UNAVAILABLE: return "UNAVAILABLE";
    }
    return "UNKNOWN";
}

static const struct {
    const char *name; /* canonical name first, then aliases */
    baton_client_dtype dtype;
    size_t size; /* bytes per element */
} dtypes[] = {
    {"f32", BATON_CLIENT_DTYPE_F32, 4},   {"f16", BATON_CLIENT_DTYPE_F16, 2},
    {"bf16", BATON_CLIENT_DTYPE_BF16, 2}, {"i32", BATON_CLIENT_DTYPE_I32, 4},
    {"i64", BATON_CLIENT_DTYPE_I64, 8},   {"u8", BATON_CLIENT_DTYPE_U8, 1},
    {"bool", BATON_CLIENT_DTYPE_BOOL, 1}, {"float32", BATON_CLIENT_DTYPE_F32, 4},
    {"float16", BATON_CLIENT_DTYPE_F16, 2}, {"bfloat16", BATON_CLIENT_DTYPE_BF16, 2},
    {"int32", BATON_CLIENT_DTYPE_I32, 4}, {"int64", BATON_CLIENT_DTYPE_I64, 8},
    {"uint8", BATON_CLIENT_DTYPE_U8, 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *baton_client_dtype_name(int dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if ((int)dtypes[i].dtype == dtype)
            return dtypes[i].name;
    return "?";
}

int baton_client_dtype_from_name(const char *name, baton_client_dtype *out)
{
    if (!name)
        return BATON_CLIENT_EINVAL;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcasecmp(dtypes[i].name, name)) {
            *out = dtypes[i].dtype;
            return 0;
        }
    return BATON_CLIENT_EINVAL;
}

size_t baton_client_dtype_size(int dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if ((int)dtypes[i].dtype == dtype)
            return dtypes[i].size;
    return 0;
}

uint64_t baton_client_tensor_numel(const baton_client_tensor *t)
{
    uint64_t n = 1;
    for (size_t i = 0; i < t->ndims; i++)
        n *= (uint64_t)t->dims[i];
    return n;
}

/* Byte size of a tensor of DTYPE and DIMS in *OUT; BATON_CLIENT_EINVAL for
 * a bad dtype, a negative dim or a product that overflows. */
static int tensor_nbytes(int dtype, const int64_t *dims, size_t ndims, size_t *out)
{
    size_t esz = baton_client_dtype_size(dtype);
    if (!esz)
        return BATON_CLIENT_EINVAL;
    size_t n = esz;
    for (size_t i = 0; i < ndims; i++) {
        if (dims[i] < 0)
            return BATON_CLIENT_EINVAL;
        if ((uint64_t)dims[i] > SIZE_MAX)
            return BATON_CLIENT_EINVAL;
        size_t d = (size_t)dims[i];
        if (d && n > SIZE_MAX / d)
            return BATON_CLIENT_EINVAL;
        n *= d;
    }
    *out = n;
    return 0;
}

/* ---- time ------------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until DEADLINE (-1: none) as zmq_poll wants them. */
static long time_left(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - now_ms();
    return left > 0 ? (long)left : 0;
}

static int64_t deadline_after(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

/* ---- connection ------------------------------------------------------------ */

/* Sets the CURVE options of a not yet connected socket. */
static int set_curve(void *sock, const baton_client_options *o)
{
    char pub[41], sec[41];
    if (!zmq_has("curve"))
        return BATON_CLIENT_EINVAL;
    if (strlen(o->server_public_key) != 40 || (!o->public_key != !o->secret_key))
        return BATON_CLIENT_EINVAL;
    if (o->public_key) {
        if (strlen(o->public_key) != 40 || strlen(o->secret_key) != 40)
            return BATON_CLIENT_EINVAL;
        memcpy(pub, o->public_key, 41);
        memcpy(sec, o->secret_key, 41);
    } else if (zmq_curve_keypair(pub, sec) != 0) {
        return BATON_CLIENT_EIO;
    }
    /* Z85 keys are set as 40-character strings (41 bytes with the NUL). */
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, o->server_public_key, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)
        return BATON_CLIENT_EINVAL;
    return 0;
}

int baton_client_create_with(const char *endpoint, const baton_client_options *opts,
                             baton_client **out)
{
    static const baton_client_options defaults = {0};
    const baton_client_options *o = opts ? opts : &defaults;
    int rc = BATON_CLIENT_ENOMEM;
    baton_client *c = calloc(1, sizeof *c);
    if (!c)
        return BATON_CLIENT_ENOMEM;
    c->ctx = zmq_ctx_new();
    if (!c->ctx)
        goto err;
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) {
        rc = BATON_CLIENT_EIO;
        goto err;
    }
    /* IMMEDIATE: queue nothing on a connection that is not up, so that a
     * send to an absent daemon waits (up to the connect timeout) and then
     * fails, instead of "succeeding" into a queue nobody reads. */
    int one = 1, zero = 0, linger = 0;
    zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one);
    /* The ROUTER drops frames for a peer whose pipe is full; an unbounded
     * receive queue here means a slow reader of a long stream loses no
     * chunk (the memory is the client's own). */
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    baton_client_set_connect_timeout(c, o->connect_timeout_ms ? o->connect_timeout_ms : 5000);
    if (o->server_public_key && (rc = set_curve(c->sock, o)) != 0)
        goto err;
    if (zmq_connect(c->sock, endpoint ? endpoint : BATON_CLIENT_DEFAULT_ENDPOINT) != 0) {
        rc = BATON_CLIENT_ECONNECT;
        goto err;
    }
    *out = c;
    return 0;
err:
    if (c->sock)
        zmq_close(c->sock);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    free(c);
    return rc;
}

int baton_client_create(const char *endpoint, baton_client **out)
{
    return baton_client_create_with(endpoint, NULL, out);
}

void baton_client_destroy(baton_client *c)
{
    if (!c)
        return;
    /* A short linger lets a cancel sent just before leave; a dead daemon
     * cannot hold the caller for longer than this. */
    int linger = 1000;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(c->sock);
    zmq_ctx_term(c->ctx);
    while (c->head) {
        event_box *b = c->head;
        c->head = b->next;
        baton_client_event_free(&b->ev);
    }
    free(c);
}

void baton_client_set_connect_timeout(baton_client *c, int timeout_ms)
{
    int t = timeout_ms < 0 ? -1 : timeout_ms;
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &t, sizeof t);
}

/* ---- requests -------------------------------------------------------------- */

/* Writes an id unique across processes and time: 64 random bits keep two
 * clients apart, the counter keeps one process's ids apart even if the
 * random source failed and the fallback repeats. */
static void make_request_id(char *buf, size_t cap)
{
    static atomic_ulong counter;
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rnd = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_sec << 20 ^ (uint64_t)ts.tv_nsec;
    }
    unsigned long n = atomic_fetch_add(&counter, 1) + 1;
    snprintf(buf, cap, "%016" PRIx64 "-%lu", rnd, n);
}

int baton_client_request_create(const char *graph, const char *request_id,
                                baton_client_request **out)
{
    char idbuf[64];
    if (!graph || !*graph)
        return BATON_CLIENT_EINVAL;
    if (request_id && (!*request_id || strlen(request_id) > BATON_CLIENT_MAX_REQUEST_ID))
        return BATON_CLIENT_EINVAL;
    if (!request_id) {
        make_request_id(idbuf, sizeof idbuf);
        request_id = idbuf;
    }
    baton_client_request *r = calloc(1, sizeof *r);
    if (!r)
        return BATON_CLIENT_ENOMEM;
    baton__v1__infer_request__init(&r->req);
    baton__v1__sampling__init(&r->sampling);
    r->req.request_id = strdup(request_id);
    r->req.graph = strdup(graph);
    if (!r->req.request_id || !r->req.graph) {
        baton_client_request_destroy(r);
        return BATON_CLIENT_ENOMEM;
    }
    *out = r;
    return 0;
}

static void tensor_msg_free(Baton__V1__Tensor *t)
{
    if (!t)
        return;
    free(t->name);
    free(t->dims);
    free(t->data.data);
    free(t);
}

void baton_client_request_destroy(baton_client_request *r)
{
    if (!r)
        return;
    free(r->req.request_id);
    free(r->req.graph);
    for (size_t i = 0; i < r->req.n_inputs; i++)
        tensor_msg_free(r->req.inputs[i]);
    free(r->req.inputs);
    for (size_t i = 0; i < r->req.n_max_iters; i++) {
        free(r->req.max_iters[i]->key);
        free(r->req.max_iters[i]);
    }
    free(r->req.max_iters);
    for (size_t i = 0; i < r->req.n_messages; i++) {
        free(r->req.messages[i]->role);
        free(r->req.messages[i]->content);
        free(r->req.messages[i]);
    }
    free(r->req.messages);
    if (r->req.messages_input != protobuf_c_empty_string)
        free(r->req.messages_input);
    for (size_t i = 0; i < r->req.n_stop; i++)
        free(r->req.stop[i]);
    free(r->req.stop);
    for (size_t i = 0; i < r->req.n_raw_inputs; i++)
        free(r->req.raw_inputs[i]);
    free(r->req.raw_inputs);
    if (r->req.text_output != protobuf_c_empty_string)
        free(r->req.text_output);
    free(r);
}

const char *baton_client_request_id(const baton_client_request *r)
{
    return r->req.request_id;
}

int baton_client_request_add_input(baton_client_request *r, const char *name,
                                   baton_client_dtype dtype, const int64_t *dims, size_t ndims,
                                   const void *data, size_t nbytes)
{
    size_t want;
    if (!name || !*name || (ndims && !dims) || (nbytes && !data))
        return BATON_CLIENT_EINVAL;
    if (tensor_nbytes(dtype, dims, ndims, &want) != 0 || want != nbytes)
        return BATON_CLIENT_EINVAL;
    for (size_t i = 0; i < r->req.n_inputs; i++)
        if (!strcmp(r->req.inputs[i]->name, name))
            return BATON_CLIENT_EINVAL;

    Baton__V1__Tensor **grown =
        realloc(r->req.inputs, (r->req.n_inputs + 1) * sizeof *r->req.inputs);
    if (!grown)
        return BATON_CLIENT_ENOMEM;
    r->req.inputs = grown;
    Baton__V1__Tensor *t = malloc(sizeof *t);
    if (!t)
        return BATON_CLIENT_ENOMEM;
    baton__v1__tensor__init(t);
    t->name = strdup(name);
    t->dims = ndims ? malloc(ndims * sizeof *t->dims) : NULL;
    /* One spare byte so that an empty tensor still gets a pointer that is
     * ours to free (the initializer's is not). */
    t->data.data = malloc(nbytes ? nbytes : 1);
    if (!t->name || (ndims && !t->dims) || !t->data.data) {
        tensor_msg_free(t);
        return BATON_CLIENT_ENOMEM;
    }
    if (ndims)
        memcpy(t->dims, dims, ndims * sizeof *dims);
    t->n_dims = ndims;
    if (nbytes)
        memcpy(t->data.data, data, nbytes);
    t->data.len = nbytes;
    t->dtype = (Baton__V1__DType)dtype;
    r->req.inputs[r->req.n_inputs++] = t;
    return 0;
}

int baton_client_request_add_text(baton_client_request *r, const char *name, const char *text)
{
    if (!text)
        return BATON_CLIENT_EINVAL;
    int64_t n = (int64_t)strlen(text);
    return baton_client_request_add_input(r, name, BATON_CLIENT_DTYPE_U8, &n, 1, text,
                                          (size_t)n);
}

void baton_client_request_set_stream(baton_client_request *r, bool stream)
{
    r->req.stream = stream;
}

void baton_client_request_set_timeout(baton_client_request *r, uint32_t timeout_ms)
{
    r->req.timeout_ms = timeout_ms;
}

int baton_client_request_set_sampling(baton_client_request *r, const baton_client_sampling *s)
{
    if (!s || !isfinite(s->temperature) || s->temperature < 0 || !(s->top_p >= 0) ||
        s->top_p > 1)
        return BATON_CLIENT_EINVAL;
    r->sampling.temperature = s->temperature;
    r->sampling.top_k = s->top_k;
    r->sampling.top_p = s->top_p;
    r->sampling.seed = s->seed;
    r->req.sampling = &r->sampling;
    return 0;
}

int baton_client_request_set_max_iters(baton_client_request *r, const char *loop,
                                       uint32_t max_iters)
{
    if (!loop || !*loop || max_iters == 0)
        return BATON_CLIENT_EINVAL;
    for (size_t i = 0; i < r->req.n_max_iters; i++)
        if (!strcmp(r->req.max_iters[i]->key, loop)) {
            r->req.max_iters[i]->value = max_iters;
            return 0;
        }
    Baton__V1__InferRequest__MaxItersEntry **grown =
        realloc(r->req.max_iters, (r->req.n_max_iters + 1) * sizeof *r->req.max_iters);
    if (!grown)
        return BATON_CLIENT_ENOMEM;
    r->req.max_iters = grown;
    Baton__V1__InferRequest__MaxItersEntry *e = malloc(sizeof *e);
    if (!e)
        return BATON_CLIENT_ENOMEM;
    baton__v1__infer_request__max_iters_entry__init(e);
    e->key = strdup(loop);
    if (!e->key) {
        free(e);
        return BATON_CLIENT_ENOMEM;
    }
    e->value = max_iters;
    r->req.max_iters[r->req.n_max_iters++] = e;
    return 0;
}

int baton_client_request_add_message(baton_client_request *r, const char *role,
                                     const char *content)
{
    if (!role || !content ||
        (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
        return BATON_CLIENT_EINVAL;
    Baton__V1__ChatMessage **grown =
        realloc(r->req.messages, (r->req.n_messages + 1) * sizeof *r->req.messages);
    if (!grown)
        return BATON_CLIENT_ENOMEM;
    r->req.messages = grown;
    Baton__V1__ChatMessage *m = malloc(sizeof *m);
    if (!m)
        return BATON_CLIENT_ENOMEM;
    baton__v1__chat_message__init(m);
    m->role = strdup(role);
    m->content = strdup(content);
    if (!m->role || !m->content) {
        free(m->role);
        free(m->content);
        free(m);
        return BATON_CLIENT_ENOMEM;
    }
    r->req.messages[r->req.n_messages++] = m;
    return 0;
}

int baton_client_request_set_messages_input(baton_client_request *r, const char *name)
{
    char *copy = (char *)protobuf_c_empty_string;
    if (name && *name && !(copy = strdup(name)))
        return BATON_CLIENT_ENOMEM;
    if (r->req.messages_input != protobuf_c_empty_string)
        free(r->req.messages_input);
    r->req.messages_input = copy;
    return 0;
}

/* Appends a copy of S to the string list *V of *N. */
static int strs_add(char ***v, size_t *n, const char *s)
{
    if (!s || !*s)
        return BATON_CLIENT_EINVAL;
    char **grown = realloc(*v, (*n + 1) * sizeof **v);
    if (!grown)
        return BATON_CLIENT_ENOMEM;
    *v = grown;
    if (!(grown[*n] = strdup(s)))
        return BATON_CLIENT_ENOMEM;
    (*n)++;
    return 0;
}

int baton_client_request_add_stop(baton_client_request *r, const char *stop)
{
    return strs_add(&r->req.stop, &r->req.n_stop, stop);
}

void baton_client_request_set_max_tokens(baton_client_request *r, uint32_t max_tokens)
{
    r->req.max_tokens = max_tokens;
}

int baton_client_request_set_text_output(baton_client_request *r, const char *name)
{
    char *copy = (char *)protobuf_c_empty_string;
    if (name && *name && !(copy = strdup(name)))
        return BATON_CLIENT_ENOMEM;
    if (r->req.text_output != protobuf_c_empty_string)
        free(r->req.text_output);
    r->req.text_output = copy;
    return 0;
}

int baton_client_request_add_raw_input(baton_client_request *r, const char *name)
{
    return strs_add(&r->req.raw_inputs, &r->req.n_raw_inputs, name);
}

/* ---- sending --------------------------------------------------------------- */

static int send_message(baton_client *c, const Baton__V1__ClientMessage *m)
{
    zmq_msg_t zm;
    size_t n = baton__v1__client_message__get_packed_size(m);
    if (zmq_msg_init_size(&zm, n) != 0)
        return BATON_CLIENT_ENOMEM;
    baton__v1__client_message__pack(m, zmq_msg_data(&zm));
    if (zmq_msg_send(&zm, c->sock, 0) < 0) {
        int e = errno;
        zmq_msg_close(&zm);
        /* EAGAIN after ZMQ_SNDTIMEO with ZMQ_IMMEDIATE: no peer came up. */
        return e == EAGAIN ? BATON_CLIENT_ECONNECT
             : e == EINTR  ? BATON_CLIENT_EINTR
                           : BATON_CLIENT_EIO;
    }
    return 0;
}

int baton_client_send(baton_client *c, const baton_client_request *r)
{
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_INFER;
    /* pack() only reads; the cast drops const for the generated field type. */
    m.infer = (Baton__V1__InferRequest *)&r->req;
    return send_message(c, &m);
}

int baton_client_cancel(baton_client *c, const char *request_id)
{
    if (!request_id || !*request_id)
        return BATON_CLIENT_EINVAL;
    Baton__V1__CancelRequest cr = BATON__V1__CANCEL_REQUEST__INIT;
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    cr.request_id = (char *)request_id;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_CANCEL;
    m.cancel = &cr;
    return send_message(c, &m);
}

static int probe(baton_client *c, const Baton__V1__ClientMessage *m,
                 baton_client_event_kind want, const char *rid, int timeout_ms,
                 baton_client_event **out);

int baton_client_cancel_wait(baton_client *c, const char *request_id, int timeout_ms,
                             baton_client_event **out)
{
    if (!request_id || !*request_id)
        return BATON_CLIENT_EINVAL;
    Baton__V1__CancelRequest cr = BATON__V1__CANCEL_REQUEST__INIT;
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    cr.request_id = (char *)request_id;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_CANCEL;
    m.cancel = &cr;
    return probe(c, &m, BATON_CLIENT_EVENT_CANCEL, request_id, timeout_ms, out);
}

/* ---- receiving ------------------------------------------------------------- */

void baton_client_event_free(baton_client_event *ev)
{
    if (!ev)
        return;
    event_box *b = (event_box *)ev;
    if (b->msg)
        baton__v1__server_message__free_unpacked(b->msg, NULL);
    free(b->outputs);
    free(b->timings);
    free(b->loop_ends);
    free(b);
}

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

/* Fills OUT with a view of T after checking what the printing and math of
 * a caller rely on: a known dtype, dims >= 0, and a byte count that matches. */
static int tensor_view(const Baton__V1__Tensor *t, baton_client_tensor *out)
{
    size_t want;
    if (!t || tensor_nbytes(t->dtype, t->dims, t->n_dims, &want) != 0 || want != t->data.len)
        return BATON_CLIENT_EPROTO;
    out->name = str_or_empty(t->name);
    out->dtype = (baton_client_dtype)t->dtype;
    out->dims = t->n_dims ? t->dims : NULL;
    out->ndims = t->n_dims;
    out->data = t->data.len ? t->data.data : (const uint8_t *)"";
    out->nbytes = t->data.len;
    out->modality = str_or_empty(t->modality);
    return 0;
}

static int decode_response(event_box *b, const Baton__V1__InferResponse *r)
{
    baton_client_event *ev = &b->ev;
    ev->request_id = str_or_empty(r->request_id);
    ev->code = r->status ? (baton_client_code)r->status->code : BATON_CLIENT_CODE_OK;
    ev->message = r->status ? str_or_empty(r->status->message) : "";
    ev->total_us = r->total_us;
    ev->seed = r->seed;
    /* A value a newer daemon added passes through as its number. */
    ev->finish_reason = (baton_client_finish_reason)r->finish_reason;
    if (r->usage) {
        ev->prompt_tokens = r->usage->prompt_tokens;
        ev->completion_tokens = r->usage->completion_tokens;
        ev->cached_tokens = r->usage->cached_tokens;
    }
    if (r->n_loop_ends) {
        b->loop_ends = calloc(r->n_loop_ends, sizeof *b->loop_ends);
        if (!b->loop_ends)
            return BATON_CLIENT_ENOMEM;
        for (size_t i = 0; i < r->n_loop_ends; i++) {
            const Baton__V1__InferResponse__LoopEndsEntry *e = r->loop_ends[i];
            if (!e)
                return BATON_CLIENT_EPROTO;
            /* A value a newer daemon added passes through as its number. */
            b->loop_ends[i] = (baton_client_loop_end){str_or_empty(e->key),
                                                      (baton_client_loop_end_kind)e->value};
        }
        ev->loop_ends = b->loop_ends;
        ev->n_loop_ends = r->n_loop_ends;
    }
    if (r->n_outputs) {
        b->outputs = calloc(r->n_outputs, sizeof *b->outputs);
        if (!b->outputs)
            return BATON_CLIENT_ENOMEM;
        for (size_t i = 0; i < r->n_outputs; i++)
            if (tensor_view(r->outputs[i], &b->outputs[i]) != 0)
                return BATON_CLIENT_EPROTO;
    }
    ev->outputs = b->outputs;
    ev->n_outputs = r->n_outputs;
    if (r->n_timings) {
        b->timings = calloc(r->n_timings, sizeof *b->timings);
        if (!b->timings)
            return BATON_CLIENT_ENOMEM;
        for (size_t i = 0; i < r->n_timings; i++) {
            const Baton__V1__NodeTiming *t = r->timings[i];
            if (!t)
                return BATON_CLIENT_EPROTO;
            b->timings[i] = (baton_client_timing){str_or_empty(t->node), t->iteration,
                                                  str_or_empty(t->worker), t->queue_us,
                                                  t->exec_us};
        }
    }
    ev->timings = b->timings;
    ev->n_timings = r->n_timings;
    return 0;
}

/* Decodes one frame into a new event in *OUT. */
static int decode_frame(const void *data, size_t len, event_box **out)
{
    int rc = BATON_CLIENT_ENOMEM;
    event_box *b = calloc(1, sizeof *b);
    if (!b)
        return BATON_CLIENT_ENOMEM;
    baton_client_event *ev = &b->ev;
    ev->request_id = ev->message = ev->text = "";
    b->msg = baton__v1__server_message__unpack(NULL, len, data);
    rc = BATON_CLIENT_EPROTO;
    if (!b->msg)
        goto err;
    const Baton__V1__ServerMessage *m = b->msg;
    switch (m->msg_case) {
    case BATON__V1__SERVER_MESSAGE__MSG_CHUNK:
        if (!m->chunk || tensor_view(m->chunk->value, &ev->value) != 0)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_CHUNK;
        ev->request_id = str_or_empty(m->chunk->request_id);
        ev->seq = m->chunk->seq;
        break;
    case BATON__V1__SERVER_MESSAGE__MSG_RESPONSE:
        if (!m->response)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_RESPONSE;
        rc = decode_response(b, m->response);
        if (rc != 0)
            goto err;
        break;
    case BATON__V1__SERVER_MESSAGE__MSG_CANCEL:
        if (!m->cancel)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_CANCEL;
        ev->request_id = str_or_empty(m->cancel->request_id);
        ev->code = m->cancel->status ? (baton_client_code)m->cancel->status->code
                                     : BATON_CLIENT_CODE_OK;
        ev->message = m->cancel->status ? str_or_empty(m->cancel->status->message) : "";
        break;
    case BATON__V1__SERVER_MESSAGE__MSG_HEALTH:
        if (!m->health)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_HEALTH;
        ev->live = m->health->live;
        ev->ready = m->health->ready;
        ev->workers_ready = (const char *const *)m->health->workers_ready;
        ev->n_workers_ready = m->health->n_workers_ready;
        ev->message = str_or_empty(m->health->message);
        break;
    case BATON__V1__SERVER_MESSAGE__MSG_STATS:
        if (!m->stats)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_STATS;
        ev->text = str_or_empty(m->stats->text);
        break;
    case BATON__V1__SERVER_MESSAGE__MSG_INSPECT:
        if (!m->inspect)
            goto err;
        ev->kind = BATON_CLIENT_EVENT_INSPECT;
        ev->text = str_or_empty(m->inspect->text);
        break;
    default:
        goto err; /* nothing set, or a member this client does not know */
    }
    *out = b;
    return 0;
err:
    baton_client_event_free(&b->ev);
    return rc;
}

/* Waits until DEADLINE (-1: none) for one frame and decodes it. A frame in
 * several parts is not a ServerMessage: all parts are read (so the next
 * call starts clean) and the frame is rejected. */
static int recv_frame(baton_client *c, int64_t deadline, event_box **out)
{
    for (;;) {
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, time_left(deadline));
        if (n < 0)
            return errno == EINTR ? BATON_CLIENT_EINTR : BATON_CLIENT_EIO;
        if (n == 0)
            return BATON_CLIENT_ETIMEDOUT;
        zmq_msg_t zm;
        zmq_msg_init(&zm);
        if (zmq_msg_recv(&zm, c->sock, ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&zm);
            if (e == EAGAIN)
                continue; /* poll can report readiness that a receive then lacks */
            return e == EINTR ? BATON_CLIENT_EINTR : BATON_CLIENT_EIO;
        }
        int rc;
        if (zmq_msg_more(&zm)) {
            do {
                zmq_msg_close(&zm);
                zmq_msg_init(&zm);
            } while (zmq_msg_recv(&zm, c->sock, 0) >= 0 && zmq_msg_more(&zm));
            rc = BATON_CLIENT_EPROTO;
        } else {
            rc = decode_frame(zmq_msg_data(&zm), zmq_msg_size(&zm), out);
        }
        zmq_msg_close(&zm);
        return rc;
    }
}

static int probe_of(baton_client_event_kind kind)
{
    switch (kind) {
    case BATON_CLIENT_EVENT_HEALTH: return PROBE_HEALTH;
    case BATON_CLIENT_EVENT_STATS: return PROBE_STATS;
    case BATON_CLIENT_EVENT_INSPECT: return PROBE_INSPECT;
    default: return -1;
    }
}

/* True (and the event freed) when B answers a probe whose caller gave up. */
static bool drop_if_stale(baton_client *c, event_box *b)
{
    int p = probe_of(b->ev.kind);
    if (p < 0 || !c->stale[p])
        return false;
    c->stale[p]--;
    baton_client_event_free(&b->ev);
    return true;
}

int baton_client_recv(baton_client *c, int timeout_ms, baton_client_event **out)
{
    if (c->head) {
        event_box *b = c->head;
        c->head = b->next;
        if (!c->head)
            c->tail = NULL;
        b->next = NULL;
        *out = &b->ev;
        return 0;
    }
    int64_t deadline = deadline_after(timeout_ms);
    for (;;) {
        event_box *b;
        int rc = recv_frame(c, deadline, &b);
        if (rc != 0)
            return rc;
        if (drop_if_stale(c, b))
            continue;
        *out = &b->ev;
        return 0;
    }
}

/* Sends M, then waits for the answer of kind WANT (about request RID, when
 * not NULL); events of requests in flight that come first are queued for
 * baton_client_recv. */
static int probe(baton_client *c, const Baton__V1__ClientMessage *m,
                 baton_client_event_kind want, const char *rid, int timeout_ms,
                 baton_client_event **out)
{
    int p = probe_of(want);
    int rc = send_message(c, m);
    if (rc != 0)
        return rc;
    int64_t deadline = deadline_after(timeout_ms);
    for (;;) {
        event_box *b;
        rc = recv_frame(c, deadline, &b);
        if (rc == BATON_CLIENT_EPROTO)
            return rc; /* that frame may have been the answer: owe nothing */
        if (rc != 0) {
            if (p >= 0)
                c->stale[p]++; /* the answer is still due: drop it when it comes */
            return rc;
        }
        if (drop_if_stale(c, b))
            continue;
        if (b->ev.kind == want && (!rid || !strcmp(b->ev.request_id, rid))) {
            *out = &b->ev;
            return 0;
        }
        if (c->tail)
            c->tail->next = b;
        else
            c->head = b;
        c->tail = b;
    }
}

int baton_client_health(baton_client *c, int timeout_ms, baton_client_event **out)
{
    Baton__V1__HealthRequest h = BATON__V1__HEALTH_REQUEST__INIT;
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_HEALTH;
    m.health = &h;
    return probe(c, &m, BATON_CLIENT_EVENT_HEALTH, NULL, timeout_ms, out);
}

int baton_client_stats(baton_client *c, int timeout_ms, baton_client_event **out)
{
    Baton__V1__StatsRequest s = BATON__V1__STATS_REQUEST__INIT;
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_STATS;
    m.stats = &s;
    return probe(c, &m, BATON_CLIENT_EVENT_STATS, NULL, timeout_ms, out);
}

int baton_client_inspect(baton_client *c, const char *graph, int timeout_ms,
                         baton_client_event **out)
{
    Baton__V1__InspectRequest ir = BATON__V1__INSPECT_REQUEST__INIT;
    Baton__V1__ClientMessage m = BATON__V1__CLIENT_MESSAGE__INIT;
    if (graph && *graph)
        ir.graph = (char *)graph;
    m.msg_case = BATON__V1__CLIENT_MESSAGE__MSG_INSPECT;
    m.inspect = &ir;
    return probe(c, &m, BATON_CLIENT_EVENT_INSPECT, NULL, timeout_ms, out);
}
