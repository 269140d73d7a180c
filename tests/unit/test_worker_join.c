/* Input joining (worker/join.c): chunks along dim 0, fan-in parts along
 * shard_dim, on 1-D, 2-D and 3-D tensors, checked element by element
 * against a naive reference; and every shape error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "worker/join.h"

/* A test tensor of I32 whose elements are BASE + flat index. */
static wk_tview mk(uint32_t ndim, const int64_t *dims, int32_t base)
{
    wk_tview v = {0};
    v.dtype = BATON_DTYPE_I32;
    v.ndim = ndim;
    if (ndim)
        memcpy(v.dims, dims, sizeof(int64_t) * ndim);
    v.nbytes = wk_tensor_bytes(v.dtype, ndim, dims);
    int32_t *d = malloc(v.nbytes ? v.nbytes : 1);
    for (uint64_t i = 0; i < v.nbytes / 4; i++)
        d[i] = base + (int32_t)i;
    v.data = d;
    return v;
}

static void drop(wk_tview *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free((void *)v[i].data);
}

/* Dim I of chunk C as a join sees it (a scalar is [1]). */
static int64_t dim_of(const wk_tview *c, uint32_t i)
{
    return c->ndim == 0 ? 1 : c->dims[i];
}

/* Width of a part along dim D. */
static int64_t part_width(const wk_jpart *p, uint32_t d)
{
    int64_t w = 0;
    for (size_t k = 0; k < p->n; k++)
        w += dim_of(&p->chunks[k], d);
    return d == 0 ? w : dim_of(&p->chunks[0], d);
}

/* Element at multi-index IDX of the part made of CHUNKS along dim 0. */
static int32_t part_at(const wk_tview *chunks, size_t n, const int64_t *idx)
{
    int64_t row = idx[0];
    for (size_t k = 0; k < n; k++) {
        if (row < dim_of(&chunks[k], 0)) {
            uint64_t flat = (uint64_t)row;
            for (uint32_t i = 1; i < chunks[k].ndim; i++)
                flat = flat * (uint64_t)chunks[k].dims[i] + (uint64_t)idx[i];
            return ((const int32_t *)chunks[k].data)[flat];
        }
        row -= dim_of(&chunks[k], 0);
    }
    fail_msg("index outside the part");
    return 0;
}

/* Joins PARTS and compares every element with the naive reference. */
static void check_join(const wk_jpart *parts, size_t n_parts, uint32_t shard_dim,
                       const int64_t *want_dims, uint32_t want_ndim)
{
    char err[256] = "";
    wk_tview out;
    int rc = wk_join_shape(parts, n_parts, shard_dim, &out, err, sizeof(err));
    if (rc)
        fail_msg("join failed: %s", err);
    assert_int_equal(out.ndim, want_ndim);
    for (uint32_t i = 0; i < want_ndim; i++)
        assert_int_equal(out.dims[i], want_dims[i]);
    int32_t *dst = malloc(out.nbytes + 4);
    dst[out.nbytes / 4] = 0x5a5a5a5a; /* guard: nothing is written past the end */
    assert_int_equal(wk_join_copy(parts, n_parts, shard_dim, &out, dst, NULL, NULL), 0);
    assert_int_equal(dst[out.nbytes / 4], 0x5a5a5a5a);
    uint64_t total = out.nbytes / 4;
    for (uint64_t flat = 0; flat < total; flat++) {
        int64_t idx[BATON_MAX_DIMS] = {0};
        uint64_t f = flat;
        for (int i = (int)out.ndim - 1; i >= 0; i--) {
            idx[i] = (int64_t)(f % (uint64_t)out.dims[i]);
            f /= (uint64_t)out.dims[i];
        }
        /* Find the part that holds this shard coordinate. */
        int64_t s = idx[shard_dim];
        size_t p = 0;
        for (; p < n_parts; p++) {
            if (parts[p].n == 0)
                continue;
            int64_t w = part_width(&parts[p], shard_dim);
            if (s < w)
                break;
            s -= w;
        }
        assert_true(p < n_parts);
        idx[shard_dim] = s;
        int32_t want = part_at(parts[p].chunks, parts[p].n, idx);
        if (dst[flat] != want)
            fail_msg("element %llu: %d, expected %d", (unsigned long long)flat, dst[flat], want);
    }
    free(dst);
}

