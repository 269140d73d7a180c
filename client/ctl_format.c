/* How batonctl shows tensors and answers: readable text for people, one
 * JSON object per line for scripts (the format is in batonctl --help), and
 * the half-precision conversions both directions need. Kept apart from
 * main_batonctl.c, which parses the command line and talks to the daemon. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "client/ctl_format.h"

/* Tensors with at most this many elements are printed in full. */
#define SMALL_TENSOR 64
/* How many values a large tensor shows. */
#define PREVIEW_VALUES 8

/* IEEE binary16 with round-to-nearest-even, subnormals, inf and NaN. */
uint16_t ctl_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        unsigned shift = (unsigned)(14 - e);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent is the right answer (up to inf) */
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v = exp == 0    ? ldexpf((float)man, -24)
            : exp == 31 ? (man ? NAN : INFINITY)
                        : ldexpf((float)(man | 0x400), (int)exp - 25);
    return (h & 0x8000) ? -v : v;
}

uint16_t ctl_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40); /* keep NaN a NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Element I of T as text; JSON wants non-finite floats quoted. */
static void fmt_elem(char *buf, size_t cap, const baton_client_tensor *t, uint64_t i, bool json)
{
    const uint8_t *p = t->data + i * baton_client_dtype_size(t->dtype);
    double f;
    int32_t i32;
    int64_t i64;
    uint16_t h;
    switch (t->dtype) {
    case BATON_CLIENT_DTYPE_I32: memcpy(&i32, p, 4); snprintf(buf, cap, "%" PRId32, i32); return;
    case BATON_CLIENT_DTYPE_I64: memcpy(&i64, p, 8); snprintf(buf, cap, "%" PRId64, i64); return;
    case BATON_CLIENT_DTYPE_U8: snprintf(buf, cap, "%u", *p); return;
    case BATON_CLIENT_DTYPE_BOOL: snprintf(buf, cap, "%s", *p ? "true" : "false"); return;
    case BATON_CLIENT_DTYPE_F32: {
        float v;
        memcpy(&v, p, 4);
        f = v;
        break;
    }
    default:
        memcpy(&h, p, 2);
        f = t->dtype == BATON_CLIENT_DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        break;
    }
    if (isfinite(f))
        snprintf(buf, cap, "%.*g", t->dtype == BATON_CLIENT_DTYPE_F32 ? 9 : 5, f);
    else
        snprintf(buf, cap, json ? "\"%s\"" : "%s", isnan(f) ? "nan" : f > 0 ? "inf" : "-inf");
}

bool ctl_is_text(const baton_client_tensor *t)
{
    return t->dtype == BATON_CLIENT_DTYPE_U8 && !strcmp(t->modality, "text");
}

/* Length of the valid UTF-8 sequence at S (at most N bytes); 0 if invalid. */
static size_t utf8_len(const uint8_t *s, size_t n)
{
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3
               : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || len > n || (len == 2 && s[0] < 0xc2))
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xc0) != 0x80)
            return 0;
    return len;
}

/* Writes S as a JSON string; invalid UTF-8 becomes U+FFFD. Returns whether
 * the bytes were valid UTF-8. */
static bool json_string(FILE *out, const uint8_t *s, size_t n)
{
    bool valid = true;
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(s + i, n - i);
        if (!len) {
            fputs("\\ufffd", out);
            valid = false;
            i++;
        } else if (len > 1) {
            fwrite(s + i, 1, len, out);
            i += len;
        } else {
            uint8_t c = s[i++];
            if (c == '"' || c == '\\')
                fprintf(out, "\\%c", c);
            else if (c == '\n')
                fputs("\\n", out);
            else if (c == '\t')
                fputs("\\t", out);
            else if (c == '\r')
                fputs("\\r", out);
            else if (c < 0x20 || c == 0x7f)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
        }
    }
    fputc('"', out);
    return valid;
}

