/* The request checks at the door (daemon/door.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/door.h"

#include "common/pbwire.h"
#include "common/utf8.h"

/* ---- the wire ----------------------------------------------------------- */

#define WIRE_DEPTH 8              /* the client schema nests less deep than this */

/* Where the walk is: one step per message entered. */
typedef struct wire_step {
    const char *name;             /* the field's name */
    long index;                   /* its occurrence in a repeated field; -1: not repeated */
} wire_step;

typedef struct wire_walk {
    wire_step path[WIRE_DEPTH];
    int depth;
    bool failed;                  /* WHY holds the first failure */
    bool id_bad;
    char *why;
    size_t len;
} wire_walk;

/* Writes the path of field NAME (INDEX) of the current message into BUF:
 * "infer.inputs[1].name"; with NAME NULL, the current message's. */
static void wire_path(const wire_walk *w, const char *name, long index, char *buf, size_t n)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < w->depth + (name != NULL) && off < n; i++) {
        const wire_step *s = i < w->depth ? &w->path[i] : &(wire_step){name, index};
        off += (size_t)snprintf(buf + off, n - off, s->index >= 0 ? "%s%s[%ld]" : "%s%s",
                                i ? "." : "", s->name, s->index);
    }
}

/* Records a failure at field NAME (INDEX) of the current message: the first
 * one is the answer. */
static void wire_fail(wire_walk *w, const char *name, long index, const char *what)
{
    if (w->depth == 1 && name && strcmp(name, "request_id") == 0)
        w->id_bad = true;
    if (w->failed)
        return;
    w->failed = true;
    char path[160];
    wire_path(w, name, index, path, sizeof(path));
    if (!name)
        snprintf(w->why, w->len, "%s (in %s)", what, w->depth ? path : "the ClientMessage");
    else
        snprintf(w->why, w->len, "%s %s", path, what);
}

static void wire_message(wire_walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                         size_t n)
{
    uint32_t seen[64] = {0};      /* occurrences per field, for the index in a path */
    pbw_reader r = pbw_init(p, n);
    pbw_field f;
    int rc;
    while ((rc = pbw_next(&r, &f)) > 0) {
        if (f.number == 0) {
            wire_fail(w, NULL, -1, "a field is numbered 0, which protobuf does not allow");
            continue;
        }
        const ProtobufCFieldDescriptor *fd =
            f.number <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)f.number)
                                   : NULL;
        if (!fd || f.wire != PBW_BYTES)
            continue; /* unknown fields are not read further, nor passed on */
        size_t k = (size_t)(fd - d->fields);
        long index = fd->label == PROTOBUF_C_LABEL_REPEATED ? (long)(k < 64 ? seen[k] : 0) : -1;
        if (k < 64)
            seen[k]++;
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            if (memchr(f.data, 0, f.len))
                wire_fail(w, fd->name, index, "holds a NUL byte");
            else if (!bt_utf8_valid((const char *)f.data, f.len))
                wire_fail(w, fd->name, index, "is not valid UTF-8");
        } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && w->depth < WIRE_DEPTH) {
            w->path[w->depth++] = (wire_step){fd->name, index};
            wire_message(w, fd->descriptor, f.data, f.len);
            w->depth--;
        }
    }
    if (rc < 0)
        wire_fail(w, NULL, -1, "the bytes do not parse as protobuf");
}

bt_code door_check_wire(const uint8_t *frame, size_t n, bool *id_bad, char *why, size_t len)
{
    wire_walk w = {.why = why, .len = len};
    wire_message(&w, &baton__v1__client_message__descriptor, frame, n);
    *id_bad = w.id_bad;
    return w.failed ? BT_CODE_INVALID_ARGUMENT : BT_CODE_OK;
}

/* ---- the request ------------------------------------------------------- */

