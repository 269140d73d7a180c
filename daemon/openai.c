/* OpenAI's chat completions and completions APIs (daemon/openai.h), with
 * jansson. */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "daemon/openai.h"

/* The request fields understood; any other is refused (400), so that a
 * client never believes a setting was honoured when it was not. */
static const char *const chat_fields[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "seed", "stream", "n", "user", "stop", "stream_options", NULL,
};
static const char *const completion_fields[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "n",
    "user", "stop", "stream_options", "echo", "logprobs", NULL,
};

/* The largest max_tokens and top_k taken (2^20), spelled out in the
 * messages that give the ranges. */
#define OA_MAX_TOKENS 1048576
#define OA_MAX_TOP_K 1048576
#define OA_STR_(x) #x
#define OA_STR(x) OA_STR_(x)

static int fail(char *err, size_t errlen, char *param, size_t paramlen, const char *p,
                const char *fmt, const char *arg)
{
    snprintf(err, errlen, fmt, arg);
    snprintf(param, paramlen, "%s", p);
    return BT_EINVAL;
}

/* A number in [LO, HI] from V, or -1. */
static int number_in(const json_t *v, double lo, double hi, double *out)
{
    if (!json_is_number(v))
        return -1;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return -1;
    *out = x;
    return 0;
}

/* A message's role as the model's template names it: OpenAI's "developer"
 * is the newer name of "system".  NULL for a role this server cannot
 * render (tool and function turns need tool calling). */
static const char *role_of(const char *r)
{
    if (!strcmp(r, "system") || !strcmp(r, "developer"))
        return "system";
    if (!strcmp(r, "user"))
        return "user";
    if (!strcmp(r, "assistant"))
        return "assistant";
    return NULL;
}

/* An input_audio part's {"data", "format"} into C: the file's bytes from
 * standard base64 (libsodium's decoder; line breaks are skipped).  0, or
 * -1 with *WHAT set. */
static int audio_of(const json_t *a, oa_chat *c, const char **what)
{
    static const char *const formats[] = {"wav", "mp3", "flac", "ogg"};
    const json_t *data = json_object_get(a, "data"), *format = json_object_get(a, "format");
    *what = "an input_audio part is {\"type\": \"input_audio\", \"input_audio\": {\"data\": "
            "BASE64, \"format\": \"wav\"}}";
    if (!json_is_object(a) || !json_is_string(data) || !json_is_string(format) ||
        json_object_size(a) != 2)
        return -1;
    bool known = false;
    for (size_t k = 0; k < sizeof(formats) / sizeof(*formats); k++)
        known |= strcmp(json_string_value(format), formats[k]) == 0;
    if (!known) {
        *what = "an input_audio part's 'format' must be wav, mp3, flac or ogg";
        return -1;
    }
    if (c->audio) {
        *what = "only one input_audio part is taken in a request";
        return -1;
    }
    size_t b64 = json_string_length(data), len = 0;
    if (!(c->audio = malloc(b64 / 4 * 3 + 3))) {
        *what = "out of memory";
        return -1;
    }
    if (b64 == 0 ||
        sodium_base642bin(c->audio, b64 / 4 * 3 + 3, json_string_value(data), b64, "\r\n", &len,
                          NULL, sodium_base64_VARIANT_ORIGINAL) != 0 ||
        len == 0) {
        free(c->audio);
        c->audio = NULL;
        *what = b64 ? "an input_audio part's 'data' is not valid base64"
                    : "an input_audio part's 'data' is empty";
        return -1;
    }
    /* The format is checked but not kept: the decoder reads the file's own
     * header, whatever the client called it. */
    c->audio_len = len;
    return 0;
}

/* A message's content: a string, or an array of parts: text parts
 * ({"type": "text", "text": ...}), joined in order, and input_audio parts
 * ({"type": "input_audio", "input_audio": {"data": BASE64, "format"}}),
 * whose file goes to C (one in a request).  Malloc'd, or NULL with *WHAT
 * set. */
