/* The checks at the door (daemon/door.c): each refusal with its code and
 * message, the order in which they apply, and what a request that passes
 * brings through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/diag.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/door.h"
#include "baton/backend.h"
#include "common/utf8.h"

static const char *yaml =
    "version: 1\n"
    "workers: [{name: w0, device: cpu}]\n"
    "models: [{name: m, backend: echo, worker: w0}]\n"
    "graphs:\n"
    "  - name: g\n"
    "    inputs: [a, b]\n"
    "    body:\n"
    "      sequential:\n"
    "        - node: {name: n0, model: m, inputs: [a, b], outputs: [{name: y, to: n1}]}\n"
    "        - loop:\n"
    "            name: loop1\n"
    "            max_iters: 4\n"
    "            body:\n"
    "              node: {name: n1, model: m, inputs: [y], outputs: [{name: y, to: n1}]}\n"
    "            outputs: [{name: y, to: client}]\n"
    "  - name: t\n"
    "    inputs: [p]\n"
    "    body:\n"
    "      node:\n"
    "        name: n2\n"
    "        model: m\n"
    "        inputs: [p]\n"
    "        outputs: [{name: text, to: client, new_token: true, modality: text},\n"
    "                  {name: notes, to: client, new_token: true, modality: text},\n"
    "                  {name: ids, to: client, new_token: true}, {name: last, to: client}]\n"
    "  - name: one\n"
    "    inputs: [p]\n"
    "    body:\n"
    "      node: {name: n3, model: m, inputs: [p], outputs: [{name: ids, to: client, new_token: "
    "true}, {name: text, to: client, new_token: true, modality: text}]}\n"
    "  - name: o\n"
    "    inputs: [a, ctx]\n"
    "    optional_inputs: [ctx]\n"
    "    body: {node: {name: n4, model: m, inputs: [a, ctx], outputs: [{name: y, to: client}]}}\n";

typedef struct fixture {
    cfg_config *cfg;
    graph_set *gs;
    int32_t a[2], b[3];
    Baton__V1__Tensor ta, tb;
    Baton__V1__Tensor *inputs[4];
    int64_t da[1], db[1];
    Baton__V1__InferRequest q;
    Baton__V1__InferRequest__MaxItersEntry mi;
    Baton__V1__InferRequest__MaxItersEntry *mip[1];
    door_pass p;
    char why[512];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    bt_diag *d = bt_diag_create("door.yaml");
    int rc = cfg_load_string(yaml, strlen(yaml), "door.yaml", d, &f->cfg);
    if (rc == 0)
        rc = graph_set_build(f->cfg, d, &f->gs);
    bt_diag_print(d, stderr);
    assert_int_equal(rc, 0);
    bt_diag_destroy(d);
    baton__v1__tensor__init(&f->ta);
    baton__v1__tensor__init(&f->tb);
    f->ta.name = "a";
    f->ta.dtype = BATON__V1__DTYPE__I32;
    f->da[0] = 2;
    f->ta.n_dims = 1;
    f->ta.dims = f->da;
    f->ta.data.len = sizeof(f->a);
    f->ta.data.data = (uint8_t *)f->a;
    f->tb.name = "b";
    f->tb.dtype = BATON__V1__DTYPE__I32;
    f->db[0] = 3;
    f->tb.n_dims = 1;
    f->tb.dims = f->db;
    f->tb.data.len = sizeof(f->b);
    f->tb.data.data = (uint8_t *)f->b;
    f->inputs[0] = &f->ta;
    f->inputs[1] = &f->tb;
    baton__v1__infer_request__init(&f->q);
    f->q.request_id = "r1";
    f->q.graph = "g";
    f->q.n_inputs = 2;
    f->q.inputs = f->inputs;
    baton__v1__infer_request__max_iters_entry__init(&f->mi);
    f->mip[0] = &f->mi;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    door_pass_free(&f->p);
    graph_set_destroy(f->gs);
    cfg_config_destroy(f->cfg);
    free(f);
    return 0;
}

static bt_code check(fixture *f)
{
    door_pass_free(&f->p);
    f->why[0] = 0;
    return door_check_infer(f->gs, &f->q, &f->p, f->why, sizeof(f->why));
}

static void test_passes(void **state)
{
    fixture *f = *state;
    f->inputs[0] = &f->tb; /* any order */
    f->inputs[1] = &f->ta;
    f->q.n_max_iters = 1;
    f->q.max_iters = f->mip;
    f->mi.key = "loop1";
    f->mi.value = 2;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_string_equal(f->p.request_id, "r1");
    assert_string_equal(f->p.g->name, "g");
    assert_ptr_equal(f->p.by_input[0], &f->ta);
    assert_ptr_equal(f->p.by_input[1], &f->tb);
    int e = graph_entity_find(f->p.g, "loop1");
    assert_true(e >= 0);
    assert_int_equal(f->p.caps[e], 2);
    assert_int_equal(f->p.caps[graph_entity_find(f->p.g, "n0")], 0);
}

