/* Joins along dim 0 (chunks) and shard_dim (fan-in parts).  Shapes are
 * checked completely before a byte moves, so a mismatch never leaves a
 * half-written tensor behind. */
#include "worker/join.h"

#include <stdio.h>
#include <string.h>

#include "common/status.h"

static const char *dtype_name(baton_dtype t)
{
    static const char *const names[] = {"invalid", "F32", "F16", "BF16", "I32", "I64", "U8", "BOOL"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "invalid";
}

uint64_t wk_tensor_bytes(baton_dtype dtype, uint32_t ndim, const int64_t *dims)
{
    uint64_t n = baton_dtype_size(dtype);
    if (n == 0 || ndim > BATON_MAX_DIMS)
        return UINT64_MAX;
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] < 0)
            return UINT64_MAX;
        if (dims[i] && n > UINT64_MAX / (uint64_t)dims[i])
            return UINT64_MAX;
        n *= (uint64_t)dims[i];
    }
    return n;
}

int wk_join_is_trivial(const wk_jpart *parts, size_t n_parts)
{
    return n_parts == 1 && parts[0].n == 1;
}

/* The shape a chunk takes part in a join with: a scalar is [1]. */
static void joined_view(const wk_tview *c, uint32_t *ndim, int64_t *dims)
{
    if (c->ndim == 0) {
        *ndim = 1;
        dims[0] = 1;
        return;
    }
    *ndim = c->ndim;
    memcpy(dims, c->dims, sizeof(int64_t) * c->ndim);
}