static char *content_of(const json_t *content, oa_chat *c, const char **what)
{
    if (json_is_string(content))
        return strndup(json_string_value(content), json_string_length(content));
    *what = "a message's 'content' must be a string or an array of text or input_audio parts";
    if (!json_is_array(content))
        return NULL;
    size_t i, n = 0;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (json_is_string(type) && strcmp(json_string_value(type), "input_audio") == 0) {
            if (audio_of(json_object_get(part, "input_audio"), c, what) != 0)
                return NULL;
            continue;
        }
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            *what = "only text parts ({\"type\": \"text\", \"text\": ...}) and input_audio "
                    "parts are supported in a message's content";
            return NULL;
        }
        n += json_string_length(text);
    }
    char *s = malloc(n + 1), *at = s;
    if (!s)
        return NULL;
    json_array_foreach(content, i, part) {
        /* The text parts only, as counted above: an input_audio part's
         * stray "text" key is not part of the message. */
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (strcmp(json_string_value(type), "text") != 0)
            continue;
        memcpy(at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    *at = '\0';
    return s;
}

static int parse_messages(const json_t *msgs, oa_chat *c, char *err, size_t errlen, char *param,
                          size_t paramlen)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return fail(err, errlen, param, paramlen, "messages", "%s",
                    "'messages' must be a non-empty array of {role, content}");
    if (!(c->msgs = calloc(json_array_size(msgs), sizeof(*c->msgs))))
        return BT_ENOMEM;
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return fail(err, errlen, param, paramlen, "messages", "%s",
                        "each message must be an object with a string 'role'");
        const char *r = role_of(json_string_value(role));
        if (!r)
            return fail(err, errlen, param, paramlen, "messages",
                        "messages with role '%s' are not supported: the roles are system "
                        "(or developer), user and assistant",
                        json_string_value(role));
        const char *what = "out of memory";
        bool had_audio = c->audio != NULL;
        char *text = content_of(content, c, &what);
        if (!text)
            return fail(err, errlen, param, paramlen, "messages", "%s", what);
        if (c->audio && !had_audio)
            c->audio_msg = i;
        c->msgs[c->n_msgs++] = (oa_msg){r, text};
    }
    return 0;
}

/* A completion's prompt: one string.  OpenAI also takes a list of
 * strings (several completions) or of token ids, which this server does
 * not: refused, not guessed at. */
static int parse_prompt(const json_t *root, oa_chat *c, char *err, size_t errlen, char *param,
                        size_t paramlen)
{
    const json_t *p = json_object_get(root, "prompt");
    if (!json_is_string(p))
        return fail(err, errlen, param, paramlen, "prompt", "%s",
                    json_is_array(p) ? "'prompt' must be one string: lists of prompts and "
                                       "token ids are not supported"
                                     : "'prompt' must be a string");
    size_t n = json_string_length(p);
    if (n == 0 || memchr(json_string_value(p), 0, n))
        return fail(err, errlen, param, paramlen, "prompt", "%s",
                    "'prompt' must be a non-empty string without NUL characters");
    if (!(c->prompt = strndup(json_string_value(p), n)))
        return BT_ENOMEM;
    /* echo (the prompt repeated in the answer) and logprobs are not
     * served: only their "off" values are taken. */
    const json_t *f = json_object_get(root, "echo");
    if (f && !json_is_null(f) && !json_is_false(f))
        return fail(err, errlen, param, paramlen, "echo", "%s", "only echo = false is supported");
    f = json_object_get(root, "logprobs");
    if (f && !json_is_null(f))
        return fail(err, errlen, param, paramlen, "logprobs", "%s",
                    "logprobs are not supported: only null");
    return 0;
}