static void test_request_id(void **state)
{
    fixture *f = *state;
    f->q.request_id = "";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "request_id is empty");
    assert_string_equal(f->p.request_id, "");
    char long_id[300];
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = 0;
    f->q.request_id = long_id;
    f->q.graph = "nope"; /* the id is checked first */
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_non_null(strstr(f->why, "299 bytes; at most 256"));
    assert_string_equal(f->p.request_id, "");
}

static void test_graph(void **state)
{
    fixture *f = *state;
    f->q.graph = "nope";
    f->ta.dtype = 99; /* the graph is checked before the inputs */
    assert_int_equal(check(f), BT_CODE_NOT_FOUND);
    assert_string_equal(f->why, "no graph named 'nope'");
    assert_string_equal(f->p.request_id, "r1");
}

static void test_inputs(void **state)
{
    fixture *f = *state;
    f->ta.name = "z";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' has no input named 'z'");
    f->ta.name = "b";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'b' is given twice");
    f->ta.name = "a";
    f->q.n_inputs = 1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' needs input 'b', which the request does not give");
}

static void test_tensors(void **state)
{
    fixture *f = *state;
    f->ta.dtype = BATON__V1__DTYPE__DTYPE_UNSPECIFIED;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_non_null(strstr(f->why, "unspecified or not a DType"));
    f->ta.dtype = BATON__V1__DTYPE__I32;
    f->da[0] = -1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a' has negative dim 0 (-1)");
    int64_t huge[2] = {INT64_MAX, INT64_MAX};
    f->ta.dims = huge;
    f->ta.n_dims = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a': the product of its dims overflows");
    f->ta.dims = f->da;
    f->ta.n_dims = 1;
    f->da[0] = 3;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a': dims give 12 bytes of I32 but the data has 8");
    int64_t many[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    f->ta.dims = many;
    f->ta.n_dims = 9;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a' has 9 dims; at most 8 are supported");
}

static void test_max_iters(void **state)
{
    fixture *f = *state;
    f->q.n_max_iters = 1;
    f->q.max_iters = f->mip;
    f->mi.key = "n0";
    f->mi.value = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "max_iters names 'n0', which is not a loop of graph 'g'");
    f->mi.key = "loop1";
    f->mi.value = 0;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "max_iters for loop 'loop1' is 0; a loop runs at least once");
    /* Inputs are checked before max_iters. */
    f->ta.name = "z";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' has no input named 'z'");
}

/* Messages: to the named input (or the only one), encoded as the backend
 * ABI reads them; roles, UTF-8, a conflicting tensor and a graph of two
 * inputs without a name are refused. */