static void json_cstr(FILE *out, const char *s)
{
    json_string(out, (const uint8_t *)s, strlen(s));
}

static void json_tensor(FILE *out, const baton_client_tensor *t)
{
    char buf[64];
    fputs("{\"name\":", out);
    json_cstr(out, t->name);
    fprintf(out, ",\"dtype\":\"%s\",\"dims\":[", baton_client_dtype_name(t->dtype));
    for (size_t d = 0; d < t->ndims; d++)
        fprintf(out, "%s%" PRId64, d ? "," : "", t->dims[d]);
    fputs("],\"modality\":", out);
    json_cstr(out, t->modality);
    if (ctl_is_text(t)) {
        fputs(",\"text\":", out);
        if (json_string(out, t->data, t->nbytes)) {
            fputc('}', out);
            return;
        }
    }
    fputs(",\"values\":[", out);
    uint64_t n = baton_client_tensor_numel(t);
    for (uint64_t i = 0; i < n; i++) {
        fmt_elem(buf, sizeof buf, t, i, true);
        fprintf(out, "%s%s", i ? "," : "", buf);
    }
    fputs("]}", out);
}

/* Prints the elements of dimension D of a small tensor, nested in brackets. */
static void print_nested(FILE *out, const baton_client_tensor *t, size_t d, uint64_t *idx)
{
    char buf[64];
    if (d == t->ndims) {
        fmt_elem(buf, sizeof buf, t, (*idx)++, false);
        fputs(buf, out);
        return;
    }
    fputc('[', out);
    for (int64_t k = 0; k < t->dims[d]; k++) {
        if (k)
            fputs(", ", out);
        print_nested(out, t, d + 1, idx);
    }
    fputc(']', out);
}

void ctl_print_tensor(FILE *out, const baton_client_tensor *t)
{
    char buf[64];
    if (ctl_is_text(t)) {
        fprintf(out, "%s (text): ", t->name);
        fwrite(t->data, 1, t->nbytes, out);
        fputc('\n', out);
        return;
    }
    fprintf(out, "%s: %s[", t->name, baton_client_dtype_name(t->dtype));
    for (size_t d = 0; d < t->ndims; d++)
        fprintf(out, "%s%" PRId64, d ? "," : "", t->dims[d]);
    fputc(']', out);
    uint64_t n = baton_client_tensor_numel(t), idx = 0;
    if (n <= SMALL_TENSOR) {
        fputs(" = ", out);
        print_nested(out, t, 0, &idx);
    } else {
        fprintf(out, " (%" PRIu64 " values), first:", n);
        for (uint64_t i = 0; i < PREVIEW_VALUES; i++) {
            fmt_elem(buf, sizeof buf, t, i, false);
            fprintf(out, " %s", buf);
        }
        fputs(" ...", out);
    }
    fputc('\n', out);
}

void ctl_print_timings(const baton_client_event *ev)
{
    fprintf(stderr, "%-24s %5s %-12s %10s %10s\n", "node", "iter", "worker", "queue_us",
            "exec_us");
    for (size_t i = 0; i < ev->n_timings; i++) {
        const baton_client_timing *t = &ev->timings[i];
        fprintf(stderr, "%-24s %5u %-12s %10" PRIu64 " %10" PRIu64 "\n", t->node, t->iteration,
                t->worker, t->queue_us, t->exec_us);
    }
}

