/* UTF-8 validation (common/utf8.h), by the table of well-formed byte
 * sequences in Unicode's chapter 3 (Table 3-7). */
#include "common/utf8.h"

#include <stdint.h>
#include <string.h>

/* The character at P (before END): its length in bytes when it is well
 * formed, else minus the length of its maximal invalid subpart (Unicode's
 * term: the longest prefix that could start a valid sequence, at least one
 * byte), which a lossy decoder replaces by one U+FFFD. */
static int char_at(const uint8_t *p, const uint8_t *end)
{
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    int more;
    uint8_t lo = 0x80, hi = 0xBF;  /* the range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        more = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0)
            lo = 0xA0;             /* overlong below U+0800 */
        else if (c == 0xED)
            hi = 0x9F;             /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0)
            lo = 0x90;             /* overlong below U+10000 */
        else if (c == 0xF4)
            hi = 0x8F;             /* past U+10FFFF */
    } else {
        return -1;                 /* a continuation byte, C0, C1 or F5..FF first */
    }
    if (end - p < 2 || p[1] < lo || p[1] > hi)
        return -1;
    for (int k = 2; k <= more; k++)
        if (end - p <= k || p[k] < 0x80 || p[k] > 0xBF)
            return -k;
    return more + 1;
}

bool bt_utf8_valid(const char *s, size_t len)
{
    const uint8_t *p = (const uint8_t *)s, *end = p + len;
    while (p < end) {
        int n = char_at(p, end);
        if (n < 0)
            return false;
        p += n;
    }
    return true;
}

size_t bt_utf8_lossy(const char *s, size_t len, char *out)
{
    const uint8_t *p = (const uint8_t *)s, *end = p + len;
    char *o = out;
    while (p < end) {
        int n = char_at(p, end);
        if (n > 0) {
            memcpy(o, p, (size_t)n);
            o += n;
            p += n;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            p += -n;
        }
    }
    return (size_t)(o - out);
}

size_t bt_utf8_cut(const char *s, size_t len)
{
    const uint8_t *p = (const uint8_t *)s;
    /* The start of the last character: back over at most three
     * continuation bytes. */
    size_t i = len;
    while (i > 0 && len - i < 4 && (p[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0)
        return len;
    uint8_t c = p[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    /* A lead byte whose character has fewer bytes here than it needs. */
    return c >= 0xC0 && len - (i - 1) < need ? i - 1 : len;
}

int bt_utf8_prefix(const char *s, size_t max)
{
    return (int)bt_utf8_cut(s, strnlen(s, max));
}
