/* The OpenAI request parser and answer writers (daemon/openai.c): what is
 * accepted and how each field lands, what is refused and which parameter
 * the error names, UTF-8 held back at token boundaries, and answers that
 * are valid JSON whatever bytes the model produced. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "daemon/openai.h"

static int parse(const char *body, oa_chat *c, char *param)
{
    char err[512];
    return oa_chat_parse(body, strlen(body), c, err, sizeof(err), param, 64);
}

static void test_parse_fields(void **state)
{
    (void)state;
    oa_chat c;
    char param[64];
    assert_int_equal(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"hi \\u00e9\"}], \"max_tokens\": 7, \"temperature\": 0.5, "
                           "\"top_p\": 0.9, \"top_k\": 40, \"seed\": 12, \"stream\": true, "
                           "\"n\": 1, \"user\": \"u\"}", &c, param), 0);
    assert_string_equal(c.model, "m");
    assert_int_equal(c.n_msgs, 1);
    assert_string_equal(c.msgs[0].role, "user");
    assert_string_equal(c.msgs[0].content, "hi \xc3\xa9");
    assert_int_equal(c.max_tokens, 7);
    assert_true(c.temperature == 0.5f && c.top_p == 0.9f);
    assert_int_equal(c.top_k, 40);
    assert_int_equal(c.seed, 12);
    assert_true(c.stream);
    oa_chat_free(&c);
    /* Defaults: OpenAI's temperature 1, no cut, no cap; -1 top_k is no cut
     * (vLLM's convention); max_completion_tokens is the newer name. */
    assert_int_equal(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"\"}], \"top_k\": -1, \"max_completion_tokens\": 3}", &c, param), 0);
    assert_true(c.temperature == 1.0f && c.top_p == 1.0f);
    assert_int_equal(c.top_k, 0);
    assert_int_equal(c.max_tokens, 3);
    assert_false(c.stream);
    assert_int_equal(c.n_stop, 0);
    oa_chat_free(&c);
    /* stop: one string, or a list of up to four. */
    assert_int_equal(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}], \"stop\": \"\\n\\n\"}", &c, param), 0);
    assert_int_equal(c.n_stop, 1);
    assert_string_equal(c.stop[0], "\n\n");
    oa_chat_free(&c);
    assert_int_equal(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}], \"stop\": [\"a\", \"bc\", \"d\", \"\\u00e9\"]}", &c, param), 0);
    assert_int_equal(c.n_stop, 4);
    assert_string_equal(c.stop[1], "bc");
    assert_string_equal(c.stop[3], "\xc3\xa9");
    oa_chat_free(&c);
    /* A conversation: developer is system, text parts are joined, and
     * include_usage is taken for a stream. */
    assert_int_equal(parse("{\"model\": \"m\", \"stream\": true, \"stream_options\": "
                           "{\"include_usage\": true}, \"messages\": ["
                           "{\"role\": \"developer\", \"content\": \"be brief\"}, "
                           "{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                           "\"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}, "
                           "{\"role\": \"assistant\", \"content\": \"c\"}, "
                           "{\"role\": \"user\", \"content\": \"\"}]}", &c, param), 0);
    assert_int_equal(c.n_msgs, 4);
    assert_string_equal(c.msgs[0].role, "system");
    assert_string_equal(c.msgs[0].content, "be brief");
    assert_string_equal(c.msgs[1].role, "user");
    assert_string_equal(c.msgs[1].content, "ab");
    assert_string_equal(c.msgs[2].role, "assistant");
    assert_string_equal(c.msgs[3].content, "");
    assert_true(c.include_usage);
    oa_chat_free(&c);
    oa_chat_free(NULL);
}