void ctl_print_json(FILE *out, const baton_client_event *ev)
{
    switch (ev->kind) {
    case BATON_CLIENT_EVENT_CHUNK:
        fputs("{\"type\":\"chunk\",\"request_id\":", out);
        json_cstr(out, ev->request_id);
        fprintf(out, ",\"seq\":%" PRIu64 ",\"value\":", ev->seq);
        json_tensor(out, &ev->value);
        break;
    case BATON_CLIENT_EVENT_RESPONSE:
        fputs("{\"type\":\"response\",\"request_id\":", out);
        json_cstr(out, ev->request_id);
        fprintf(out, ",\"status\":\"%s\",\"code\":%d,\"message\":",
                baton_client_code_name(ev->code), (int)ev->code);
        json_cstr(out, ev->message);
        fputs(",\"outputs\":[", out);
        for (size_t i = 0; i < ev->n_outputs; i++) {
            fputs(i ? "," : "", out);
            json_tensor(out, &ev->outputs[i]);
        }
        fputs("],\"timings\":[", out);
        for (size_t i = 0; i < ev->n_timings; i++) {
            const baton_client_timing *t = &ev->timings[i];
            fprintf(out, "%s{\"node\":", i ? "," : "");
            json_cstr(out, t->node);
            fprintf(out, ",\"iteration\":%u,\"worker\":", t->iteration);
            json_cstr(out, t->worker);
            fprintf(out, ",\"queue_us\":%" PRIu64 ",\"exec_us\":%" PRIu64 "}", t->queue_us,
                    t->exec_us);
        }
        fprintf(out, "],\"total_us\":%" PRIu64 ",\"seed\":%" PRIu64, ev->total_us, ev->seed);
        fprintf(out, ",\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,"
                "\"cached_tokens\":%u},\"loop_ends\":{",
                ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens);
        for (size_t i = 0; i < ev->n_loop_ends; i++) {
            fprintf(out, "%s", i ? "," : "");
            json_cstr(out, ev->loop_ends[i].loop);
            fprintf(out, ":\"%s\"", ev->loop_ends[i].how == BATON_CLIENT_LOOP_FINISH ? "finish"
                                     : ev->loop_ends[i].how == BATON_CLIENT_LOOP_MAX_ITERS
                                         ? "max_iters" : "unknown");
        }
        fprintf(out, "},\"finish_reason\":\"%s\"",
                ev->finish_reason == BATON_CLIENT_FINISH_STOP     ? "stop"
                : ev->finish_reason == BATON_CLIENT_FINISH_LENGTH ? "length"
                : ev->finish_reason == BATON_CLIENT_FINISH_NONE   ? "" : "unknown");
        break;
    case BATON_CLIENT_EVENT_CANCEL:
        fputs("{\"type\":\"cancel\",\"request_id\":", out);
        json_cstr(out, ev->request_id);
        fprintf(out, ",\"status\":\"%s\",\"code\":%d,\"message\":",
                baton_client_code_name(ev->code), (int)ev->code);
        json_cstr(out, ev->message);
        break;
    case BATON_CLIENT_EVENT_HEALTH:
        fprintf(out, "{\"type\":\"health\",\"live\":%s,\"ready\":%s,\"workers_ready\":[",
                ev->live ? "true" : "false", ev->ready ? "true" : "false");
        for (size_t i = 0; i < ev->n_workers_ready; i++) {
            fputs(i ? "," : "", out);
            json_cstr(out, ev->workers_ready[i]);
        }
        fputs("],\"message\":", out);
        json_cstr(out, ev->message);
        break;
    case BATON_CLIENT_EVENT_STATS:
    case BATON_CLIENT_EVENT_INSPECT:
        fprintf(out, "{\"type\":\"%s\",\"text\":",
                ev->kind == BATON_CLIENT_EVENT_STATS ? "stats" : "inspect");
        json_cstr(out, ev->text);
        break;
    }
    fputs("}\n", out);
    fflush(out);
}

void ctl_clock(double seconds, char *out, size_t len)
{
    long long ms = seconds > 0 ? (long long)(seconds * 1000.0 + 0.5) : 0;
    if (ms >= 3600000)
        snprintf(out, len, "%lld:%02lld:%02lld.%03lld", ms / 3600000, ms / 60000 % 60,
                 ms / 1000 % 60, ms % 1000);
    else
        snprintf(out, len, "%02lld:%02lld.%03lld", ms / 60000, ms / 1000 % 60, ms % 1000);
}