static size_t dtype_size(Baton__V1__DType t)
{
    switch (t) {
    case BATON__V1__DTYPE__F32:
    case BATON__V1__DTYPE__I32: return 4;
    case BATON__V1__DTYPE__F16:
    case BATON__V1__DTYPE__BF16: return 2;
    case BATON__V1__DTYPE__I64: return 8;
    case BATON__V1__DTYPE__U8:
    case BATON__V1__DTYPE__BOOL: return 1;
    default: return 0;
    }
}

/* Checks one client tensor; false with what is wrong in WHY. */
static bool check_tensor(const Baton__V1__Tensor *t, char *why, size_t len)
{
    size_t es = dtype_size(t->dtype);
    if (!es) {
        snprintf(why, len, "input '%s' has dtype %d, which is unspecified or not a DType",
                 t->name, (int)t->dtype);
        return false;
    }
    if (t->n_dims > DOOR_MAX_DIMS) {
        snprintf(why, len, "input '%s' has %zu dims; at most %d are supported", t->name,
                 t->n_dims, DOOR_MAX_DIMS);
        return false;
    }
    uint64_t n = 1;
    for (size_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] < 0) {
            snprintf(why, len, "input '%s' has negative dim %zu (%lld)", t->name, d,
                     (long long)t->dims[d]);
            return false;
        }
        if (t->dims[d] && n > UINT64_MAX / (uint64_t)t->dims[d] / es) {
            snprintf(why, len, "input '%s': the product of its dims overflows", t->name);
            return false;
        }
        n *= (uint64_t)t->dims[d];
    }
    if (n * es != t->data.len) {
        snprintf(why, len, "input '%s': dims give %llu bytes of %s but the data has %zu",
                 t->name, (unsigned long long)(n * es),
                 protobuf_c_enum_descriptor_get_value(&baton__v1__dtype__descriptor, t->dtype)
                     ->name,
                 t->data.len);
        return false;
    }
    return true;
}

/* Bytes of a turn's record: role and content, each after its u32 length. */
static void put_field(uint8_t **at, const char *s, size_t n)
{
    uint8_t *p = *at;
    for (int b = 0; b < 4; b++)
        p[b] = (uint8_t)(n >> (8 * b));
    memcpy(p + 4, s, n);
    *at = p + 4 + n;
}

/* The messages: roles system, user or assistant, UTF-8, into the one graph
 * input that takes them (messages_input, or the graph's only input), which
 * the request must not also give as a tensor.  Encodes them as the backend
 * ABI reads a conversation (baton_chat_next) and fills P->chat. */
static bt_code check_messages(const Baton__V1__InferRequest *q, door_pass *p, char *why,
                              size_t len)
{
    const graph *g = p->g;
    p->chat_input = -1;
    const char *target = q->messages_input ? q->messages_input : "";
    if (!q->n_messages) {
        if (*target) {
            snprintf(why, len, "messages_input is '%s' but the request has no messages", target);
            return BT_CODE_INVALID_ARGUMENT;
        }
        return BT_CODE_OK;
    }
    int k = -1;
    if (*target) {
        if ((k = graph_input_index(g, target)) < 0) {
            snprintf(why, len, "messages_input: graph '%s' has no input named '%s'", g->name,
                     target);
            return BT_CODE_INVALID_ARGUMENT;
        }
    } else if (g->n_inputs == 1) {
        k = 0;
    } else {
        snprintf(why, len, "graph '%s' has %zu inputs: say which takes the messages "
                 "(messages_input)", g->name, g->n_inputs);
        return BT_CODE_INVALID_ARGUMENT;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < q->n_messages; i++) {
        const Baton__V1__ChatMessage *m = q->messages[i];
        const char *role = m->role ? m->role : "", *content = m->content ? m->content : "";
        if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
            strcmp(role, "assistant") != 0) {
            bool valid = bt_utf8_valid(role, strlen(role));
            snprintf(why, len, "messages[%zu] has role '%.*s'; the roles are system, user and "
                     "assistant", i, valid ? bt_utf8_prefix(role, 32) : 11,
                     valid ? role : "(not UTF-8)");
            return BT_CODE_INVALID_ARGUMENT;
        }
        if (!bt_utf8_valid(content, strlen(content))) {
            snprintf(why, len, "messages[%zu]: the content is not valid UTF-8", i);
            return BT_CODE_INVALID_ARGUMENT;
        }
        bytes += 8 + strlen(role) + strlen(content);
    }
    if (!(p->chat_bytes = malloc(bytes ? bytes : 1))) {
        snprintf(why, len, "out of memory");
        return BT_CODE_RESOURCE_EXHAUSTED;
    }
    uint8_t *at = p->chat_bytes;
    for (size_t i = 0; i < q->n_messages; i++) {
        const Baton__V1__ChatMessage *m = q->messages[i];
        put_field(&at, m->role, strlen(m->role));
        put_field(&at, m->content ? m->content : "", m->content ? strlen(m->content) : 0);
    }
    baton__v1__tensor__init(&p->chat);
    p->chat.name = (char *)g->inputs[k];
    p->chat.dtype = BATON__V1__DTYPE__U8;
    p->chat_len = (int64_t)bytes;
    p->chat.n_dims = 1;
    p->chat.dims = &p->chat_len;
    p->chat.data.data = p->chat_bytes;
    p->chat.data.len = bytes;
    p->chat_input = k;
    return BT_CODE_OK;
}