static void test_chunks_dim0(void **state)
{
    (void)state;
    wk_tview c[3] = {mk(1, (int64_t[]){2}, 0), mk(1, (int64_t[]){0}, 100),
                     mk(1, (int64_t[]){3}, 200)};
    wk_jpart p = {c, 3};
    assert_false(wk_join_is_trivial(&p, 1));
    check_join(&p, 1, 0, (int64_t[]){5}, 1);
    drop(c, 3);

    /* 2-D chunks along dim 0. */
    wk_tview d[2] = {mk(2, (int64_t[]){1, 4}, 0), mk(2, (int64_t[]){2, 4}, 50)};
    wk_jpart q = {d, 2};
    check_join(&q, 1, 0, (int64_t[]){3, 4}, 2);
    drop(d, 2);
}

static void test_parts_dim0(void **state)
{
    (void)state;
    wk_tview a[2] = {mk(2, (int64_t[]){1, 3}, 0), mk(2, (int64_t[]){1, 3}, 10)};
    wk_tview b[1] = {mk(2, (int64_t[]){2, 3}, 100)};
    wk_jpart parts[3] = {{a, 2}, {NULL, 0}, {b, 1}};
    check_join(parts, 3, 0, (int64_t[]){4, 3}, 2);
    drop(a, 2);
    drop(b, 1);
}

static void test_parts_shard1_2d(void **state)
{
    (void)state;
    wk_tview a[1] = {mk(2, (int64_t[]){2, 3}, 0)};
    wk_tview b[1] = {mk(2, (int64_t[]){2, 2}, 100)};
    wk_jpart parts[2] = {{a, 1}, {b, 1}};
    check_join(parts, 2, 1, (int64_t[]){2, 5}, 2);
    /* Spot check the interleaving by hand: row 0 = 0 1 2 100 101. */
    char err[128];
    wk_tview out;
    assert_int_equal(wk_join_shape(parts, 2, 1, &out, err, sizeof(err)), 0);
    int32_t got[10];
    assert_int_equal(wk_join_copy(parts, 2, 1, &out, got, NULL, NULL), 0);
    int32_t want[10] = {0, 1, 2, 100, 101, 3, 4, 5, 102, 103};
    assert_memory_equal(got, want, sizeof(want));
    drop(a, 1);
    drop(b, 1);
}

static void test_parts_shard_3d(void **state)
{
    (void)state;
    /* Parts that are themselves several chunks, joined along dims 1 and 2. */
    wk_tview a[2] = {mk(3, (int64_t[]){1, 2, 2}, 0), mk(3, (int64_t[]){2, 2, 2}, 1000)};
    wk_tview b[1] = {mk(3, (int64_t[]){3, 1, 2}, 2000)};
    wk_tview c[3] = {mk(3, (int64_t[]){1, 3, 2}, 3000), mk(3, (int64_t[]){1, 3, 2}, 4000),
                     mk(3, (int64_t[]){1, 3, 2}, 5000)};
    wk_jpart parts[3] = {{a, 2}, {b, 1}, {c, 3}};
    check_join(parts, 3, 1, (int64_t[]){3, 6, 2}, 3);

    wk_tview e[2] = {mk(3, (int64_t[]){2, 2, 1}, 0), mk(3, (int64_t[]){1, 2, 1}, 500)};
    wk_tview f[1] = {mk(3, (int64_t[]){3, 2, 4}, 900)};
    wk_jpart q[2] = {{e, 2}, {f, 1}};
    check_join(q, 2, 2, (int64_t[]){3, 2, 5}, 3);
    drop(a, 2);
    drop(b, 1);
    drop(c, 3);
    drop(e, 2);
    drop(f, 1);
}

