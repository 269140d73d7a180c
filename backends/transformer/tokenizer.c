/* Byte-level BPE from the GGUF tokenizer.* keys, and the ChatML prompt
 * (tokenizer.h says what is supported and why).
 *
 * Merges are applied over token ids rather than strings: at create every
 * merge "A B" is resolved to (id A, id B) -> (rank, id AB) in one hash
 * table, so encoding a word never builds or hashes a string.  Each word's
 * symbols sit in a linked list and candidate pairs in a binary heap keyed
 * by (rank, position), which keeps a pathological word (ten thousand
 * spaces, which the regex keeps as one pre-token) at O(n log n) where the
 * simpler repeated scan for the lowest rank would be quadratic. */
#include "backends/transformer/tokenizer.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/transformer/tokenizer_pre.h"
#include "common/vec.h"

/* Token types as llama.cpp writes them in tokenizer.ggml.token_type. */
enum {
    TYPE_NORMAL = 1,
    TYPE_UNKNOWN = 2,
    TYPE_CONTROL = 3,
    TYPE_USER = 4,
    TYPE_UNUSED = 5,
    TYPE_BYTE = 6
};
#define ATTR_TYPE_MASK 0x0fu
#define ATTR_EOG 0x80u

typedef struct merge_slot {
    uint64_t key;  /* left id << 32 | right id; UINT64_MAX when empty */
    int32_t rank;  /* index in tokenizer.ggml.merges: lower merges first */
    int32_t id;    /* the merged token */
} merge_slot;

struct tok_vocab {
    int32_t n_tokens;
    char *text;            /* the token strings of the GGUF back to back; owned */
    uint32_t *text_off;    /* n_tokens + 1 byte offsets into text; owned */
    char *piece;           /* the decoded bytes of every token back to back; owned */
    uint32_t *piece_off;   /* n_tokens + 1 byte offsets into piece; owned */
    uint8_t *attr;         /* per token: its TYPE_* | ATTR_EOG; owned */
    int32_t *str_slots;    /* token string -> id + 1 (0 empty), open addressing; owned */
    size_t str_mask;       /* slots - 1 (a power of two less one) */
    merge_slot *merges;    /* (left, right) -> merge, open addressing; owned */
    size_t merge_mask;     /* slots - 1 */
    int32_t byte_id[256];  /* the token of each lone byte, -1 when the vocab lacks it */
    uint16_t byte_cp[256]; /* the code point that spells each byte in token text */
    int32_t *specials;     /* tokens matched literally: by first byte, longest first; owned */
    int32_t spec_lo[256];  /* specials[spec_lo[b] .. spec_hi[b]) start with byte b */
    int32_t spec_hi[256];
    int pre;               /* TOK_PRE_* */
    bool ignore_merges;    /* a pre-token that is a token is that token, merges or not */
    int32_t bos, eos;      /* ids or -1 */
    char *tmpl;            /* tokenizer.chat_template, NUL-terminated; owned, may be NULL */
    char *default_system;  /* the template's own system text; owned, may be NULL */
};

/* ---- BPE ---- */

typedef struct bpe_sym {
    int32_t id;          /* -1 once merged into its left neighbour (or never a token) */
    int32_t prev, next;  /* neighbours' indices, -1 at the ends */
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank;
    int32_t left, right;    /* symbol indices */
    int32_t lid, rid, id;   /* the ids it was made from (stale once they change), and the merge */
} bpe_pair;

/* Per-call working memory, grown to the longest word. */
typedef struct bpe_work {
    bpe_sym *sym;
    bpe_pair *heap;
    size_t cap_sym, cap_heap;  /* a word of N symbols needs N and 3 * N pairs */
    char *spell;    /* ignore_merges: the word in token text, 2 bytes a byte at most */
    size_t cap_spell;          /* bytes */
} bpe_work;

/* The ids written by tok_encode: the first CAP stored, all counted. */
typedef struct id_out {
    int32_t *ids;
    size_t cap;
    size_t n;
} id_out;

static void out_push(id_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;  /* FNV-1a, then mixed for the low bits */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return mix64(h);
}