static void test_messages(void **state)
{
    fixture *f = *state;
    Baton__V1__ChatMessage m[2], *mp[2] = {&m[0], &m[1]};
    baton__v1__chat_message__init(&m[0]);
    baton__v1__chat_message__init(&m[1]);
    m[0].role = "system", m[0].content = "be brief";
    m[1].role = "user", m[1].content = "h\xc3\xa9llo";
    f->q.n_messages = 2;
    f->q.messages = mp;
    f->inputs[0] = &f->tb;
    f->q.n_inputs = 1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' has 2 inputs: say which takes the messages "
                                "(messages_input)");
    f->q.messages_input = "a";
    assert_int_equal(check(f), BT_CODE_OK);
    assert_int_equal(f->p.chat_input, 0);
    const Baton__V1__Tensor *t = f->p.by_input[0];
    assert_ptr_equal(t, &f->p.chat);
    assert_string_equal(t->name, "a");
    assert_int_equal(t->dtype, BATON__V1__DTYPE__U8);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->dims[0], (int64_t)t->data.len);
    const uint8_t want[] = "\x06\0\0\0system\x08\0\0\0be brief\x04\0\0\0user\x06\0\0\0h\xc3\xa9llo";
    assert_int_equal(t->data.len, sizeof(want) - 1);
    assert_memory_equal(t->data.data, want, sizeof(want) - 1);
    /* The ABI's reader gives the turns back. */
    uint64_t at = 0;
    baton_chat_turn turn;
    assert_int_equal(baton_chat_next(t->data.data, t->data.len, &at, &turn), 1);
    assert_int_equal(turn.role_len, 6);
    assert_memory_equal(turn.content, "be brief", 8);
    assert_int_equal(baton_chat_next(t->data.data, t->data.len, &at, &turn), 1);
    assert_int_equal(turn.content_len, 6);
    assert_int_equal(baton_chat_next(t->data.data, t->data.len, &at, &turn), 0);
    at = 0;
    assert_int_equal(baton_chat_next(t->data.data, t->data.len - 1, &at, &turn), 1);
    assert_int_equal(baton_chat_next(t->data.data, t->data.len - 1, &at, &turn), -1);
    /* The same input twice; a role, UTF-8 and an input the graph lacks. */
    f->inputs[0] = &f->ta;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a' is given both as a tensor and as the messages");
    f->inputs[0] = &f->tb;
    m[1].role = "tool";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "messages[1] has role 'tool'; the roles are system, user and "
                                "assistant");
    m[1].role = "user";
    m[1].content = "bad \xc0\xaf";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "messages[1]: the content is not valid UTF-8");
    m[1].content = "ok";
    f->q.messages_input = "zz";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "messages_input: graph 'g' has no input named 'zz'");
    f->q.n_messages = 0;
    f->q.messages_input = "a";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "messages_input is 'a' but the request has no messages");
}

/* An optional input left out reaches the graph as an empty U8 tensor of
 * its name; given, as a tensor or as the messages, it is what was given. */
static void test_optional_inputs(void **state)
{
    fixture *f = *state;
    f->q.graph = "o";
    f->q.n_inputs = 1;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_ptr_equal(f->p.by_input[0], &f->ta);
    const Baton__V1__Tensor *t = f->p.by_input[1];
    assert_non_null(t);
    assert_string_equal(t->name, "ctx");
    assert_int_equal(t->dtype, BATON__V1__DTYPE__U8);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->dims[0], 0);
    assert_int_equal(t->data.len, 0);
    f->tb.name = "ctx";
    f->q.n_inputs = 2;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_ptr_equal(f->p.by_input[1], &f->tb);
    Baton__V1__ChatMessage m, *mp = &m;
    baton__v1__chat_message__init(&m);
    m.role = "system", m.content = "be brief";
    f->q.n_messages = 1;
    f->q.messages = &mp;
    f->q.messages_input = "ctx";
    f->q.n_inputs = 1;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_ptr_equal(f->p.by_input[1], &f->p.chat);
    assert_int_equal(f->p.chat_input, 1);
    /* The other input is not optional. */
    f->inputs[0] = &f->tb;
    f->q.n_messages = 0;
    f->q.messages_input = NULL;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'o' needs input 'a', which the request does not give");
}