static int parse(const char *body, size_t len, oa_chat *c, bool completion, char *err,
                 size_t errlen, char *param, size_t paramlen)
{
    const char *const *fields = completion ? completion_fields : chat_fields;
    memset(c, 0, sizeof(*c));
    c->temperature = 1.0f;
    c->top_p = 1.0f;
    *param = 0;
    /* jansson answers an empty buffer with "wrong arguments" at line -1:
     * say what is wrong instead. */
    if (len == 0) {
        snprintf(err, errlen, "the request body is empty: send a JSON object");
        return BT_EINVAL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* A position only where jansson knows one. */
        if (je.line >= 1 && je.column >= 0)
            snprintf(err, errlen, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                     je.line, je.column);
        else
            snprintf(err, errlen, "the body is not valid JSON: %s", je.text);
        return BT_EINVAL;
    }
    int rc = BT_EINVAL;
    if (!json_is_object(root)) {
        rc = fail(err, errlen, param, paramlen, "", "%s", "the body must be a JSON object");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        size_t k = 0;
        while (fields[k] && strcmp(key, fields[k]))
            k++;
        if (!fields[k]) {
            rc = fail(err, errlen, param, paramlen, key, "unsupported parameter '%s'", key);
            goto out;
        }
    }
    const json_t *model = json_object_get(root, "model");
    if (!json_is_string(model)) {
        rc = fail(err, errlen, param, paramlen, "model", "%s", "'model' must be a string");
        goto out;
    }
    if (!(c->model = strdup(json_string_value(model)))) {
        rc = BT_ENOMEM;
        goto out;
    }
    double x;
    const json_t *f;
    const char *mt = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                     : "max_tokens";
    if (completion)
        c->max_tokens = OA_COMPLETION_MAX_TOKENS;
    if ((f = json_object_get(root, mt)) && !json_is_null(f)) {
        if (!json_is_integer(f) || number_in(f, 1, OA_MAX_TOKENS, &x)) {
            rc = fail(err, errlen, param, paramlen, mt,
                      "'%s' must be an integer from 1 to " OA_STR(OA_MAX_TOKENS), mt);
            goto out;
        }
        c->max_tokens = (uint32_t)x;
    }
    if ((f = json_object_get(root, "temperature")) && !json_is_null(f)) {
        if (number_in(f, 0, 2, &x)) {
            rc = fail(err, errlen, param, paramlen, "temperature", "%s",
                      "'temperature' must be a number from 0 to 2");
            goto out;
        }
        c->temperature = (float)x;
    }
    if ((f = json_object_get(root, "top_p")) && !json_is_null(f)) {
        if (number_in(f, 0, 1, &x) || x == 0) {
            rc = fail(err, errlen, param, paramlen, "top_p", "%s",
                      "'top_p' must be a number in (0, 1]");
            goto out;
        }
        c->top_p = (float)x;
    }
    if ((f = json_object_get(root, "top_k")) && !json_is_null(f)) {
        /* vLLM's convention: -1 (or 0) means no cut. */
        if (!json_is_integer(f) || number_in(f, -1, OA_MAX_TOP_K, &x)) {
            rc = fail(err, errlen, param, paramlen, "top_k", "%s",
                      "'top_k' must be an integer from -1 to " OA_STR(OA_MAX_TOP_K)
                      " (-1 or 0: no cut)");
            goto out;
        }
        c->top_k = x > 0 ? (uint32_t)x : 0;
    }
    if ((f = json_object_get(root, "seed")) && !json_is_null(f)) {
        if (!json_is_integer(f)) {
            rc = fail(err, errlen, param, paramlen, "seed", "%s", "'seed' must be an integer");
            goto out;
        }
        c->seed = (uint64_t)json_integer_value(f);
    }
    if ((f = json_object_get(root, "stream")) && !json_is_null(f)) {
        if (!json_is_boolean(f)) {
            rc = fail(err, errlen, param, paramlen, "stream", "%s", "'stream' must be a boolean");
            goto out;
        }
        c->stream = json_is_true(f);
    }
    if ((f = json_object_get(root, "stream_options")) && !json_is_null(f)) {
        /* {"include_usage": bool}: a last event with the usage, streams only. */
        const json_t *iu = json_object_get(f, "include_usage");
        if (!json_is_object(f) || json_object_size(f) != (iu ? 1u : 0u) ||
            (iu && !json_is_boolean(iu))) {
            rc = fail(err, errlen, param, paramlen, "stream_options", "%s",
                      "'stream_options' takes only {\"include_usage\": true or false}");
            goto out;
        }
        if (!c->stream) {
            rc = fail(err, errlen, param, paramlen, "stream_options", "%s",
                      "'stream_options' is for streams (stream: true)");
            goto out;
        }
        c->include_usage = json_is_true(iu);
    }
    if ((f = json_object_get(root, "n")) && !json_is_null(f) &&
        !(json_is_integer(f) && json_integer_value(f) == 1)) {
        rc = fail(err, errlen, param, paramlen, "n", "%s", "only n = 1 is supported");
        goto out;
    }
    if ((f = json_object_get(root, "user")) && !json_is_null(f) && !json_is_string(f)) {
        rc = fail(err, errlen, param, paramlen, "user", "%s", "'user' must be a string");
        goto out;
    }
    if ((f = json_object_get(root, "stop")) && !json_is_null(f)) {
        /* A string, or a list of up to OA_MAX_STOP non-empty strings. */
        size_t n = json_is_array(f) ? json_array_size(f) : 1;
        bool ok = json_is_string(f) || (json_is_array(f) && n <= OA_MAX_STOP);
        for (size_t i = 0; ok && i < n; i++) {
            const json_t *e = json_is_array(f) ? json_array_get(f, i) : f;
            size_t sl = json_is_string(e) ? json_string_length(e) : 0;
            ok = sl > 0 && sl <= OA_MAX_STOP_BYTES && !memchr(json_string_value(e), 0, sl);
            if (ok && !(c->stop[c->n_stop++] = strndup(json_string_value(e), sl))) {
                rc = BT_ENOMEM;
                goto out;
            }
        }
        if (!ok) {
            rc = fail(err, errlen, param, paramlen, "stop",
                      "'stop' must be a string or a list of up to %s non-empty strings "
                      "(256 bytes each)", "4");
            goto out;
        }
    }
    rc = completion ? parse_prompt(root, c, err, errlen, param, paramlen)
                    : parse_messages(json_object_get(root, "messages"), c, err, errlen, param,
                                     paramlen);
out:
    json_decref(root);
    if (rc)
        oa_chat_free(c);
    return rc;
}