static const merge_slot *merge_find(const tok_vocab *v, int32_t a, int32_t b)
{
    if (a < 0 || b < 0)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = mix64(key) & v->merge_mask;; i = (i + 1) & v->merge_mask) {
        const merge_slot *m = &v->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

static int32_t token_find(const tok_vocab *v, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & v->str_mask;; i = (i + 1) & v->str_mask) {
        int32_t id = v->str_slots[i] - 1;
        if (id < 0)
            return -1;
        if (v->text_off[id + 1] - v->text_off[id] == n && !memcmp(v->text + v->text_off[id], s, n))
            return id;
    }
}

static bool pair_less(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_pair *h, size_t *n, bpe_pair p)
{
    size_t i = (*n)++;
    while (i > 0 && pair_less(&p, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = p;
}

static bpe_pair heap_pop(bpe_pair *h, size_t *n)
{
    bpe_pair top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pair_less(&h[c + 1], &h[c]))
            c++;
        if (!pair_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void pair_try(const tok_vocab *v, bpe_work *w, size_t *nh, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    const merge_slot *m = merge_find(v, w->sym[left].id, w->sym[right].id);
    if (m)
        heap_push(w->heap, nh, (bpe_pair){m->rank, left, right, w->sym[left].id,
                                          w->sym[right].id, m->id});
}

/* Sets *ID to the token spelled like the whole word S[0..N) in the byte
 * alphabet, or -1 when there is none; 0 or BT_ENOMEM. */
static int whole_word_token(const tok_vocab *v, bpe_work *w, const uint8_t *s, size_t n,
                            int32_t *id)
{
    if (n > SIZE_MAX / 2 || BT_RESERVE_N(w->spell, 0, w->cap_spell, 2 * n, 64))
        return BT_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t c = v->byte_cp[s[i]];
        if (c < 0x80) {
            w->spell[k++] = (char)c;
        } else {
            w->spell[k++] = (char)(0xC0 | c >> 6);
            w->spell[k++] = (char)(0x80 | (c & 0x3F));
        }
    }
    *id = token_find(v, w->spell, k);
    return 0;
}

/* Encodes one pre-token, S[0..N), into O. */
static int bpe_word(const tok_vocab *v, bpe_work *w, const uint8_t *s, size_t n, id_out *o)
{
    if (n == 1) {
        if (v->byte_id[s[0]] >= 0)
            out_push(o, v->byte_id[s[0]]);
        return 0;
    }
    if (v->ignore_merges) {
        /* Llama 3's tokenizer.json sets ignore_merges, and llama.cpp does
         * the same for its pre-tokenizer: a word that is a token is taken
         * whole, even where no sequence of merges would build it. */
        int32_t id;
        int rc = whole_word_token(v, w, s, n, &id);
        if (rc)
            return rc;
        if (id >= 0) {
            out_push(o, id);
            return 0;
        }
    }
    /* Symbol indices are int32_t, and the heap holds 3 * N pairs. */
    if (n > INT32_MAX / 3)
        return BT_ERANGE;
    if (BT_RESERVE_N(w->sym, 0, w->cap_sym, n, 32) ||
        BT_RESERVE_N(w->heap, 0, w->cap_heap, 3 * n, 96))
        return BT_ENOMEM;
    /* A byte without a token stays in the word as a symbol of id -1: no
     * merge has it on either side, so it is a barrier its neighbours do not
     * merge across, and it is dropped only when the ids are written out.
     * llama.cpp does exactly this (the reference: "}\x04," is "}" ","
     * there).  Hugging Face `tokenizers` instead leaves such a byte out of
     * the word before merging, so its neighbours may merge ("}," as one
     * token); scripts/gen-tokenizer-vectors.py records both. */
    for (size_t i = 0; i < n; i++)
        w->sym[i] = (bpe_sym){v->byte_id[s[i]], (int32_t)i - 1, (int32_t)i + 1};
    w->sym[n - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++)
        pair_try(v, w, &nh, (int32_t)i, (int32_t)i + 1);
    while (nh) {
        bpe_pair p = heap_pop(w->heap, &nh);
        bpe_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        if (l->id != p.lid || r->id != p.rid || l->next != p.right)
            continue;  /* a neighbour has merged since this pair was pushed */
        l->id = p.id;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = p.left;
        r->id = -1;
        pair_try(v, w, &nh, l->prev, p.left);
        pair_try(v, w, &nh, p.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        if (w->sym[i].id >= 0)
            out_push(o, w->sym[i].id);
    return 0;
}

/* Pre-tokenizes S[0..N), which holds no special token, and encodes each
 * pre-token. */
static int encode_plain(const tok_vocab *v, bpe_work *w, const uint8_t *s, size_t n, id_out *o)
{
    tok_pretok it;
    size_t start, len;
    tok__pretok_init(&it, v->pre, s, n);
    while (tok__pretok_next(&it, &start, &len)) {
        int rc = bpe_word(v, w, s + start, len, o);
        if (rc)
            return rc;
    }
    return 0;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, bool parse_special,
               int32_t *ids, size_t cap)
{
    if (!v || (!text && len) || (!ids && cap))
        return BT_EINVAL;
    if (!len)
        return 0;
    const uint8_t *s = (const uint8_t *)text;
    id_out o = {ids, cap, 0};
    bpe_work w = {0};
    int rc = 0;
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int32_t hit = -1;
        size_t hl = 0;
        for (int32_t k = v->spec_lo[s[i]]; k < v->spec_hi[s[i]]; k++) {
            int32_t id = v->specials[k];
            size_t tl = v->text_off[id + 1] - v->text_off[id];
            if (!parse_special && (v->attr[id] & ATTR_TYPE_MASK) != TYPE_USER)
                continue;
            if (tl <= len - i && !memcmp(s + i, v->text + v->text_off[id], tl)) {
                hit = id;
                hl = tl;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        if ((rc = encode_plain(v, &w, s + start, i - start, &o)))
            goto out;
        out_push(&o, hit);
        i += hl;
        start = i;
    }
    rc = encode_plain(v, &w, s + start, len - start, &o);
out:
    free(w.sym);
    free(w.heap);
    free(w.spell);
    if (rc)
        return rc;
    return o.n > INT_MAX ? BT_ERANGE : (int)o.n;
}

int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap)
{
    if (!v || (!buf && cap))
        return BT_EINVAL;
    if (id < 0 || id >= v->n_tokens)
        return BT_ERANGE;
    size_t n = v->piece_off[id + 1] - v->piece_off[id];
    if (cap)
        memcpy(buf, v->piece + v->piece_off[id], n < cap ? n : cap);
    return (int)n;
}

int tok_vocab_size(const tok_vocab *v) { return v ? v->n_tokens : 0; }
int32_t tok_bos(const tok_vocab *v) { return v ? v->bos : -1; }
int32_t tok_eos(const tok_vocab *v) { return v ? v->eos : -1; }

bool tok_is_eog(const tok_vocab *v, int32_t id)
{
    return v && id >= 0 && id < v->n_tokens && (v->attr[id] & ATTR_EOG);
}

/* ---- chat template ---- */

static const char IM_START[] = "<|im_start|>";
static const char IM_END[] = "<|im_end|>";

/* Finds the system text the template writes when the conversation has no
 * system turn: a literal "<|im_start|>system\n...<|im_end|>" in one string
 * of the template.  Occurrences whose text holds Jinja syntax (quotes,
 * braces, '+') build the turn from the messages and are skipped.  Rather
 * than evaluating Jinja, this recognises the one pattern that ChatML
 * templates (SmolLM2, Qwen2) use; NULL when there is none. */
static char *template_default_system(const char *t)
{
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(t, head); p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof(head) - 1;
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *e = strstr(q, IM_END);
        if (!e)
            break;
        if (memchr(q, '\'', e - q) || memchr(q, '"', e - q) || memchr(q, '{', e - q) ||
            memchr(q, '}', e - q) || memchr(q, '+', e - q) || memchr(q, '\\', e - q))
            continue;
        return strndup(q, e - q);
    }
    return NULL;
}

/* Whether ROLE[LEN] is a role a ChatML turn may have. */
static bool role_ok(const char *role, size_t len)
{
    static const char *const roles[] = {"system", "user", "assistant"};
    for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++)
        if (len == strlen(roles[k]) && memcmp(role, roles[k], len) == 0)
            return true;
    return false;
}

/* The pieces of a rendered conversation, in order, each with whether the
 * tokenizer may parse special tokens in it: the template's markers and its
 * default system text may, the turns' texts never.  FN is called once per
 * non-empty piece; its first nonzero result stops the walk and is returned. */
typedef int (*piece_fn)(void *arg, const char *s, size_t len, bool special);

static int conv_walk(const tok_vocab *v, const tok_turn *turns, size_t n, piece_fn fn, void *arg)
{
    static const char nl_end[] = "<|im_end|>\n", gen[] = "<|im_start|>assistant\n";
    static const char sys_head[] = "<|im_start|>system\n";
    if (!v || !turns || !n)
        return BT_EINVAL;
    if (!v->tmpl || !strstr(v->tmpl, IM_START))
        return BT_ENOTEMPLATE;
    for (size_t i = 0; i < n; i++)
        if (!turns[i].role || !role_ok(turns[i].role, turns[i].role_len) ||
            (!turns[i].text && turns[i].len))
            return BT_EINVAL;
    int rc = 0;
    bool sys_first = turns[0].role_len == 6 && memcmp(turns[0].role, "system", 6) == 0;
    if (!sys_first && v->default_system) {
        const char *d = v->default_system;
        if ((rc = fn(arg, sys_head, sizeof(sys_head) - 1, true)) ||
            (rc = fn(arg, d, strlen(d), true)) ||
            (rc = fn(arg, nl_end, sizeof(nl_end) - 1, true)))
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        const tok_turn *t = &turns[i];
        if ((rc = fn(arg, IM_START, sizeof(IM_START) - 1, true)) ||
            (rc = fn(arg, t->role, t->role_len, true)) || (rc = fn(arg, "\n", 1, true)) ||
            (t->len && (rc = fn(arg, t->text, t->len, false))) ||
            (rc = fn(arg, nl_end, sizeof(nl_end) - 1, true)))
            return rc;
    }
    return fn(arg, gen, sizeof(gen) - 1, true);
}

/* The rendered string, grown piece by piece. */
typedef struct render_buf {
    char *s;
    size_t len, cap;
} render_buf;

static int render_piece(void *arg, const char *s, size_t len, bool special)
{
    (void)special;
    render_buf *b = arg;
    if (len > INT_MAX - b->len)
        return BT_ERANGE;
    if (BT_RESERVE_N(b->s, b->len, b->cap, len + 1, 256))
        return BT_ENOMEM;
    memcpy(b->s + b->len, s, len);
    b->len += len;
    b->s[b->len] = '\0';
    return 0;
}

int tok_conv_render(const tok_vocab *v, const tok_turn *turns, size_t n, char **out)
{
    if (!out)
        return BT_EINVAL;
    *out = NULL;
    render_buf b = {NULL, 0, 0};
    int rc = conv_walk(v, turns, n, render_piece, &b);
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return (int)b.len;
}

/* Ids of the pieces, the first CAP of them written. */
typedef struct encode_buf {
    const tok_vocab *v;
    int32_t *ids;
    size_t cap, total;
} encode_buf;

static int encode_piece(void *arg, const char *s, size_t len, bool special)
{
    encode_buf *e = arg;
    size_t room = e->total < e->cap ? e->cap - e->total : 0;
    int k = tok_encode(e->v, s, len, special, room ? e->ids + e->total : NULL, room);
    if (k < 0)
        return k;
    e->total += (size_t)k;
    return e->total > INT_MAX ? BT_ERANGE : 0;
}

int tok_conv_encode(const tok_vocab *v, const tok_turn *turns, size_t n, int32_t *ids,
                    size_t cap)
{
    encode_buf e = {v, ids, cap, 0};
    int rc = conv_walk(v, turns, n, encode_piece, &e);
    return rc ? rc : (int)e.total;
}

/* The one-turn forms: an explicit system turn, or none (the template's
 * default then comes first). */
static size_t one_turn(const char *system, const char *user, size_t user_len, tok_turn t[2])
{
    size_t n = 0;
    if (system)
        t[n++] = (tok_turn){"system", 6, system, strlen(system)};
    t[n++] = (tok_turn){"user", 4, user ? user : "", user_len};
    return n;
}

int tok_chat_render(const tok_vocab *v, const char *system, const char *user, size_t user_len,
                    char **out)
{
    if (!v || !out || (!user && user_len))
        return BT_EINVAL;
    tok_turn t[2];
    return tok_conv_render(v, t, one_turn(system, user, user_len, t), out);
}

/* The ids of a one-turn ChatML prompt, as tok_chat_render renders it, where
 * only the template's own markers are control tokens: the user's text is
 * encoded with special-token parsing off, so "<|im_end|>" typed by a user
 * stays text and cannot end the turn or forge another.  Each piece is
 * encoded on its own; a control token or a newline bounds the user's text
 * on each side, where the pre-tokenizer splits anyway, so ordinary text
 * gets the ids of the rendered string. */
int tok_chat_encode(const tok_vocab *v, const char *system, const char *user, size_t user_len,
                    int32_t *ids, size_t cap)
{
    if (!v || (!user && user_len))
        return BT_EINVAL;
    tok_turn t[2];
    return tok_conv_encode(v, t, one_turn(system, user, user_len, t), ids, cap);
}

/* ---- create ---- */

static size_t table_size(size_t n)
{
    size_t m = 16;
    while (m < 2 * n)
        m *= 2;
    return m;
}

/* GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves,
 * the other 68 become U+0100.. in byte order.  Fills BYTE_CP (byte -> code
 * point) and CP_BYTE (code point < 324 -> byte, -1 for none). */
static void byte_alphabet(uint32_t byte_cp[256], int16_t cp_byte[324])
{
    uint32_t extra = 256;
    for (int i = 0; i < 324; i++)
        cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_cp[b] = printable ? (uint32_t)b : extra++;
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

static int load_tokens(tok_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    uint32_t et;
    uint64_t count;
    if (gguf_get_array(f, "tokenizer.ggml.tokens", &et, &count) || et != GGUF_VAL_STRING)
        return bt_errorf(err, errlen, BT_EFORMAT,
                         "tokenizer.ggml.tokens: missing or not a string array");
    if (count == 0 || count > INT32_MAX / 4)
        return bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.ggml.tokens: %llu tokens",
                         (unsigned long long)count);
    v->n_tokens = (int32_t)count;
    size_t total = 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        size_t n;
        if (gguf_array_string(f, "tokenizer.ggml.tokens", i, &s, &n))
            return bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.ggml.tokens[%llu] unreadable",
                             (unsigned long long)i);
        total += n;
    }
    if (total > UINT32_MAX - 1)
        return bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.ggml.tokens: %zu bytes of text",
                         total);
    v->text = malloc(total + 1);
    v->piece = malloc(total + 1);
    v->text_off = malloc((count + 1) * sizeof(uint32_t));
    v->piece_off = malloc((count + 1) * sizeof(uint32_t));
    v->attr = malloc(count);
    v->str_mask = table_size(count) - 1;
    v->str_slots = calloc(v->str_mask + 1, sizeof(int32_t));
    if (!v->text || !v->piece || !v->text_off || !v->piece_off || !v->attr || !v->str_slots)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory for %llu tokens",
                         (unsigned long long)count);
    uint32_t off = 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *s;
        size_t n;
        gguf_array_string(f, "tokenizer.ggml.tokens", i, &s, &n);
        memcpy(v->text + off, s, n);
        v->text_off[i] = off;
        off += (uint32_t)n;
        v->text_off[i + 1] = off;
        if (token_find(v, s, n) >= 0)
            continue;  /* a duplicate spelling: the lowest id keeps it */
        size_t j = hash_bytes(s, n) & v->str_mask;
        while (v->str_slots[j])
            j = (j + 1) & v->str_mask;
        v->str_slots[j] = (int32_t)i + 1;
    }
    uint32_t tt;
    uint64_t tcount;
    bool have_types = !gguf_get_array(f, "tokenizer.ggml.token_type", &tt, &tcount);
    if (have_types && tcount != count)
        return bt_errorf(err, errlen, BT_EFORMAT,
                         "tokenizer.ggml.token_type has %llu entries for %llu tokens",
                         (unsigned long long)tcount, (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++) {
        int64_t t = TYPE_NORMAL;
        if (have_types && gguf_array_i64(f, "tokenizer.ggml.token_type", i, &t))
            return bt_errorf(err, errlen, BT_EFORMAT,
                             "tokenizer.ggml.token_type is not an integer array");
        v->attr[i] = (t >= TYPE_NORMAL && t <= TYPE_BYTE) ? (uint8_t)t : TYPE_NORMAL;
    }
    return 0;
}