/* Every input: declared, given once, well-formed; then every declared
 * input given (the messages' one by them), but an optional input left out
 * is an empty U8 tensor.  Fills P->by_input. */
static bt_code check_inputs(const Baton__V1__InferRequest *q, door_pass *p, char *why,
                            size_t len)
{
    const graph *g = p->g;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Baton__V1__Tensor *t = q->inputs[i];
        const char *name = t->name ? t->name : "";
        if (graph_input_index(g, name) < 0) {
            snprintf(why, len, "graph '%s' has no input named '%s'", g->name, name);
            return BT_CODE_INVALID_ARGUMENT;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(q->inputs[j]->name, name) == 0) {
                snprintf(why, len, "input '%s' is given twice", name);
                return BT_CODE_INVALID_ARGUMENT;
            }
        if (!check_tensor(t, why, len))
            return BT_CODE_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < q->n_inputs; i++) {
        int k = graph_input_index(g, q->inputs[i]->name);
        if (k == p->chat_input) {
            snprintf(why, len, "input '%s' is given both as a tensor and as the messages",
                     q->inputs[i]->name);
            return BT_CODE_INVALID_ARGUMENT;
        }
        p->by_input[k] = q->inputs[i];
    }
    if (p->chat_input >= 0)
        p->by_input[p->chat_input] = &p->chat;
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (!p->by_input[k] && g->optional >> k & 1) {
            if (!p->absent && !(p->absent = calloc(g->n_inputs, sizeof(*p->absent)))) {
                snprintf(why, len, "out of memory");
                return BT_CODE_RESOURCE_EXHAUSTED;
            }
            Baton__V1__Tensor *t = &p->absent[k];
            baton__v1__tensor__init(t);
            t->name = (char *)g->inputs[k];
            t->dtype = BATON__V1__DTYPE__U8;
            t->n_dims = 1;
            t->dims = &p->absent_len;
            p->by_input[k] = t;
        }
        if (!p->by_input[k]) {
            snprintf(why, len, "graph '%s' needs input '%s', which the request does not give",
                     g->name, g->inputs[k]);
            return BT_CODE_INVALID_ARGUMENT;
        }
    }
    return BT_CODE_OK;
}

