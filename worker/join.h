/* Joining the pieces of one input: stream chunks and fan-in parts.
 *
 * An input arrives as fan-in parts, in the order their producers appear in
 * the config; each part is a list of chunks (one for a plain value, several
 * for a stream or an accumulated loop value).  The chunks of a part are
 * joined along dim 0, then the parts along shard_dim.  These functions work
 * on plain views of bytes so that they can be tested without a pool; the
 * executor decides where the joined bytes go.
 *
 * A scalar chunk (ndim 0) is taken as dims [1], so that joining scalars
 * along dim 0 gives a vector.  A part without chunks contributes nothing;
 * when every part is empty the result is U8 [0]. */
#ifndef BATON_WORKER_JOIN_H
#define BATON_WORKER_JOIN_H

#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"

/* A contiguous row-major tensor somewhere in memory. */
typedef struct wk_tview {
    baton_dtype dtype;
    uint32_t ndim;
    int64_t dims[BATON_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wk_tview;

typedef struct wk_jpart {
    const wk_tview *chunks;
    size_t n;
} wk_jpart;

/* Bytes of DTYPE x DIMS, or UINT64_MAX on a negative dim or an overflow. */
uint64_t wk_tensor_bytes(baton_dtype dtype, uint32_t ndim, const int64_t *dims);

/* Nonzero when the input needs no join: one part holding one chunk, which
 * the backend then reads in place. */
int wk_join_is_trivial(const wk_jpart *parts, size_t n_parts);

/* Computes the dtype, dims and size of the joined tensor into *OUT (its
 * data is left NULL).  Returns 0, or BT_EINVAL with the reason in ERR
 * (dtypes differ, ranks differ, a dimension other than the join's differs,
 * shard_dim out of range, a chunk whose size disagrees with its shape). */
int wk_join_shape(const wk_jpart *parts, size_t n_parts, uint32_t shard_dim, wk_tview *out,
                  char *err, size_t errlen);

/* Copies N bytes from SRC to DST; 0 or a negative bt_err. */
typedef int (*wk_copy_fn)(void *arg, void *dst, const void *src, uint64_t n);

/* Copies the pieces into DST, which holds OUT->nbytes bytes; OUT is what
 * wk_join_shape computed for the same arguments.  Each contiguous run goes
 * through COPY (with ARG), so that device memory on either side can be
 * reached; NULL COPY is memcpy.  Returns 0 or the first error of COPY. */
int wk_join_copy(const wk_jpart *parts, size_t n_parts, uint32_t shard_dim, const wk_tview *out,
                 void *dst, wk_copy_fn copy, void *arg);

#endif