int oa_chat_parse(const char *body, size_t len, oa_chat *c, char *err, size_t errlen,
                  char *param, size_t paramlen)
{
    return parse(body, len, c, false, err, errlen, param, paramlen);
}

int oa_completion_parse(const char *body, size_t len, oa_chat *c, char *err, size_t errlen,
                        char *param, size_t paramlen)
{
    return parse(body, len, c, true, err, errlen, param, paramlen);
}

void oa_chat_free(oa_chat *c)
{
    if (!c)
        return;
    free(c->model);
    c->model = NULL;
    for (size_t i = 0; i < c->n_msgs; i++)
        free(c->msgs[i].content);
    free(c->msgs);
    c->msgs = NULL;
    c->n_msgs = 0;
    free(c->prompt);
    c->prompt = NULL;
    free(c->audio);
    c->audio = NULL;
    c->audio_len = 0;
    for (size_t i = 0; i < c->n_stop; i++)
        free(c->stop[i]);
    c->n_stop = 0;
}

/* ---- answers ---------------------------------------------------------------- */

size_t oa_utf8_ready(const char *s, size_t len, bool final)
{
    if (final || len == 0)
        return len;
    /* Walk back over at most 3 continuation bytes to the last lead byte:
     * if the character it starts is cut short, hold it back. */
    size_t i = len, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--, back++;
    if (i == 0)
        return len;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 && lead < 0xF8 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 < need ? i - 1 : len;
}