/* Decodes every token's text into the bytes it stands for (tok_piece). */
static void build_pieces(tok_vocab *v)
{
    uint32_t byte_cp[256];
    int16_t cp_byte[324];
    byte_alphabet(byte_cp, cp_byte);
    uint32_t off = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        const uint8_t *s = (const uint8_t *)v->text + v->text_off[id];
        size_t n = v->text_off[id + 1] - v->text_off[id];
        unsigned type = v->attr[id] & ATTR_TYPE_MASK;
        v->piece_off[id] = off;
        for (size_t i = 0, cn; i < n; i += cn) {
            uint32_t c = tok__utf8_next(s + i, n - i, &cn);
            if (type != TYPE_CONTROL && type != TYPE_USER && c < 324 && cp_byte[c] >= 0)
                v->piece[off++] = (char)cp_byte[c];
            else {
                memcpy(v->piece + off, s + i, cn);
                off += (uint32_t)cn;
            }
        }
    }
    v->piece_off[v->n_tokens] = off;
    for (int b = 0; b < 256; b++) {
        v->byte_cp[b] = (uint16_t)byte_cp[b];
        char u[2] = {(char)byte_cp[b], 0};
        size_t n = 1;
        if (byte_cp[b] >= 0x80) {
            u[0] = (char)(0xC0 | byte_cp[b] >> 6);
            u[1] = (char)(0x80 | (byte_cp[b] & 0x3F));
            n = 2;
        }
        v->byte_id[b] = token_find(v, u, n);
    }
}