/* The max_iters map: loops of the graph, at least 1.  Fills P->caps. */
static bt_code check_max_iters(const Baton__V1__InferRequest *q, door_pass *p, char *why,
                               size_t len)
{
    const graph *g = p->g;
    for (size_t i = 0; i < q->n_max_iters; i++) {
        const char *loop = q->max_iters[i]->key ? q->max_iters[i]->key : "";
        int e = graph_entity_find(g, loop);
        if (e < 0 || g->entities[e].kind != GRAPH_LOOP) {
            snprintf(why, len, "max_iters names '%s', which is not a loop of graph '%s'", loop,
                     g->name);
            return BT_CODE_INVALID_ARGUMENT;
        }
        if (q->max_iters[i]->value == 0) {
            snprintf(why, len, "max_iters for loop '%s' is 0; a loop runs at least once", loop);
            return BT_CODE_INVALID_ARGUMENT;
        }
        p->caps[e] = q->max_iters[i]->value;
    }
    return BT_CODE_OK;
}

/* raw_inputs: inputs of the graph, each once, none the messages' (a
 * conversation is always rendered with the template).  Fills P->raw. */
static bt_code check_raw_inputs(const Baton__V1__InferRequest *q, door_pass *p, char *why,
                                size_t len)
{
    const graph *g = p->g;
    for (size_t i = 0; i < q->n_raw_inputs; i++) {
        const char *name = q->raw_inputs[i] ? q->raw_inputs[i] : "";
        int k = graph_input_index(g, name);
        if (k < 0) {
            bool valid = bt_utf8_valid(name, strlen(name));
            snprintf(why, len, "raw_inputs[%zu]: graph '%s' has no input named '%.*s'", i,
                     g->name, valid ? bt_utf8_prefix(name, 64) : 11, valid ? name : "(not UTF-8)");
            return BT_CODE_INVALID_ARGUMENT;
        }
        if (k == p->chat_input) {
            snprintf(why, len, "raw_inputs[%zu]: input '%s' takes the messages, which are "
                     "always rendered with the chat template", i, name);
            return BT_CODE_INVALID_ARGUMENT;
        }
        if (p->raw[k]) {
            snprintf(why, len, "raw_inputs[%zu]: input '%s' is named twice", i, name);
            return BT_CODE_INVALID_ARGUMENT;
        }
        p->raw[k] = 1;
    }
    return BT_CODE_OK;
}

/* The graph's name of its text stream called NAME (a new_token edge to the
 * client with modality text), or NULL.  The graph's string outlives the
 * request's, which goes with its frame. */
static const char *is_text_stream(const graph *g, const char *name)
{
    for (size_t i = 0; i < g->n_edges; i++) {
        const graph_edge *e = &g->edges[i];
        if (e->consumer < 0 && e->new_token && e->modality && strcmp(e->modality, "text") == 0 &&
            strcmp(e->client_name, name) == 0)
            return e->client_name;
    }
    return NULL;
}

/* The text stream of text_output, or the graph's only one.  NULL with WHY
 * set when there is none (or several and none named). */
static const char *text_stream(const graph *g, const char *named, char *why, size_t len)
{
    if (*named) {
        const char *found = is_text_stream(g, named);
        if (found)
            return found;
        bool valid = bt_utf8_valid(named, strlen(named));
        snprintf(why, len, "text_output: graph '%s' has no text stream named '%.*s' (an "
                 "output with to: client, new_token: true, modality: text)", g->name,
                 valid ? bt_utf8_prefix(named, 64) : 11, valid ? named : "(not UTF-8)");
        return NULL;
    }
    const char *found = NULL;
    for (size_t i = 0; i < g->n_edges; i++) {
        const graph_edge *e = &g->edges[i];
        if (e->consumer >= 0)
            continue;
        const char *name = e->client_name;
        if (!is_text_stream(g, name) || (found && strcmp(found, name) == 0))
            continue;
        if (found) {
            snprintf(why, len, "graph '%s' has several text streams ('%s', '%s'): say which "
                     "stop and max_tokens apply to (text_output)", g->name, found, name);
            return NULL;
        }
        found = name;
    }
    if (!found)
        snprintf(why, len, "stop and max_tokens apply to a text stream, and graph '%s' has "
                 "none (an output with to: client, new_token: true, modality: text)", g->name);
    return found;
}