static void test_parse_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"", ""},
        {"{\"model\": \"m\", \"messages\": [", ""},
        {"[]", ""},
        {"{\"model\": \"m\", \"model\": \"n\", \"messages\": []}", ""},   /* duplicate key */
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model"},
        {"{\"model\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model"},
        {"{\"model\": \"m\"}", "messages"},
        {"{\"model\": \"m\", \"messages\": []}", "messages"},
        {"{\"model\": \"m\", \"messages\": [1]}", "messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
         "messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
         "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}", "messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [5]}]}",
         "messages"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stream_options\": {\"include_usage\": true}}", "stream_options"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stream\": true, \"stream_options\": {\"other\": 1}}", "stream_options"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_tokens\": 0}", "max_tokens"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_tokens\": 2.5}", "max_tokens"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"temperature\": 3}", "temperature"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"temperature\": \"1\"}", "temperature"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"top_p\": 0}", "top_p"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"top_k\": -2}", "top_k"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"seed\": \"1\"}", "seed"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stream\": 1}", "stream"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"n\": 2}", "n"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", "stop"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stop\": \"\"}", "stop"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"stop\": [\"a\", 3]}", "stop"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logprobs\": true}", "logprobs"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        oa_chat c;
        char param[64] = "unset", err[512] = "";
        int rc = oa_chat_parse(cases[i].body, strlen(cases[i].body), &c, err, sizeof(err), param,
                               sizeof(param));
        if (rc != BT_EINVAL || strcmp(param, cases[i].param) != 0 || !err[0])
            fail_msg("case %zu (%s): rc %d, param '%s', error '%s'", i, cases[i].body, rc, param,
                     err);
        assert_null(c.model);
        assert_null(c.msgs);
        assert_null(c.audio);
    }
}

/* An input_audio part: its base64 decoded (line breaks skipped) beside the
 * text of the message that holds it; one per request; a bad part refused
 * naming messages; and the voice answers with their transcript. */
static void test_input_audio(void **state)
{
    (void)state;
    oa_chat c;
    char param[64];
    /* "RIFF\0\x01" in base64, with a line break in it. */
    assert_int_equal(parse("{\"model\": \"v\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                           "\"text\": \"a\"}, {\"type\": \"input_audio\", \"input_audio\": "
                           "{\"data\": \"UklG\\nRgAB\", \"format\": \"mp3\"}}]}]}",
                           &c, param),
                     0);
    assert_int_equal(c.audio_len, 6);
    assert_memory_equal(c.audio, "RIFF\0\x01", 6);
    assert_string_equal(c.msgs[1].content, "a");
    assert_int_equal(c.audio_msg, 1);  /* the message that holds it */
    oa_chat_free(&c);
    assert_null(c.audio);
    /* A stray "text" key in an input_audio part is no text of the message
     * (the buffer for the text is sized by the text parts alone). */
    char big[3000];
    int at = snprintf(big, sizeof(big), "{\"model\": \"v\", \"messages\": [{\"role\": \"user\", "
                      "\"content\": [{\"type\": \"input_audio\", \"input_audio\": {\"data\": "
                      "\"UklG\", \"format\": \"wav\"}, \"text\": \"");
    memset(big + at, 'A', 2000);
    snprintf(big + at + 2000, sizeof(big) - (size_t)at - 2000, "\"}]}]}");
    assert_int_equal(parse(big, &c, param), 0);
    assert_string_equal(c.msgs[0].content, "");
    assert_int_equal(c.audio_len, 3);
    assert_int_equal(c.audio_msg, 0);
    oa_chat_free(&c);
    static const char *const bad[] = {
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"UklG\", \"format\": \"aiff\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"U!lG\", \"format\": \"wav\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"\", \"format\": \"wav\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": 5, \"format\": \"wav\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"UklG\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"UklG\", \"format\": \"wav\", "
        "\"x\": 1}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"UklG\", \"format\": \"wav\"}}, "
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"UklG\", \"format\": \"wav\"}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body), "{\"model\": \"v\", \"messages\": [{\"role\": \"user\", "
                 "\"content\": [%s]}]}", bad[i]);
        strcpy(param, "unset");
        if (parse(body, &c, param) != BT_EINVAL || strcmp(param, "messages") != 0)
            fail_msg("case %zu (%s): param '%s'", i, body, param);
        assert_null(c.audio);
        assert_null(c.msgs);
    }
    oa_usage u = {5, 7};
    char *r = oa_voice_response("id", 1, "v", "Yes.", 4, "stop", &u, " Hello", 6);
    json_t *j = json_loads(r, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "transcript")), " Hello");
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(
                            json_object_get(j, "choices"), 0), "message"), "content")),
                        "Yes.");
    json_decref(j), free(r);
    r = oa_transcript_event("id", 1, "v", " Hel", 4);
    assert_non_null(r);
    assert_true(strncmp(r, "data: ", 6) == 0);
    j = json_loads(r + 6, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "transcript")), " Hel");
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    json_decref(j), free(r);
}

