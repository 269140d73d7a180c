/* Whisper's tokenizer, decoding (wtok.h).
 *
 * Every id's bytes are laid out once at load in one arena: a text token's
 * byte-level string mapped back to raw bytes, a special token's name, a
 * timestamp's "<|1.24|>".  Decoding is then a concatenation and one lossy
 * UTF-8 pass. */
#include "backends/whisper/wtok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "common/vec.h"

/* Whisper's 99 (large-v3: 100) languages, in token order from <|en|>.
 * Only the codes are needed; the tokens' names say the same. */
#define MAX_LANGS 128

struct wtok {
    int32_t n_vocab;
    char *arena;           /* every piece, back to back; owned */
    size_t arena_len;      /* bytes used */
    size_t arena_cap;      /* bytes allocated */
    size_t *off;           /* n_vocab offsets into arena; owned */
    uint32_t *len;         /* n_vocab lengths (bytes); owned */
    wtok_special sp;
    char lang[MAX_LANGS][8];  /* codes of lang_first + i, NUL-terminated */
};

/* GPT-2's byte-level alphabet, backwards: the byte each code point stands
 * for, -1 for none.  Printable bytes stand for themselves; the other 68
 * (controls, space, DEL, NBSP, soft hyphen) are moved to 256 and up, in
 * byte order, so the highest code point is 323. */
#define ALPHABET 324

static void make_alphabet(int16_t *cp_to_byte)
{
    for (int c = 0; c < ALPHABET; c++)
        cp_to_byte[c] = -1;
    int moved = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        cp_to_byte[keep ? b : 256 + moved++] = (int16_t)b;
    }
}

/* One code point of well-formed UTF-8 at *S (advanced past it). */
static uint32_t next_cp(const unsigned char **s)
{
    const unsigned char *p = *s;
    uint32_t cp;
    int n;
    if (p[0] < 0x80) { cp = p[0]; n = 1; }
    else if (p[0] < 0xE0) { cp = p[0] & 0x1F; n = 2; }
    else if (p[0] < 0xF0) { cp = p[0] & 0x0F; n = 3; }
    else { cp = p[0] & 0x07; n = 4; }
    for (int i = 1; i < n; i++)
        cp = cp << 6 | (p[i] & 0x3F);
    *s = p + n;
    return cp;
}

static int set_piece(wtok *t, int32_t id, const char *bytes, size_t n)
{
    /* At least one byte, so that the arena exists (memcpy takes no NULL,
     * even for an empty piece). */
    if (BT_RESERVE_N(t->arena, t->arena_len, t->arena_cap, n + 1, 1 << 20))
        return BT_ENOMEM;
    if (n)
        memcpy(t->arena + t->arena_len, bytes, n);
    t->off[id] = t->arena_len;
    t->len[id] = (uint32_t)n;
    t->arena_len += n;
    return 0;
}

/* A text token's byte-level string to its bytes. */
static int set_text_piece(wtok *t, int32_t id, const char *s, const int16_t *alphabet,
                          char *err, size_t errlen, const char *path)
{
    size_t n = strlen(s);
    char buf[1024];
    size_t k = 0;
    if (!bt_utf8_valid(s, n))
        return bt_errorf(err, errlen, BT_EFORMAT, "%s: token %d is not UTF-8", path, id);
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        uint32_t cp = next_cp(&p);
        int b = cp < ALPHABET ? alphabet[cp] : -1;
        if (b < 0 || k == sizeof(buf))
            return bt_errorf(err, errlen, BT_EFORMAT,
                             "%s: token %d ('%.40s') is not a byte-level BPE token", path, id,
                             s);
        buf[k++] = (char)b;
    }
    return set_piece(t, id, buf, k);
}

/* The special token named NAME, or -1. */
static int32_t find_special(const json_t *added, const char *name)
{
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && strcmp(c, name) == 0)
            return (int32_t)json_integer_value(json_object_get(a, "id"));
    }
    return -1;
}

static int read_added(wtok *t, const json_t *added, const char *path, char *err,
                      size_t errlen)
{
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!c || !json_is_integer(json_object_get(a, "id")) || id < 0 || id >= t->n_vocab)
            return bt_errorf(err, errlen, BT_EFORMAT,
                             "%s: added_tokens[%zu] has no content or an id outside 0..%d",
                             path, i, t->n_vocab - 1);
        if (t->len[id] != UINT32_MAX && (size_t)t->len[id] == strlen(c) &&
            memcmp(t->arena + t->off[id], c, t->len[id]) == 0)
            continue;  /* a text token listed again */
        int rc = set_piece(t, (int32_t)id, c, strlen(c));
        if (rc)
            return rc;
    }
    wtok_special *sp = &t->sp;
    sp->eot = find_special(added, "<|endoftext|>");
    sp->sot = find_special(added, "<|startoftranscript|>");
    sp->translate = find_special(added, "<|translate|>");
    sp->transcribe = find_special(added, "<|transcribe|>");
    sp->sot_lm = find_special(added, "<|startoflm|>");
    sp->sot_prev = find_special(added, "<|startofprev|>");
    sp->no_speech = find_special(added, "<|nocaptions|>");
    if (sp->no_speech < 0)
        sp->no_speech = find_special(added, "<|nospeech|>");
    sp->no_timestamps = find_special(added, "<|notimestamps|>");
    if (sp->eot < 0 || sp->sot < 0 || sp->translate < 0 || sp->transcribe < 0 ||
        sp->no_timestamps < 0)
        return bt_errorf(err, errlen, BT_EFORMAT,
                         "%s: not a Whisper tokenizer: it lacks <|endoftext|>, "
                         "<|startoftranscript|>, <|translate|>, <|transcribe|> or "
                         "<|notimestamps|>", path);
    sp->timestamp_begin = sp->no_timestamps + 1;
    /* The languages sit between <|startoftranscript|> and <|translate|>. */
    sp->lang_first = sp->sot + 1;
    sp->lang_count = sp->translate - sp->lang_first;
    if (sp->lang_count < 0 || sp->lang_count > MAX_LANGS)
        return bt_errorf(err, errlen, BT_EFORMAT,
                         "%s: %d tokens between <|startoftranscript|> and <|translate|>, not "
                         "0 to %d languages", path, sp->lang_count, MAX_LANGS);
    for (int32_t l = 0; l < sp->lang_count; l++) {
        size_t n;
        const char *p = wtok_piece(t, sp->lang_first + l, &n);
        if (!p || n < 5 || n - 4 >= sizeof(t->lang[0]) || memcmp(p, "<|", 2) ||
            memcmp(p + n - 2, "|>", 2))
            return bt_errorf(err, errlen, BT_EFORMAT,
                             "%s: token %d, between <|startoftranscript|> and <|translate|>, "
                             "is not a language", path, sp->lang_first + l);
        memcpy(t->lang[l], p + 2, n - 4);
        t->lang[l][n - 4] = '\0';
    }
    return 0;
}