/* stop, max_tokens and text_output.  Fills P->text_output when asked. */
static bt_code check_text_limits(const Baton__V1__InferRequest *q, door_pass *p, char *why,
                                 size_t len)
{
    const char *named = q->text_output ? q->text_output : "";
    if (!q->n_stop && !q->max_tokens) {
        if (*named) {
            bool valid = bt_utf8_valid(named, strlen(named));
            snprintf(why, len, "text_output is '%.*s' but the request has neither stop nor "
                     "max_tokens", valid ? bt_utf8_prefix(named, 64) : 11,
                     valid ? named : "(not UTF-8)");
            return BT_CODE_INVALID_ARGUMENT;
        }
        return BT_CODE_OK;
    }
    if (q->n_stop > TL_MAX_STOP) {
        snprintf(why, len, "stop has %zu strings; at most %d are allowed", q->n_stop,
                 TL_MAX_STOP);
        return BT_CODE_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < q->n_stop; i++) {
        const char *s = q->stop[i] ? q->stop[i] : "";
        size_t n = strlen(s);
        if (n == 0 || n > TL_MAX_STOP_BYTES) {
            snprintf(why, len, "stop[%zu] is %zu bytes; a stop string has 1 to %d", i, n,
                     TL_MAX_STOP_BYTES);
            return BT_CODE_INVALID_ARGUMENT;
        }
        if (!bt_utf8_valid(s, n)) {
            snprintf(why, len, "stop[%zu] is not valid UTF-8", i);
            return BT_CODE_INVALID_ARGUMENT;
        }
    }
    if (!(p->text_output = text_stream(p->g, named, why, len)))
        return BT_CODE_INVALID_ARGUMENT;
    return BT_CODE_OK;
}

bt_code door_check_infer(const graph_set *gs, const Baton__V1__InferRequest *q, door_pass *p,
                         char *why, size_t len)
{
    memset(p, 0, sizeof(*p));
    p->request_id = "";
    p->chat_input = -1;
    const char *rid = q->request_id ? q->request_id : "";
    if (!*rid) {
        snprintf(why, len, "request_id is empty");
        return BT_CODE_INVALID_ARGUMENT;
    }
    if (strlen(rid) > DOOR_REQUEST_ID_MAX) {
        snprintf(why, len, "request_id is %zu bytes; at most %d are allowed", strlen(rid),
                 DOOR_REQUEST_ID_MAX);
        return BT_CODE_INVALID_ARGUMENT;
    }
    p->request_id = rid;
    p->g = graph_set_find(gs, q->graph ? q->graph : "");
    if (!p->g) {
        snprintf(why, len, "no graph named '%s'", q->graph ? q->graph : "");
        return BT_CODE_NOT_FOUND;
    }
    p->by_input = calloc(p->g->n_inputs + 1, sizeof(*p->by_input));
    p->caps = calloc(p->g->n_entities + 1, sizeof(*p->caps));
    p->raw = calloc(p->g->n_inputs + 1, 1);
    if (!p->by_input || !p->caps || !p->raw) {
        snprintf(why, len, "out of memory");
        return BT_CODE_RESOURCE_EXHAUSTED;
    }
    bt_code code = check_messages(q, p, why, len);
    if (code == BT_CODE_OK)
        code = check_inputs(q, p, why, len);
    if (code == BT_CODE_OK)
        code = check_max_iters(q, p, why, len);
    if (code == BT_CODE_OK)
        code = check_raw_inputs(q, p, why, len);
    if (code == BT_CODE_OK)
        code = check_text_limits(q, p, why, len);
    return code;
}

void door_pass_free(door_pass *p)
{
    free(p->by_input);
    free(p->caps);
    free(p->chat_bytes);
    free(p->raw);
    free(p->absent);
    p->absent = NULL;
    p->raw = NULL;
    p->by_input = NULL;
    p->caps = NULL;
    p->chat_bytes = NULL;
}