/* The refusals whose words matter: a number past the top of its range
 * says the range (not only its bottom), an empty body says it is empty,
 * and a body that is not JSON gives the parser's reason with a position
 * only where there is one (never "line -1"). */
static void test_refusal_messages(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param, *want;
    } cases[] = {
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_tokens\": 2147483648}", "max_tokens",
         "'max_tokens' must be an integer from 1 to 1048576"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_tokens\": 0}", "max_tokens", "'max_tokens' must be an integer from 1 to 1048576"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_completion_tokens\": 1048577}", "max_completion_tokens",
         "'max_completion_tokens' must be an integer from 1 to 1048576"},
        {"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"top_k\": 2147483648}", "top_k", "'top_k' must be an integer from -1 to 1048576"},
        {"", "", "the request body is empty"},
        {"{\"model\": \"m\", \"messages\": [", "", "the body is not valid JSON: "},
        {"{\"model\": \"m\",\n \"messages\": x}", "", "(line 2, column"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        oa_chat c;
        char param[64] = "unset", err[512] = "";
        int rc = oa_chat_parse(cases[i].body, strlen(cases[i].body), &c, err, sizeof(err), param,
                               sizeof(param));
        if (rc != BT_EINVAL || strcmp(param, cases[i].param) != 0 || !strstr(err, cases[i].want) ||
            strstr(err, "-1,") || strstr(err, "line -1") || strstr(err, "wrong arguments"))
            fail_msg("case %zu (%s): rc %d, param '%s', error '%s', want '%s'", i, cases[i].body,
                     rc, param, err, cases[i].want);
    }
    /* The gateway hands an empty body over as NULL. */
    oa_chat c;
    char param[64] = "unset", err[512] = "";
    assert_int_equal(oa_chat_parse(NULL, 0, &c, err, sizeof(err), param, sizeof(param)),
                     BT_EINVAL);
    assert_string_equal(err, "the request body is empty: send a JSON object");
    assert_int_equal(oa_completion_parse(NULL, 0, &c, err, sizeof(err), param, sizeof(param)),
                     BT_EINVAL);
    assert_string_equal(err, "the request body is empty: send a JSON object");
}

static void test_utf8_ready(void **state)
{
    (void)state;
    assert_int_equal(oa_utf8_ready("abc", 3, false), 3);
    assert_int_equal(oa_utf8_ready("a\xc3", 2, false), 1);           /* é cut after its lead */
    assert_int_equal(oa_utf8_ready("a\xc3\xa9", 3, false), 3);
    assert_int_equal(oa_utf8_ready("\xe2\x82", 2, false), 0);        /* € cut */
    assert_int_equal(oa_utf8_ready("\xe2\x82\xac", 3, false), 3);
    assert_int_equal(oa_utf8_ready("x\xf0\x9f\x98", 4, false), 1);   /* an emoji cut */
    assert_int_equal(oa_utf8_ready("x\xf0\x9f\x98\x80", 5, false), 5);
    assert_int_equal(oa_utf8_ready("\xe2\x82", 2, true), 2);         /* the end: all */
    assert_int_equal(oa_utf8_ready("\x80\x80\x80\x80\x80", 5, false), 5); /* not UTF-8 */
    assert_int_equal(oa_utf8_ready("", 0, false), 0);
}

/* The JSON of an event, without its "data: " and blank line. */
static json_t *event_json(const char *ev)
{
    assert_non_null(ev);
    assert_memory_equal(ev, "data: ", 6);
    size_t n = strlen(ev);
    assert_true(n > 8 && ev[n - 1] == '\n' && ev[n - 2] == '\n');
    json_t *j = json_loadb(ev + 6, n - 8, 0, NULL);
    assert_non_null(j);
    return j;
}