int wtok_create(const char *path, int32_t n_vocab, wtok **out, char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (n_vocab <= 0)
        return bt_errorf(err, errlen, BT_EINVAL, "%s: a vocabulary of %d ids", path, n_vocab);
    int rc;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    wtok *t = calloc(1, sizeof(*t));
    if (!root && json_error_code(&jerr) == json_error_cannot_open_file) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: %s", path, jerr.text);
        goto err;
    }
    if (!root) {
        rc = bt_errorf(err, errlen, BT_EFORMAT, "%s: line %d, column %d: %s", path, jerr.line,
                       jerr.column, jerr.text);
        goto err;
    }
    if (!t || !(t->off = calloc((size_t)n_vocab, sizeof(*t->off))) ||
        !(t->len = malloc((size_t)n_vocab * sizeof(*t->len)))) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
        goto err;
    }
    t->n_vocab = n_vocab;
    memset(t->len, 0xff, (size_t)n_vocab * sizeof(*t->len));  /* UINT32_MAX: not set */
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") || !json_is_object(vocab) || !json_is_array(added)) {
        rc = bt_errorf(err, errlen, BT_EFORMAT,
                       "%s: not a BPE tokenizer.json (model.type, model.vocab, added_tokens)",
                       path);
        goto err;
    }
    int16_t alphabet[ALPHABET];
    make_alphabet(alphabet);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= n_vocab) {
            rc = bt_errorf(err, errlen, BT_EFORMAT, "%s: model.vocab['%.40s'] is not an id "
                           "from 0 to %d", path, key, n_vocab - 1);
            goto err;
        }
        if ((rc = set_text_piece(t, (int32_t)id, key, alphabet, err, errlen, path)))
            goto err;
    }
    if ((rc = read_added(t, added, path, err, errlen)))
        goto err;
    /* Timestamps fill the ids after <|notimestamps|>; every other id must
     * have been named. */
    for (int32_t id = t->sp.timestamp_begin; id < n_vocab; id++) {
        if (t->len[id] != UINT32_MAX)
            continue;
        char name[24];
        int n = snprintf(name, sizeof(name), "<|%.2f|>", (id - t->sp.timestamp_begin) * 0.02);
        if ((rc = set_piece(t, id, name, (size_t)n)))
            goto err;
    }
    for (int32_t id = 0; id < n_vocab; id++)
        if (t->len[id] == UINT32_MAX) {
            rc = bt_errorf(err, errlen, BT_EFORMAT, "%s: id %d of the model's %d has no token",
                           path, id, n_vocab);
            goto err;
        }
    json_decref(root);
    *out = t;
    return 0;
err:
    if (rc == BT_ENOMEM && err && errlen && !err[0])
        bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    json_decref(root);
    wtok_destroy(t);
    return rc;
}

void wtok_destroy(wtok *t)
{
    if (!t)
        return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t);
}

int32_t wtok_vocab_size(const wtok *t) { return t->n_vocab; }
const wtok_special *wtok_specials(const wtok *t) { return &t->sp; }

const char *wtok_piece(const wtok *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab || t->len[id] == UINT32_MAX)
        return NULL;
    *len = t->len[id];
    return t->arena + t->off[id];
}

int wtok_decode(const wtok *t, const int32_t *ids, size_t n, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return BT_ERANGE;
        if (ids[i] < t->sp.eot)
            raw_len += t->len[ids[i]];
    }
    char *raw = malloc(raw_len + 1);
    char *text = malloc(3 * raw_len + 1);
    if (!raw || !text) {
        free(raw);
        free(text);
        return BT_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < t->sp.eot) {
            memcpy(raw + k, t->arena + t->off[ids[i]], t->len[ids[i]]);
            k += t->len[ids[i]];
        }
    size_t m = bt_utf8_lossy(raw, k, text);
    text[m] = '\0';
    free(raw);
    *out = text;
    *len = m;
    return 0;
}

int32_t wtok_lang_id(const wtok *t, const char *code)
{
    for (int32_t l = 0; l < t->sp.lang_count; l++)
        if (strcmp(t->lang[l], code) == 0)
            return t->sp.lang_first + l;
    return -1;
}

const char *wtok_lang_code(const wtok *t, int32_t id)
{
    int32_t l = id - t->sp.lang_first;
    return l >= 0 && l < t->sp.lang_count ? t->lang[l] : NULL;
}

double wtok_timestamp(const wtok *t, int32_t id)
{
    if (id < t->sp.timestamp_begin || id >= t->n_vocab)
        return -1;
    return (id - t->sp.timestamp_begin) * 0.02;
}