static int load_merges(tok_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    static const char key[] = "tokenizer.ggml.merges";
    uint32_t et;
    uint64_t count;
    if (gguf_get_array(f, key, &et, &count) || et != GGUF_VAL_STRING)
        return bt_errorf(err, errlen, BT_EFORMAT, "%s: missing or not a string array", key);
    if (count > INT32_MAX / 4)
        return bt_errorf(err, errlen, BT_EFORMAT, "%s: %llu merges", key,
                         (unsigned long long)count);
    v->merge_mask = table_size(count) - 1;
    v->merges = malloc((v->merge_mask + 1) * sizeof(*v->merges));
    if (!v->merges)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory for %llu merges",
                         (unsigned long long)count);
    for (size_t i = 0; i <= v->merge_mask; i++)
        v->merges[i] = (merge_slot){UINT64_MAX, 0, 0};
    char *buf = NULL;  /* A and B joined, to look up AB */
    size_t bufcap = 0;
    int rc = 0;
    for (uint64_t i = 0; i < count; i++) {
        const char *s, *sp = NULL;
        size_t n;
        if (gguf_array_string(f, key, i, &s, &n)) {
            rc = bt_errorf(err, errlen, BT_EFORMAT, "%s[%llu] unreadable", key,
                           (unsigned long long)i);
            goto out;
        }
        /* The separator is the first space after the first byte, as in
         * llama.cpp: byte-level tokens spell a space as U+0120. */
        if (n < 3 || !(sp = memchr(s + 1, ' ', n - 1))) {
            rc = bt_errorf(err, errlen, BT_EFORMAT, "%s[%llu] is not \"A B\"", key,
                           (unsigned long long)i);
            goto out;
        }
        size_t la = sp - s, lb = n - la - 1;
        if (BT_RESERVE_N(buf, 0, bufcap, la + lb, 64)) {
            rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
            goto out;
        }
        memcpy(buf, s, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t a = token_find(v, s, la), b = token_find(v, sp + 1, lb);
        int32_t ab = token_find(v, buf, la + lb);
        if (a < 0 || b < 0 || ab < 0)
            continue;  /* a merge into or from no token can never apply */
        uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        size_t j = mix64(k) & v->merge_mask;
        while (v->merges[j].key != UINT64_MAX && v->merges[j].key != k)
            j = (j + 1) & v->merge_mask;
        if (v->merges[j].key == UINT64_MAX)  /* a repeated pair keeps its lowest rank */
            v->merges[j] = (merge_slot){k, (int32_t)i, ab};
    }
out:
    free(buf);
    return rc;
}