/* raw_inputs: inputs of the graph, once each, not the messages'. */
static void test_raw_inputs(void **state)
{
    fixture *f = *state;
    char *raw[2] = {"b", "a"};
    f->q.n_raw_inputs = 1;
    f->q.raw_inputs = raw;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_int_equal(f->p.raw[0], 0);
    assert_int_equal(f->p.raw[1], 1);
    raw[0] = "zz";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "raw_inputs[0]: graph 'g' has no input named 'zz'");
    raw[0] = "a";
    f->q.n_raw_inputs = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "raw_inputs[1]: input 'a' is named twice");
    Baton__V1__ChatMessage m, *mp[1] = {&m};
    baton__v1__chat_message__init(&m);
    m.role = "user", m.content = "hi";
    f->q.n_messages = 1;
    f->q.messages = mp;
    f->q.messages_input = "a";
    f->inputs[0] = &f->tb;
    f->q.n_inputs = 1;
    f->q.n_raw_inputs = 1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "raw_inputs[0]: input 'a' takes the messages, which are always "
                                "rendered with the chat template");
}

/* stop, max_tokens and text_output: how many stop strings, how long, UTF-8,
 * and a text stream of the graph (named, or the only one). */
static void test_text_limits(void **state)
{
    fixture *f = *state;
    uint8_t text[2] = {'h', 'i'};
    int64_t dim = 2;
    Baton__V1__Tensor tp = BATON__V1__TENSOR__INIT, *tpp[1] = {&tp};
    tp.name = "p";
    tp.dtype = BATON__V1__DTYPE__U8;
    tp.n_dims = 1;
    tp.dims = &dim;
    tp.data.data = text;
    tp.data.len = 2;
    f->q.graph = "one";
    f->q.inputs = tpp;
    f->q.n_inputs = 1;
    char *stop[TL_MAX_STOP + 1];
    for (size_t i = 0; i <= TL_MAX_STOP; i++)
        stop[i] = "\n\n";
    f->q.stop = stop;
    f->q.n_stop = 2;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_string_equal(f->p.text_output, "text"); /* the only text stream; ids is not text */
    f->q.n_stop = 0;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_null(f->p.text_output); /* nothing asked */
    f->q.max_tokens = 5;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_string_equal(f->p.text_output, "text");
    f->q.max_tokens = 0;
    f->q.text_output = "text";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "text_output is 'text' but the request has neither stop nor "
                                "max_tokens");
    f->q.text_output = "";
    f->q.n_stop = TL_MAX_STOP + 1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "stop has 17 strings; at most 16 are allowed");
    f->q.n_stop = 2;
    stop[1] = "";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "stop[1] is 0 bytes; a stop string has 1 to 256");
    char big[TL_MAX_STOP_BYTES + 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    stop[1] = big;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "stop[1] is 257 bytes; a stop string has 1 to 256");
    stop[1] = "\xc3(";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "stop[1] is not valid UTF-8");
    stop[1] = "\xc3\xa9";
    f->q.text_output = "ids";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "text_output: graph 'one' has no text stream named 'ids' (an "
                                "output with to: client, new_token: true, modality: text)");
    /* Several text streams: name one. */
    f->q.graph = "t";
    f->q.text_output = "";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 't' has several text streams ('text', 'notes'): say "
                                "which stop and max_tokens apply to (text_output)");
    char notes[] = "notes"; /* the request's string goes with its frame */
    f->q.text_output = notes;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_string_equal(f->p.text_output, "notes");
    assert_ptr_not_equal(f->p.text_output, notes);
    f->q.text_output = "last";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    /* A graph without one. */
    f->q.graph = "g";
    f->q.text_output = "";
    f->q.inputs = f->inputs;
    f->q.n_inputs = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "stop and max_tokens apply to a text stream, and graph 'g' has "
                                "none (an output with to: client, new_token: true, modality: "
                                "text)");
}

