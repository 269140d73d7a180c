/* The pre-tokenizers of backends/transformer/tokenizer.c: hand-written matchers for the
 * GPT-2 and Llama 3 split regexes, with the \p{N} splitting that SmolLM2
 * adds in front, and the UTF-8 decoding they share.
 *
 * A regex engine (PCRE2, Oniguruma) was the alternative; these patterns
 * are fixed, a matcher for each is a few dozen lines, and a library would
 * bring Unicode tables of its own version that could disagree with the
 * ones generated beside this file.  Each matcher returns the end of the
 * leftmost match at a position, trying the alternatives in the pattern's
 * order as a backtracking engine does; the lookahead (?!\S) is resolved
 * by the rule that a whitespace run followed by a non-space gives its last
 * character to the next pre-token. */
#include "backends/transformer/tokenizer_pre.h"

#include "backends/transformer/unicode_tables.h"

#define L_ TOK_UNI_LETTER
#define N_ TOK_UNI_NUMBER
#define S_ TOK_UNI_SPACE

uint32_t tok__utf8_next(const uint8_t *s, size_t len, size_t *n)
{
    uint32_t c = s[0];
    *n = 1;
    if (c < 0x80)
        return c;
    size_t need;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; min = 0x80; c &= 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; min = 0x800; c &= 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; min = 0x10000; c &= 0x07; }
    else return TOK_CP_INVALID;
    if (len < need)
        return TOK_CP_INVALID;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return TOK_CP_INVALID;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return TOK_CP_INVALID;
    *n = need;
    return c;
}

static unsigned cp_class(uint32_t c)
{
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            return L_;
        if (c >= '0' && c <= '9')
            return N_;
        return (c == ' ' || (c >= 0x09 && c <= 0x0D)) ? S_ : 0;
    }
    size_t lo = 0, hi = sizeof(tok_uni_ranges) / sizeof(tok_uni_ranges[0]);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c > tok_uni_ranges[mid].hi)
            lo = mid + 1;
        else if (c < tok_uni_ranges[mid].lo)
            hi = mid;
        else
            return tok_uni_ranges[mid].flags;
    }
    return 0;
}

/* The class of the character at S[P] (P < END) and its length in *N. */
static unsigned class_at(const uint8_t *s, size_t p, size_t end, size_t *n)
{
    return cp_class(tok__utf8_next(s + p, end - p, n));
}

/* The end of the run from P of characters whose class meets MASK (IN) or
 * misses it (!IN). */
static size_t span(const uint8_t *s, size_t p, size_t end, unsigned mask, bool in)
{
    while (p < end) {
        size_t n;
        if (((class_at(s, p, end, &n) & mask) != 0) != in)
            break;
        p += n;
    }
    return p;
}

size_t tok_utf8_complete(const char *buf, size_t len)
{
    const uint8_t *s = (const uint8_t *)buf;
    /* Finds the lead byte of the last character, at most three bytes back. */
    size_t i = len;
    while (i > 0 && len - i < 4 && (s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0 || (s[i - 1] & 0xC0) == 0x80)
        return len;  /* continuation bytes with no lead: never a character */
    uint8_t c = s[i - 1];
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3
                : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    return len - (i - 1) < need ? i - 1 : len;
}

/* ---- pre-tokenizers: each returns the end (> POS) of the match at POS ---- */

static size_t match_contraction(const uint8_t *s, size_t pos, size_t end, bool icase)
{
    if (s[pos] != '\'' || pos + 1 >= end)
        return 0;
    uint8_t a = s[pos + 1], b = pos + 2 < end ? s[pos + 2] : 0;
    if (icase) {
        a = (a >= 'A' && a <= 'Z') ? a + 32 : a;
        b = (b >= 'A' && b <= 'Z') ? b + 32 : b;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return pos + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return pos + 3;
    return 0;
}

/* `\s+(?!\S)|\s+` at POS, which is whitespace: a run followed by a
 * non-space gives up its last character to the next pre-token (so " word"
 * keeps its space), unless the run is that one character. */
static size_t match_space(const uint8_t *s, size_t pos, size_t end)
{
    size_t r = pos, last = pos;
    while (r < end) {
        size_t n;
        if (!(class_at(s, r, end, &n) & S_))
            break;
        last = r;
        r += n;
    }
    return (r == end || last == pos) ? r : last;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint8_t *s, size_t pos, size_t end)
{
    size_t m = match_contraction(s, pos, end, false), n;
    if (m)
        return m;
    size_t p = pos;
    unsigned c = class_at(s, p, end, &n);
    if (s[p] == ' ' && p + 1 < end) {
        size_t n1;
        unsigned c1 = class_at(s, p + 1, end, &n1);
        if (!(c1 & S_)) {
            p++;
            c = c1;
        }
    }
    if (c & L_)
        return span(s, p, end, L_, true);
    if (c & N_)
        return span(s, p, end, N_, true);
    if (!(c & S_))
        return span(s, p, end, L_ | N_ | S_, false);
    return match_space(s, pos, end);
}

/* Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 * ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const uint8_t *s, size_t pos, size_t end)
{
    size_t m = match_contraction(s, pos, end, true), n, n1 = 0;
    if (m)
        return m;
    unsigned c = class_at(s, pos, end, &n);
    unsigned c1 = pos + n < end ? class_at(s, pos + n, end, &n1) : 0;
    if (c & L_)
        return span(s, pos, end, L_, true);
    if (!(c & N_) && s[pos] != '\r' && s[pos] != '\n' && (c1 & L_))
        return span(s, pos + n, end, L_, true);
    if (c & N_) {
        size_t p = pos + n;
        for (int k = 1; k < 3 && p < end && (class_at(s, p, end, &n) & N_); k++)
            p += n;
        return p;
    }
    size_t p = pos;
    if (s[pos] == ' ' && pos + 1 < end && !(c1 & (L_ | N_ | S_)))
        p++;
    if (!(class_at(s, p, end, &n) & (L_ | N_ | S_))) {
        p = span(s, p, end, L_ | N_ | S_, false);
        while (p < end && (s[p] == '\r' || s[p] == '\n'))
            p++;
        return p;
    }
    /* Whitespace: up to the last newline of the run, else as GPT-2. */
    size_t r = span(s, pos, end, S_, true), nl = 0;
    for (size_t i = pos; i < r; i++)
        if (s[i] == '\r' || s[i] == '\n')
            nl = i + 1;
    return nl ? nl : match_space(s, pos, end);
}

void tok__pretok_init(tok_pretok *it, int pre, const uint8_t *s, size_t n)
{
    *it = (tok_pretok){s, n, 0, 0, pre};
}

bool tok__pretok_next(tok_pretok *it, size_t *start, size_t *len)
{
    const uint8_t *s = it->s;
    size_t pos = it->pos, q, cn;
    if (pos >= it->n)
        return false;
    if (it->pre != TOK_PRE_DIGITS_GPT2) {
        q = it->pre == TOK_PRE_LLAMA3 ? match_llama3(s, pos, it->n) : match_gpt2(s, pos, it->n);
    } else if (pos < it->seg_end) {
        q = match_gpt2(s, pos, it->seg_end);
    } else if (class_at(s, pos, it->n, &cn) & N_) {
        /* Every \p{N} character is a pre-token of its own (HF Digits,
         * which tests char::is_numeric); the regex runs on the segments
         * between them, each ending as if the text ended there. */
        q = pos + cn;
    } else {
        it->seg_end = span(s, pos, it->n, N_, false);
        q = match_gpt2(s, pos, it->seg_end);
    }
    *start = pos;
    *len = q - pos;
    it->pos = q;
    return true;
}