static void fmt_dims(char *buf, size_t len, uint32_t ndim, const int64_t *dims)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (uint32_t i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Shape of part P (its chunks along dim 0) into *OUT. */
static int part_shape(const wk_jpart *p, size_t pi, wk_tview *out, char *err, size_t errlen)
{
    char a[96], b[96];
    *out = (wk_tview){0};
    for (size_t k = 0; k < p->n; k++) {
        const wk_tview *c = &p->chunks[k];
        uint32_t nd;
        int64_t d[BATON_MAX_DIMS];
        if (c->ndim > BATON_MAX_DIMS) {
            snprintf(err, errlen, "part %zu chunk %zu has %u dims (at most %d)", pi, k, c->ndim,
                     BATON_MAX_DIMS);
            return BT_EINVAL;
        }
        uint64_t want = wk_tensor_bytes(c->dtype, c->ndim, c->dims);
        if (want == UINT64_MAX || want != c->nbytes) {
            fmt_dims(a, sizeof(a), c->ndim, c->dims);
            snprintf(err, errlen, "part %zu chunk %zu: %s %s does not span %llu bytes", pi, k,
                     dtype_name(c->dtype), a, (unsigned long long)c->nbytes);
            return BT_EINVAL;
        }
        joined_view(c, &nd, d);
        if (k == 0) {
            out->dtype = c->dtype;
            out->ndim = nd;
            memcpy(out->dims, d, sizeof(int64_t) * nd);
            continue;
        }
        if (c->dtype != out->dtype) {
            snprintf(err, errlen, "part %zu: chunk %zu is %s, chunk 0 is %s", pi, k,
                     dtype_name(c->dtype), dtype_name(out->dtype));
            return BT_EINVAL;
        }
        if (nd != out->ndim || memcmp(d + 1, out->dims + 1, sizeof(int64_t) * (nd - 1)) != 0) {
            fmt_dims(a, sizeof(a), nd, d);
            fmt_dims(b, sizeof(b), out->ndim, out->dims);
            snprintf(err, errlen, "part %zu: chunk %zu has dims %s, which do not join along dim 0 "
                     "with %s", pi, k, a, b);
            return BT_EINVAL;
        }
        if (out->dims[0] > INT64_MAX - d[0]) {
            snprintf(err, errlen, "part %zu: joined dim 0 overflows", pi);
            return BT_EINVAL;
        }
        out->dims[0] += d[0];
    }
    return 0;
}

int wk_join_shape(const wk_jpart *parts, size_t n_parts, uint32_t shard_dim, wk_tview *out,
                  char *err, size_t errlen)
{
    char a[96], b[96];
    int have = 0;
    *out = (wk_tview){0};
    for (size_t p = 0; p < n_parts; p++) {
        if (parts[p].n == 0)
            continue;
        wk_tview ps;
        int rc = part_shape(&parts[p], p, &ps, err, errlen);
        if (rc)
            return rc;
        if (!have) {
            *out = ps;
            have = 1;
            continue;
        }
        if (shard_dim >= ps.ndim) {
            snprintf(err, errlen, "shard_dim %u is out of range for %u-dimensional parts",
                     shard_dim, ps.ndim);
            return BT_EINVAL;
        }
        if (ps.dtype != out->dtype) {
            snprintf(err, errlen, "part %zu is %s, earlier parts are %s", p, dtype_name(ps.dtype),
                     dtype_name(out->dtype));
            return BT_EINVAL;
        }
        int same = ps.ndim == out->ndim;
        for (uint32_t i = 0; same && i < ps.ndim; i++)
            same = i == shard_dim || ps.dims[i] == out->dims[i];
        if (!same) {
            fmt_dims(a, sizeof(a), ps.ndim, ps.dims);
            fmt_dims(b, sizeof(b), out->ndim, out->dims);
            snprintf(err, errlen, "part %zu has dims %s, which do not join along dim %u with %s",
                     p, a, shard_dim, b);
            return BT_EINVAL;
        }
        if (out->dims[shard_dim] > INT64_MAX - ps.dims[shard_dim]) {
            snprintf(err, errlen, "joined dim %u overflows", shard_dim);
            return BT_EINVAL;
        }
        out->dims[shard_dim] += ps.dims[shard_dim];
    }
    if (!have) {
        /* Nothing says what the value would have been: an empty byte
         * vector is the honest answer. */
        out->dtype = BATON_DTYPE_U8;
        out->ndim = 1;
        out->dims[0] = 0;
    }
    out->nbytes = wk_tensor_bytes(out->dtype, out->ndim, out->dims);
    if (out->nbytes == UINT64_MAX) {
        snprintf(err, errlen, "joined tensor size overflows");
        return BT_EINVAL;
    }
    return 0;
}

static int host_copy(void *arg, void *dst, const void *src, uint64_t n)
{
    (void)arg;
    if (n)
        memcpy(dst, src, n);
    return 0;
}

int wk_join_copy(const wk_jpart *parts, size_t n_parts, uint32_t shard_dim, const wk_tview *out,
                 void *dst, wk_copy_fn copy, void *arg)
{
    if (!copy)
        copy = host_copy;
    int rc;
    uint8_t *o = dst;
    size_t es = baton_dtype_size(out->dtype);
    size_t nonempty = 0;
    for (size_t p = 0; p < n_parts; p++)
        nonempty += parts[p].n > 0;
    if (shard_dim == 0 || nonempty <= 1) {
        /* Along dim 0 every chunk of every part is one contiguous run. */
        for (size_t p = 0; p < n_parts; p++)
            for (size_t k = 0; k < parts[p].n; k++) {
                if ((rc = copy(arg, o, parts[p].chunks[k].data, parts[p].chunks[k].nbytes)))
                    return rc;
                o += parts[p].chunks[k].nbytes;
            }
        return 0;
    }
    /* Along an inner dim: each outer row (the indices before shard_dim)
     * takes a slab from every part in turn.  Outer rows of a part advance
     * through its chunks, since a chunk covers whole rows of dim 0. */
    uint64_t inner = es;
    for (uint32_t i = shard_dim + 1; i < out->ndim; i++)
        inner *= (uint64_t)out->dims[i];
    uint64_t mid = 1; /* outer rows per index of dim 0 */
    for (uint32_t i = 1; i < shard_dim; i++)
        mid *= (uint64_t)out->dims[i];
    uint64_t out_row = (uint64_t)out->dims[shard_dim] * inner;
    uint64_t col = 0;
    for (size_t p = 0; p < n_parts; p++) {
        if (parts[p].n == 0)
            continue;
        uint64_t width = (uint64_t)parts[p].chunks[0].dims[shard_dim] * inner;
        uint64_t row = 0;
        for (size_t k = 0; k < parts[p].n; k++) {
            const wk_tview *c = &parts[p].chunks[k];
            uint64_t rows = (uint64_t)c->dims[0] * mid;
            const uint8_t *s = c->data;
            for (uint64_t r = 0; r < rows; r++, row++)
                if ((rc = copy(arg, o + row * out_row + col, s + r * width, width)))
                    return rc;
        }
        col += width;
    }
    return 0;
}