/* TEXT as a JSON string; bytes that are not UTF-8 become U+FFFD. */
static json_t *text_json(const char *text, size_t len)
{
    json_t *j = json_stringn(text, len);
    if (j)
        return j;
    char *clean = malloc(len * 3 + 1);
    if (!clean)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        /* The longest prefix from I that is one valid character. */
        size_t take = 0;
        for (size_t n = 1; n <= 4 && i + n <= len && !take; n++) {
            json_t *probe = json_stringn(text + i, n);
            if (probe) {
                take = n;
                json_decref(probe);
            }
        }
        if (take) {
            memcpy(clean + o, text + i, take);
            o += take, i += take;
        } else {
            memcpy(clean + o, "\xEF\xBF\xBD", 3);
            o += 3, i++;
        }
    }
    j = json_stringn(clean, o);
    free(clean);
    return j;
}

static char *dump(json_t *root)
{
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

static json_t *usage_json(const oa_usage *u)
{
    /* prompt_tokens_details.cached_tokens as OpenAI and vLLM give it. */
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt,
                     "completion_tokens", (json_int_t)u->completion, "total_tokens",
                     (json_int_t)u->prompt + (json_int_t)u->completion,
                     "prompt_tokens_details", "cached_tokens", (json_int_t)u->cached);
}

static json_t *chat_response(const char *id, int64_t created, const char *model,
                             const char *text, size_t len, const char *finish,
                             const oa_usage *usage)
{
    json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text_json(text, len));
    json_t *choice = json_pack("{s:i, s:o, s:s, s:n}", "index", 0, "message", msg,
                               "finish_reason", finish, "logprobs");
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object", "chat.completion",
                     "created", (json_int_t)created, "model", model, "choices", choice, "usage",
                     usage_json(usage));
}

char *oa_chat_response(const char *id, int64_t created, const char *model, const char *text,
                       size_t len, const char *finish, const oa_usage *usage)
{
    return dump(chat_response(id, created, model, text, len, finish, usage));
}

char *oa_voice_response(const char *id, int64_t created, const char *model, const char *text,
                        size_t len, const char *finish, const oa_usage *usage,
                        const char *heard, size_t heard_len)
{
    json_t *r = chat_response(id, created, model, text, len, finish, usage);
    if (r && json_object_set_new(r, "transcript", text_json(heard, heard_len)) != 0) {
        json_decref(r);
        r = NULL;
    }
    return dump(r);
}

/* "data: JS\n\n" for the JSON text JS (freed).  Malloc'd, or NULL. */
static char *sse(char *js)
{
    if (!js)
        return NULL;
    size_t n = strlen(js);
    char *ev = malloc(n + 9);
    if (ev)
        snprintf(ev, n + 9, "data: %s\n\n", js);
    free(js);
    return ev;
}

char *oa_chat_usage_event(const char *id, int64_t created, const char *model,
                          const oa_usage *usage)
{
    return sse(dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                              "chat.completion.chunk", "created", (json_int_t)created, "model",
                              model, "choices", "usage", usage_json(usage))));
}

char *oa_transcript_event(const char *id, int64_t created, const char *model, const char *heard,
                          size_t len)
{
    return sse(dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                              "chat.completion.chunk", "created", (json_int_t)created, "model",
                              model, "choices", "transcript", text_json(heard, len))));
}

char *oa_chat_event(const char *id, int64_t created, const char *model, const char *text,
                    size_t len, bool role_first, const char *finish)
{
    json_t *delta = json_object();
    if (delta && role_first)
        json_object_set_new(delta, "role", json_string("assistant"));
    if (delta && (len || role_first))
        json_object_set_new(delta, "content", text_json(text, len));
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "finish_reason",
                               finish ? json_string(finish) : json_null());
    return sse(dump(json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
                              "chat.completion.chunk", "created", (json_int_t)created, "model",
                              model, "choices", choice)));
}