/* bt_utf8_valid on the edges of RFC 3629. */
static void test_utf8(void **state)
{
    (void)state;
    static const char *const good[] = {"", "abc", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80",
                                       "\xed\x9f\xbf", "\xee\x80\x80", "\xf0\x90\x80\x80",
                                       "\xf4\x8f\xbf\xbf", "\xf0\x9f\x98\x80"};
    static const char *const bad[] = {"\x80", "\xc0\xaf", "\xc1\xbf", "\xc2", "\xe0\x80\x80",
                                      "\xed\xa0\x80", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80",
                                      "\xf5\x80\x80\x80", "\xff", "\xe2\x82", "a\xe2\x82(b"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        assert_true(bt_utf8_valid(good[i], strlen(good[i])));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_false(bt_utf8_valid(bad[i], strlen(bad[i])));
    assert_true(bt_utf8_valid("a\0b", 3));
}

/* bt_utf8_cut and bt_utf8_prefix: never half a character. */
static void test_utf8_cut(void **state)
{
    (void)state;
    assert_int_equal(bt_utf8_cut("", 0), 0);
    assert_int_equal(bt_utf8_cut("abc", 3), 3);
    assert_int_equal(bt_utf8_cut("a\xc3\xa9", 3), 3);        /* a whole é */
    assert_int_equal(bt_utf8_cut("a\xc3\xa9", 2), 1);        /* half of it */
    assert_int_equal(bt_utf8_cut("\xf0\x9f\x98\x80", 3), 0);
    assert_int_equal(bt_utf8_cut("\xf0\x9f\x98\x80", 4), 4);
    assert_int_equal(bt_utf8_cut("x\xe2\x82\xac", 2), 1);
    assert_int_equal(bt_utf8_prefix("a\xc3\xa9\xc3\xa9", 4), 3);
    assert_int_equal(bt_utf8_prefix("ab", 64), 2);
    /* Every prefix of a valid string, cut, is valid. */
    const char *s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";
    for (size_t n = 0; n <= strlen(s); n++)
        assert_true(bt_utf8_valid(s, bt_utf8_cut(s, n)));
}

/* ---- the wire check ---------------------------------------------------- */

typedef struct bytes {
    uint8_t b[1024];
    size_t n;
} bytes;

static void put(bytes *o, const void *p, size_t n)
{
    assert_true(o->n + n <= sizeof(o->b));
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

/* A length-delimited field (lengths under 128). */
static void field(bytes *o, unsigned number, const void *p, size_t n)
{
    assert_true(n < 128 && number < 16);
    uint8_t h[2] = {(uint8_t)(number << 3 | 2), (uint8_t)n};
    put(o, h, 2);
    put(o, p, n);
}

/* A ClientMessage whose infer holds BODY. */
static bytes infer_frame(const bytes *body)
{
    bytes f = {.n = 0};
    field(&f, 1, body->b, body->n);
    return f;
}

/* A tensor {name, dtype I32, dims [1], 4 bytes} followed by EXTRA bytes. */
static bytes tensor(const char *name, size_t name_len, const void *extra, size_t n_extra)
{
    bytes t = {.n = 0};
    field(&t, 1, name, name_len);
    put(&t, "\x10\x04\x1a\x01\x01", 5);   /* dtype I32, dims [1] (packed) */
    field(&t, 4, "\x01\x00\x00\x00", 4);
    put(&t, extra, n_extra);
    return t;
}

static bt_code wire(const bytes *frame, bool *id_bad, char *why)
{
    why[0] = 0;
    return door_check_wire(frame->b, frame->n, id_bad, why, 512);
}

static void test_wire(void **state)
{
    (void)state;
    char why[512];
    bool id_bad;
    /* A clean request, with an unknown field (99, varint) in its tensor:
     * it passes, and the field is not the door's to keep. */
    bytes t = tensor("x", 1, "\x98\x06\x07", 3);
    bytes q = {.n = 0};
    field(&q, 1, "r1", 2);
    field(&q, 2, "g", 1);
    field(&q, 3, t.b, t.n);
    bytes f = infer_frame(&q);
    Baton__V1__ClientMessage *cm = baton__v1__client_message__unpack(NULL, f.n, f.b);
    assert_non_null(cm);
    baton__v1__client_message__free_unpacked(cm, NULL);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_OK);

    /* A field numbered 0, as the overlong varint 80 00, which protobuf-c
     * accepts: refused, naming where. */
    t = tensor("x", 1, "\x80\x00\x00", 3);
    q.n = 0;
    field(&q, 1, "r1", 2);
    field(&q, 3, t.b, t.n);
    f = infer_frame(&q);
    cm = baton__v1__client_message__unpack(NULL, f.n, f.b);
    assert_non_null(cm); /* what the door must catch itself */
    baton__v1__client_message__free_unpacked(cm, NULL);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "a field is numbered 0, which protobuf does not allow "
                        "(in infer.inputs[0])");
    assert_false(id_bad);

    /* A NUL in request_id: refused, and the id is not to be echoed. */
    q.n = 0;
    field(&q, 1, "a\0b", 3);
    field(&q, 2, "g", 1);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.request_id holds a NUL byte");
    assert_true(id_bad);

    /* Invalid UTF-8 in the graph name: refused; the id is fine. */
    q.n = 0;
    field(&q, 1, "r1", 2);
    field(&q, 2, "g\xc3(", 3);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.graph is not valid UTF-8");
    assert_false(id_bad);
    assert_null(strchr(why, '\xc3'));

    /* The second input's name, a map key, a chat message's content, a
     * stop string: each named by its path. */
    bytes t0 = tensor("x", 1, "", 0), t1 = tensor("y\xff", 2, "", 0);
    q.n = 0;
    field(&q, 3, t0.b, t0.n);
    field(&q, 3, t1.b, t1.n);
    field(&q, 1, "r1", 2);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.inputs[1].name is not valid UTF-8");
    bytes e = {.n = 0};
    field(&e, 1, "lo\0op", 5);
    put(&e, "\x10\x02", 2);
    q.n = 0;
    field(&q, 1, "r1", 2);
    field(&q, 7, e.b, e.n);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.max_iters[0].key holds a NUL byte");
    bytes m = {.n = 0};
    field(&m, 1, "user", 4);
    field(&m, 2, "\xed\xa0\x80", 3); /* a surrogate */
    q.n = 0;
    field(&q, 8, m.b, m.n);
    field(&q, 10, "ok", 2);
    field(&q, 10, "n\0", 2);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.messages[0].content is not valid UTF-8");

    /* The first failure answers, but a bad request_id later on the wire
     * is still known to be bad. */
    q.n = 0;
    field(&q, 2, "\xff", 1);
    field(&q, 1, "a\0c", 3);
    f = infer_frame(&q);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "infer.graph is not valid UTF-8");
    assert_true(id_bad);

    /* A cancel's id; an inspect's graph. */
    f.n = 0;
    field(&f, 1, "\0", 1);
    bytes c = f;
    f.n = 0;
    field(&f, 2, c.b, c.n);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "cancel.request_id holds a NUL byte");
    assert_true(id_bad);
    c.n = 0;
    field(&c, 1, "\xc0\xaf", 2);
    f.n = 0;
    field(&f, 5, c.b, c.n);
    assert_int_equal(wire(&f, &id_bad, why), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(why, "inspect.graph is not valid UTF-8");
    assert_false(id_bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optional_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_iters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_messages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raw_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_limits, setup, teardown),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_utf8_cut),
        cmocka_unit_test(test_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