static void test_answers(void **state)
{
    (void)state;
    char *ev = oa_chat_event("id1", 5, "m", "Hi \"there\"", 10, true, NULL);
    json_t *j = event_json(ev);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")),
                        "assistant");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ch, "delta"), "content")),
        "Hi \"there\"");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(j), free(ev);
    /* The finish: an empty delta. */
    ev = oa_chat_event("id1", 5, "m", "", 0, false, "length");
    j = event_json(ev);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_decref(j), free(ev);
    /* Bytes that are not UTF-8 become U+FFFD; the rest is kept. */
    ev = oa_chat_event("id1", 5, "m", "a\xff" "b\xc3", 4, false, NULL);
    j = event_json(ev);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ch, "delta"), "content")),
        "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    json_decref(j), free(ev);
    oa_usage u = {12, 5, 8};
    char *r = oa_chat_response("id2", 7, "m", "Paris", 5, "stop", &u);
    j = json_loads(r, 0, NULL);
    assert_non_null(j);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 7);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ch, "message"), "content")), "Paris");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_t *us = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "prompt_tokens")), 12);
    assert_int_equal(json_integer_value(json_object_get(us, "completion_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 17);
    /* The prompt's tokens read from a prefix cache, where OpenAI puts them. */
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(us, "prompt_tokens_details"), "cached_tokens")), 8);
    json_decref(j), free(r);
    /* A stream's usage event: no choices. */
    ev = oa_chat_usage_event("id1", 5, "m", &u);
    j = event_json(ev);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "total_tokens")), 17);
    json_decref(j), free(ev);
    r = oa_error("a \"quoted\" name", "invalid_request_error", "model");
    j = json_loads(r, 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "a \"quoted\" name");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "model");
    assert_true(json_is_null(json_object_get(e, "code")));
    json_decref(j), free(r);
    const char *names[] = {"a", "b"};
    r = oa_models(names, 2, 1);
    j = json_loads(r, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 1), "id")),
        "b");
    json_decref(j), free(r);
}

/* POST /v1/completions: the prompt (one string), OpenAI's default of 16
 * tokens, echo and logprobs only off, and chat-only fields refused; the
 * answers are text_completion objects. */
static void test_completions(void **state)
{
    (void)state;
    oa_chat c;
    char err[512], param[64];
#define CPARSE(b) oa_completion_parse(b, strlen(b), &c, err, sizeof(err), param, sizeof(param))
    assert_int_equal(CPARSE("{\"model\": \"m\", \"prompt\": \"Once upon\", \"stop\": [\"x\"], "
                            "\"echo\": false, \"logprobs\": null, \"temperature\": 0}"), 0);
    assert_string_equal(c.prompt, "Once upon");
    assert_int_equal(c.n_msgs, 0);
    assert_int_equal(c.max_tokens, OA_COMPLETION_MAX_TOKENS);
    assert_int_equal(c.n_stop, 1);
    oa_chat_free(&c);
    assert_int_equal(CPARSE("{\"model\": \"m\", \"prompt\": \"a\", \"max_tokens\": 3}"), 0);
    assert_int_equal(c.max_tokens, 3);
    oa_chat_free(&c);
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{\"model\": \"m\", \"prompt\": [1, 2]}", "prompt"},
        {"{\"model\": \"m\", \"prompt\": [\"a\", \"b\"]}", "prompt"},
        {"{\"model\": \"m\", \"prompt\": \"\"}", "prompt"},
        {"{\"model\": \"m\"}", "prompt"},
        {"{\"model\": \"m\", \"prompt\": \"a\", \"echo\": true}", "echo"},
        {"{\"model\": \"m\", \"prompt\": \"a\", \"logprobs\": 0}", "logprobs"},
        {"{\"model\": \"m\", \"prompt\": \"a\", \"messages\": []}", "messages"},
        {"{\"model\": \"m\", \"prompt\": \"a\", \"suffix\": \"b\"}", "suffix"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(CPARSE(bad[i].body), BT_EINVAL);
        assert_string_equal(param, bad[i].param);
    }
    /* A chat takes no prompt. */
    assert_int_equal(oa_chat_parse("{\"model\": \"m\", \"prompt\": \"a\"}", 29, &c, err,
                                   sizeof(err), param, sizeof(param)), BT_EINVAL);
    assert_string_equal(param, "prompt");
#undef CPARSE
    oa_usage u = {3, 2};
    char *r = oa_completion_response("cmpl-1", 7, "m", "Paris", 5, "length", &u);
    json_t *j = json_loads(r, 0, NULL);
    assert_non_null(j);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "Paris");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    assert_true(json_is_null(json_object_get(ch, "logprobs")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "total_tokens")), 5);
    json_decref(j), free(r);
    char *ev = oa_completion_event("cmpl-1", 7, "m", "Pa", 2, NULL);
    j = event_json(ev);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "Pa");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(j), free(ev);
    ev = oa_completion_usage_event("cmpl-1", 7, "m", &u);
    j = event_json(ev);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    json_decref(j), free(ev);
}