static json_t *completion_choice(const char *text, size_t len, const char *finish)
{
    return json_pack("{s:o, s:i, s:n, s:o}", "text", text_json(text, len), "index", 0,
                     "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
}

char *oa_completion_response(const char *id, int64_t created, const char *model,
                             const char *text, size_t len, const char *finish,
                             const oa_usage *usage)
{
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
                          "text_completion", "created", (json_int_t)created, "model", model,
                          "choices", completion_choice(text, len, finish), "usage",
                          usage_json(usage)));
}

char *oa_completion_event(const char *id, int64_t created, const char *model, const char *text,
                          size_t len, const char *finish)
{
    return sse(dump(json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
                              "text_completion", "created", (json_int_t)created, "model", model,
                              "choices", completion_choice(text, len, finish))));
}

char *oa_completion_usage_event(const char *id, int64_t created, const char *model,
                                const oa_usage *usage)
{
    return sse(dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                              "text_completion", "created", (json_int_t)created, "model", model,
                              "choices", "usage", usage_json(usage))));
}

char *oa_models(const char *const *names, size_t n, int64_t created)
{
    json_t *data = json_array();
    for (size_t i = 0; data && i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", names[i], "object",
                                              "model", "created", (json_int_t)created,
                                              "owned_by", "baton"));
    return dump(json_pack("{s:s, s:o}", "object", "list", "data", data));
}

char *oa_error(const char *message, const char *type, const char *param)
{
    json_t *p = param && *param ? json_string(param) : json_null();
    return dump(json_pack("{s:{s:o, s:s, s:o, s:n}}", "error", "message",
                          text_json(message, strlen(message)), "type", type, "param", p,
                          "code"));
}

/* ---- audio ------------------------------------------------------------------- */

static const char *const audio_formats[] = {"json", "text", "srt", "vtt", "verbose_json"};

int oa_audio_format_of(const char *name)
{
    for (int i = 0; i < (int)(sizeof(audio_formats) / sizeof(audio_formats[0])); i++)
        if (strcmp(name, audio_formats[i]) == 0)
            return i;
    return -1;
}

/* SECONDS as HH:MM:SS,mmm (SEP ',') or HH:MM:SS.mmm (SEP '.'). */
static void clock_of(double seconds, char sep, char *out, size_t len)
{
    long long ms = seconds > 0 ? (long long)(seconds * 1000.0 + 0.5) : 0;
    snprintf(out, len, "%02lld:%02lld:%02lld%c%03lld", ms / 3600000, ms / 60000 % 60,
             ms / 1000 % 60, sep, ms % 1000);
}

/* TEXT without its leading and trailing spaces (Whisper's text starts with
 * one): *LEN updated. */
static const char *trimmed(const char *text, size_t *len)
{
    while (*len && (*text == ' ' || *text == '\n'))
        text++, (*len)--;
    while (*len && (text[*len - 1] == ' ' || text[*len - 1] == '\n'))
        (*len)--;
    return text;
}

static json_t *audio_usage_json(const oa_usage *u)
{
    return json_pack("{s:s, s:I, s:I, s:I}", "type", "tokens", "input_tokens",
                     (json_int_t)u->prompt, "output_tokens", (json_int_t)u->completion,
                     "total_tokens", (json_int_t)u->prompt + (json_int_t)u->completion);
}

/* The segments of SEGS (LEN bytes of JSON lines, as the Whisper backend
 * writes them), each with id, seek, start, end, text, tokens and
 * temperature; without any (no segments stream, or none in it), one span
 * of TEXT over the whole audio.  A line that is not a segment is skipped.
 * A segment's "language" (OpenAI's segments have none) goes to LANG (LANG_LEN
 * bytes; "" when no segment has one): the first segment's. */