static void test_scalars_and_empty(void **state)
{
    (void)state;
    wk_tview s[3] = {mk(0, NULL, 7), mk(0, NULL, 8), mk(0, NULL, 9)};
    wk_jpart p = {s, 3};
    check_join(&p, 1, 0, (int64_t[]){3}, 1);
    wk_jpart one = {s, 1};
    assert_true(wk_join_is_trivial(&one, 1));
    drop(s, 3);

    wk_jpart none[2] = {{NULL, 0}, {NULL, 0}};
    wk_tview out;
    char err[128];
    assert_int_equal(wk_join_shape(none, 2, 1, &out, err, sizeof(err)), 0);
    assert_int_equal(out.dtype, BATON_DTYPE_U8);
    assert_int_equal(out.ndim, 1);
    assert_int_equal(out.dims[0], 0);
    assert_int_equal(out.nbytes, 0);
    assert_int_equal(wk_join_shape(none, 0, 0, &out, err, sizeof(err)), 0);
    assert_int_equal(out.nbytes, 0);
}

static void expect_error(const wk_jpart *parts, size_t n, uint32_t shard_dim, const char *needle)
{
    char err[256] = "";
    wk_tview out;
    assert_int_equal(wk_join_shape(parts, n, shard_dim, &out, err, sizeof(err)), BT_EINVAL);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not contain \"%s\"", err, needle);
}

static void test_errors(void **state)
{
    (void)state;
    wk_tview a[2] = {mk(2, (int64_t[]){1, 3}, 0), mk(2, (int64_t[]){1, 4}, 0)};
    wk_jpart p = {a, 2};
    expect_error(&p, 1, 0, "do not join along dim 0");

    wk_tview b[2] = {mk(1, (int64_t[]){2}, 0), mk(1, (int64_t[]){2}, 0)};
    b[1].dtype = BATON_DTYPE_F32;
    wk_jpart q = {b, 2};
    expect_error(&q, 1, 0, "chunk 1 is F32, chunk 0 is I32");

    wk_tview c[1] = {mk(2, (int64_t[]){2, 3}, 0)};
    wk_tview d[1] = {mk(2, (int64_t[]){3, 3}, 0)};
    wk_jpart r[2] = {{c, 1}, {d, 1}};
    expect_error(r, 2, 1, "do not join along dim 1");
    expect_error(r, 2, 2, "shard_dim 2 is out of range");

    wk_tview e[1] = {mk(2, (int64_t[]){2, 3}, 0)};
    e[0].nbytes = 7;
    wk_jpart s = {e, 1};
    expect_error(&s, 1, 0, "does not span 7 bytes");

    wk_tview f[1] = {mk(2, (int64_t[]){2, 3}, 0)};
    wk_tview g[1] = {mk(3, (int64_t[]){2, 3, 1}, 0)};
    wk_jpart t[2] = {{f, 1}, {g, 1}};
    expect_error(t, 2, 0, "part 1 has dims [2, 3, 1]");
    wk_tview h[1] = {mk(2, (int64_t[]){2, 3}, 0)};
    h[0].dtype = BATON_DTYPE_U8;
    h[0].nbytes = 6;
    wk_jpart u[2] = {{f, 1}, {h, 1}};
    expect_error(u, 2, 0, "part 1 is U8, earlier parts are I32");
    drop(a, 2);
    drop(b, 2);
    drop(c, 1);
    drop(d, 1);
    drop(e, 1);
    drop(f, 1);
    drop(g, 1);
    drop(h, 1);

    assert_int_equal(wk_tensor_bytes(BATON_DTYPE_F32, 2, (int64_t[]){-1, 2}), UINT64_MAX);
    assert_int_equal(wk_tensor_bytes(BATON_DTYPE_F32, 2, (int64_t[]){INT64_MAX, 4}), UINT64_MAX);
    assert_int_equal(wk_tensor_bytes(BATON_DTYPE_INVALID, 0, NULL), UINT64_MAX);
    assert_int_equal(wk_tensor_bytes(BATON_DTYPE_I64, 0, NULL), 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_dim0),
        cmocka_unit_test(test_parts_dim0),
        cmocka_unit_test(test_parts_shard1_2d),
        cmocka_unit_test(test_parts_shard_3d),
        cmocka_unit_test(test_scalars_and_empty),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