typedef struct spec_sort {
    uint8_t first;
    uint32_t len;
    int32_t id;
} spec_sort;

static int spec_cmp(const void *pa, const void *pb)
{
    const spec_sort *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Whether ID is matched literally in text: a control, user-defined or
 * unknown token with a spelling (as llama.cpp partitions text). */
static bool is_special(const tok_vocab *v, int32_t id)
{
    unsigned t = v->attr[id] & ATTR_TYPE_MASK;
    return (t == TYPE_CONTROL || t == TYPE_USER || t == TYPE_UNKNOWN) &&
           v->text_off[id + 1] > v->text_off[id];
}

/* Collects the tokens matched literally in text, and marks the ones that
 * end generation. */
static int build_specials(tok_vocab *v)
{
    static const char *const eog_text[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                           "<|eom_id|>", "<|end|>", "<end_of_turn>", "</s>"};
    int32_t n = 0;
    for (int32_t id = 0; id < v->n_tokens; id++)
        n += is_special(v, id);
    spec_sort *tmp = malloc((n ? n : 1) * sizeof(*tmp));
    v->specials = malloc((n ? n : 1) * sizeof(int32_t));
    if (!tmp || !v->specials) {
        free(tmp);
        return BT_ENOMEM;
    }
    n = 0;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        uint32_t len = v->text_off[id + 1] - v->text_off[id];
        if (!is_special(v, id))
            continue;
        tmp[n++] = (spec_sort){(uint8_t)v->text[v->text_off[id]], len, id};
        for (size_t k = 0; k < sizeof(eog_text) / sizeof(eog_text[0]); k++)
            if (len == strlen(eog_text[k]) && !memcmp(v->text + v->text_off[id], eog_text[k], len))
                v->attr[id] |= ATTR_EOG;
    }
    qsort(tmp, n, sizeof(*tmp), spec_cmp);
    for (int b = 0; b < 256; b++)
        v->spec_lo[b] = v->spec_hi[b] = 0;
    for (int32_t i = 0; i < n; i++) {
        v->specials[i] = tmp[i].id;
        if (i == 0 || tmp[i].first != tmp[i - 1].first)
            v->spec_lo[tmp[i].first] = i;
        v->spec_hi[tmp[i].first] = i + 1;
    }
    free(tmp);
    return 0;
}