/* The audio answers: segments from the backend's JSON lines give
 * verbose_json its segments (numbered from 0) and srt and vtt one cue each;
 * a line that is no segment is skipped; without any, one span. */
static void test_audio_formats(void **state)
{
    (void)state;
    const char *text = " Hello there. General Kenobi.";
    const char *segs = "{\"id\":3,\"seek\":0,\"start\":0.0,\"end\":1.5,\"text\":\" Hello there.\","
                       "\"tokens\":[50364,1],\"temperature\":0.0,\"language\":\"de\"}\n"
                       "not json\n"
                       "{\"id\":4,\"seek\":300,\"start\":3661.25,\"end\":3662.0,"
                       "\"text\":\" General Kenobi.\",\"tokens\":[],\"temperature\":0.0}\n";
    oa_usage u = {3, 9};
    const char *ct;
    char *srt = oa_audio_response(OA_AUDIO_SRT, text, strlen(text), segs, strlen(segs), 3662.5,
                                  "transcribe", "en", &u, &ct);
    assert_non_null(srt);
    assert_string_equal(srt, "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                             "2\n01:01:01,250 --> 01:01:02,000\nGeneral Kenobi.\n\n");
    assert_non_null(strstr(ct, "subrip"));
    char *vtt = oa_audio_response(OA_AUDIO_VTT, text, strlen(text), segs, strlen(segs), 3662.5,
                                  "transcribe", "en", &u, &ct);
    assert_string_equal(vtt, "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                             "01:01:01.250 --> 01:01:02.000\nGeneral Kenobi.\n\n");
    char *vj = oa_audio_response(OA_AUDIO_VERBOSE_JSON, text, strlen(text), segs, strlen(segs),
                                 3662.5, "transcribe", "en", &u, &ct);
    json_t *v = json_loads(vj, 0, NULL);
    json_t *a = json_object_get(v, "segments");
    assert_int_equal(json_array_size(a), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 0), "id")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 1), "id")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 1), "seek")), 300);
    assert_true(json_real_value(json_object_get(json_array_get(a, 1), "start")) == 3661.25);
    assert_string_equal(json_string_value(json_object_get(v, "text")), text);
    /* The language asked for; a segment's is no field of OpenAI's. */
    assert_string_equal(json_string_value(json_object_get(v, "language")), "en");
    assert_null(json_object_get(json_array_get(a, 0), "language"));
    json_decref(v);
    free(vj);
    /* Not asked for: the one detected, from the first segment. */
    vj = oa_audio_response(OA_AUDIO_VERBOSE_JSON, text, strlen(text), segs, strlen(segs),
                           3662.5, "transcribe", "", &u, &ct);
    v = json_loads(vj, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(v, "language")), "de");
    json_decref(v);
    /* No segments: one span over the audio. */
    char *one = oa_audio_response(OA_AUDIO_SRT, text, strlen(text), NULL, 0, 2.0, "transcribe",
                                  "", &u, &ct);
    assert_string_equal(one, "1\n00:00:00,000 --> 00:00:02,000\nHello there. General Kenobi.\n\n");
    free(srt), free(vtt), free(vj), free(one);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions),
        cmocka_unit_test(test_audio_formats),
        cmocka_unit_test(test_parse_fields),
        cmocka_unit_test(test_parse_refusals),
        cmocka_unit_test(test_input_audio),
        cmocka_unit_test(test_refusal_messages),
        cmocka_unit_test(test_utf8_ready),
        cmocka_unit_test(test_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
