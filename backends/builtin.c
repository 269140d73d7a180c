/* The table of built-in backends: each folder under backends/ exports its
 * baton_backend, and this file is the only place that names them all. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/testing/testing.h"
#include "backends/transformer/transformer.h"
#include "common/status.h"
#include "kernels/kernels.h"

const baton_backend *bk_builtin_find(const char *name)
{
    if (!name)
        return NULL;
    const baton_backend *b = bk_testing_backend(name);
    if (b)
        return b;
    b = bk_transformer_backend();
    return strcmp(b->name, name) == 0 ? b : NULL;
}

int bk_comm_unique_id(void *id, size_t *len, char *err, size_t errlen)
{
#ifdef BATON_CUDA
    if (*len < K_CUDA_COMM_ID_BYTES) {
        snprintf(err, errlen, "a communicator id needs %d bytes", K_CUDA_COMM_ID_BYTES);
        return BT_EINVAL;
    }
    int rc = k_cuda_comm_unique_id(id, *len);
    if (rc) {
        snprintf(err, errlen, "cannot make a communicator id: %s", bt_strerror(rc));
        return rc;
    }
    *len = K_CUDA_COMM_ID_BYTES;
    return 0;
#else
    (void)id, (void)len;
    snprintf(err, errlen, "this baton-worker was built without CUDA, and tensor parallelism "
             "runs over NCCL");
    return BT_EINVAL;
#endif
}
