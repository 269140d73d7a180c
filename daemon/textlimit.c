/* Stop strings and max_tokens on a text stream (daemon/textlimit.h). */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "daemon/textlimit.h"

int tl_init(tl_limit *l, const char *const *stop, size_t n_stop, uint32_t max_tokens)
{
    memset(l, 0, sizeof(*l));
    if (n_stop > TL_MAX_STOP)
        return BT_EINVAL;
    for (size_t i = 0; i < n_stop; i++) {
        size_t n = stop[i] ? strlen(stop[i]) : 0;
        if (n == 0 || n > TL_MAX_STOP_BYTES)
            goto err_inval;
        if (!(l->stop[i] = strdup(stop[i]))) {
            tl_free(l);
            return BT_ENOMEM;
        }
        l->stop_len[i] = n;
        l->n_stop = i + 1;
    }
    l->max_tokens = max_tokens;
    return 0;
err_inval:
    tl_free(l);
    return BT_EINVAL;
}

void tl_free(tl_limit *l)
{
    for (size_t i = 0; i < l->n_stop; i++)
        free(l->stop[i]);
    free(l->buf);
    memset(l, 0, sizeof(*l));
}

/* The longest end of BUF[0, N) that is the start (not the whole) of a stop
 * string: those bytes wait, as the next value may complete it. */
static size_t holdback(const tl_limit *l, const uint8_t *buf, size_t n)
{
    size_t keep = 0;
    for (size_t i = 0; i < l->n_stop; i++) {
        size_t k = l->stop_len[i] - 1 < n ? l->stop_len[i] - 1 : n;
        for (; k > keep; k--)
            if (memcmp(buf + n - k, l->stop[i], k) == 0) {
                keep = k;
                break;
            }
    }
    return keep;
}

tl_end tl_feed(tl_limit *l, const uint8_t *p, size_t len, const uint8_t **out, size_t *out_len)
{
    *out = l->hold;
    *out_len = 0;
    if (l->end != TL_RUNNING || len == 0)
        return l->end;
    size_t n = l->held + len;
    if (n > l->cap) {
        uint8_t *b = realloc(l->buf, n);
        if (!b) {
            /* Out of memory: the text goes out unchecked rather than not
             * at all, and the stream is treated as ended by its cap. */
            l->end = TL_LENGTH;
            *out = p;
            *out_len = len;
            return l->end;
        }
        l->buf = b, l->cap = n;
    }
    memcpy(l->buf, l->hold, l->held);
    memcpy(l->buf + l->held, p, len);
    *out = l->buf;
    l->tokens++;
    /* The held bytes hold no whole stop string (it would have ended the
     * text before), and no stop string began in the bytes already sent
     * (they were not held): the first match in BUF is the first of all. */
    size_t cut = n;
    for (size_t i = 0; i < l->n_stop; i++) {
        const uint8_t *hit = memmem(l->buf, n, l->stop[i], l->stop_len[i]);
        if (hit && (size_t)(hit - l->buf) < cut)
            cut = (size_t)(hit - l->buf);
    }
    l->held = 0;
    if (cut < n) {
        l->end = TL_STOP;
        *out_len = cut;
        return l->end;
    }
    if (l->max_tokens && l->tokens >= l->max_tokens) {
        l->end = TL_LENGTH;
        *out_len = n;
        return l->end;
    }
    size_t keep = holdback(l, l->buf, n);
    memcpy(l->hold, l->buf + n - keep, keep);
    l->held = keep;
    *out_len = n - keep;
    return TL_RUNNING;
}

void tl_flush(tl_limit *l, const uint8_t **out, size_t *out_len)
{
    *out = l->hold;
    *out_len = l->end == TL_RUNNING ? l->held : 0;
    l->held = 0;
}