/* An optional token id key: -1 when absent, an error when out of range. */
static int opt_id(const gguf_file *f, const char *key, int32_t n_tokens, int32_t *id, char *err,
                  size_t errlen)
{
    uint32_t u;
    *id = -1;
    int rc = gguf_get_u32(f, key, &u);
    if (rc == BT_ENOENT)
        return 0;
    if (rc || u >= (uint32_t)n_tokens)
        return bt_errorf(err, errlen, BT_EFORMAT, "%s is not a token id below %d", key,
                         (int)n_tokens);
    *id = (int32_t)u;
    return 0;
}

int tok_vocab_create(const gguf_file *f, tok_vocab **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        return bt_errorf(err, errlen, BT_EINVAL, "NULL out");
    *out = NULL;
    if (!f)
        return bt_errorf(err, errlen, BT_EINVAL, "NULL GGUF file");
    const char *s;
    size_t n;
    if (gguf_get_str(f, "tokenizer.ggml.model", &s, &n))
        return bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.ggml.model: missing or not a string");
    if (n != 4 || memcmp(s, "gpt2", 4))
        return bt_errorf(err, errlen, BT_EUNSUPPORTED,
                         "tokenizer.ggml.model \"%.*s\" is not supported; only \"gpt2\" "
                         "(byte-level BPE) is",
                         (int)(n > 64 ? 64 : n), s);
    static const struct { const char *name; int pre; } pres[] = {
        {"smollm", TOK_PRE_DIGITS_GPT2}, {"starcoder", TOK_PRE_DIGITS_GPT2},
        {"refact", TOK_PRE_DIGITS_GPT2}, {"gpt2", TOK_PRE_GPT2}, {"gpt-2", TOK_PRE_GPT2},
        {"llama-bpe", TOK_PRE_LLAMA3}, {"llama3", TOK_PRE_LLAMA3},
    };
    int pre = TOK_PRE_GPT2;
    int rc = gguf_get_str(f, "tokenizer.ggml.pre", &s, &n);
    if (rc && rc != BT_ENOENT)
        return bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.ggml.pre is not a string");
    if (!rc) {
        pre = -1;
        for (size_t i = 0; i < sizeof(pres) / sizeof(pres[0]); i++)
            if (strlen(pres[i].name) == n && !memcmp(pres[i].name, s, n))
                pre = pres[i].pre;
        if (pre < 0)
            return bt_errorf(err, errlen, BT_EUNSUPPORTED,
                             "tokenizer.ggml.pre \"%.*s\" is not supported (smollm, starcoder, "
                             "refact, gpt2, gpt-2, llama-bpe and llama3 are)",
                             (int)(n > 64 ? 64 : n), s);
    }
    tok_vocab *v = calloc(1, sizeof(*v));
    if (!v)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    v->pre = pre;
    v->ignore_merges = pre == TOK_PRE_LLAMA3;
    if ((rc = load_tokens(v, f, err, errlen)))
        goto err;
    build_pieces(v);
    if ((rc = load_merges(v, f, err, errlen)))
        goto err;
    if ((rc = build_specials(v))) {
        bt_errorf(err, errlen, rc, "out of memory");
        goto err;
    }
    int32_t eot, eom;
    if ((rc = opt_id(f, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, err, errlen)) ||
        (rc = opt_id(f, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, err, errlen)) ||
        (rc = opt_id(f, "tokenizer.ggml.eot_token_id", v->n_tokens, &eot, err, errlen)) ||
        (rc = opt_id(f, "tokenizer.ggml.eom_token_id", v->n_tokens, &eom, err, errlen)))
        goto err;
    int32_t eogs[3] = {v->eos, eot, eom};
    for (int i = 0; i < 3; i++)
        if (eogs[i] >= 0)
            v->attr[eogs[i]] |= ATTR_EOG;
    rc = gguf_get_str(f, "tokenizer.chat_template", &s, &n);
    if (!rc) {
        /* A template with a NUL inside is cut there; Jinja text has none. */
        if (!(v->tmpl = strndup(s, n))) {
            rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
            goto err;
        }
        v->default_system = template_default_system(v->tmpl);
    } else if (rc != BT_ENOENT) {
        rc = bt_errorf(err, errlen, BT_EFORMAT, "tokenizer.chat_template is not a string");
        goto err;
    }
    *out = v;
    return 0;
err:
    tok_vocab_destroy(v);
    return rc;
}

void tok_vocab_destroy(tok_vocab *v)
{
    if (!v)
        return;
    free(v->default_system);
    free(v->tmpl);
    free(v->specials);
    free(v->merges);
    free(v->str_slots);
    free(v->attr);
    free(v->piece_off);
    free(v->piece);
    free(v->text_off);
    free(v->text);
    free(v);
}