static json_t *segments_json(const char *segs, size_t len, const char *text, size_t text_len,
                             double end, char *lang, size_t lang_len)
{
    *lang = 0;
    json_t *a = json_array();
    if (!a)
        return NULL;
    for (size_t at = 0; segs && at < len;) {
        const char *nl = memchr(segs + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (segs + at)) : len - at;
        json_t *o = json_loadb(segs + at, n, 0, NULL);
        if (json_is_object(o) && json_is_number(json_object_get(o, "start")) &&
            json_is_number(json_object_get(o, "end")) &&
            json_is_string(json_object_get(o, "text"))) {
            json_object_set_new(o, "id", json_integer((json_int_t)json_array_size(a)));
            const json_t *l = json_object_get(o, "language");
            if (!*lang && json_is_string(l))
                snprintf(lang, lang_len, "%s", json_string_value(l));
            json_object_del(o, "language");
            json_array_append_new(a, o);
        } else {
            json_decref(o);
        }
        at += n + 1;
    }
    if (json_array_size(a) == 0)
        json_array_append_new(a, json_pack("{s:i, s:i, s:f, s:f, s:o, s:[], s:f}", "id", 0,
                                           "seek", 0, "start", 0.0, "end", end, "text",
                                           text_json(text, text_len), "tokens", "temperature",
                                           0.0));
    return a;
}

char *oa_audio_response(oa_audio_format format, const char *text, size_t len, const char *segs,
                        size_t segs_len, double duration, const char *task, const char *language,
                        const oa_usage *usage, const char **ctype)
{
    *ctype = "application/json";
    if (format == OA_AUDIO_JSON)
        return dump(json_pack("{s:o, s:o}", "text", text_json(text, len), "usage",
                              audio_usage_json(usage)));
    double end = duration > 0 ? duration : 0;
    char detected[16];
    json_t *segments = segments_json(segs, segs_len, text, len, end, detected, sizeof(detected));
    if (!segments)
        return NULL;
    /* The language asked for, else the one the model detected. */
    if (format == OA_AUDIO_VERBOSE_JSON)
        return dump(json_pack("{s:s, s:s, s:f, s:o, s:o, s:o}", "task", task, "language",
                              *language ? language : detected, "duration", end, "text",
                              text_json(text, len), "segments", segments, "usage",
                              audio_usage_json(usage)));
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    if (!f) {
        json_decref(segments);
        return NULL;
    }
    if (format == OA_AUDIO_TEXT) {
        size_t n = len;
        const char *t = trimmed(text, &n);
        *ctype = "text/plain; charset=utf-8";
        fprintf(f, "%.*s\n", (int)n, t);
    } else {
        bool srt = format == OA_AUDIO_SRT;
        *ctype = srt ? "application/x-subrip; charset=utf-8" : "text/vtt; charset=utf-8";
        if (!srt)
            fputs("WEBVTT\n\n", f);
        size_t i;
        json_t *seg;
        json_array_foreach(segments, i, seg)
        {
            /* One cue per segment, numbered from 1 in SubRip. */
            char a[32], b[32];
            clock_of(json_number_value(json_object_get(seg, "start")), srt ? ',' : '.', a,
                     sizeof(a));
            clock_of(json_number_value(json_object_get(seg, "end")), srt ? ',' : '.', b,
                     sizeof(b));
            json_t *jt = json_object_get(seg, "text");
            size_t n = json_string_length(jt);
            const char *t = trimmed(json_string_value(jt), &n);
            if (srt)
                fprintf(f, "%zu\n", i + 1);
            fprintf(f, "%s --> %s\n%.*s\n\n", a, b, (int)n, t);
        }
    }
    json_decref(segments);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

char *oa_audio_delta_event(const char *text, size_t len)
{
    return sse(dump(json_pack("{s:s, s:o}", "type", "transcript.text.delta", "delta",
                              text_json(text, len))));
}

char *oa_audio_done_event(const char *text, size_t len, const oa_usage *usage)
{
    return sse(dump(json_pack("{s:s, s:o, s:o}", "type", "transcript.text.done", "text",
                              text_json(text, len), "usage", audio_usage_json(usage))));
}
