/* The backends built into baton-worker, by name.  This is how the worker
 * reaches them: through the same ABI a plugin implements
 * (include/baton/backend.h), never through a backend's own headers. */
#ifndef BATON_BACKENDS_BUILTIN_H
#define BATON_BACKENDS_BUILTIN_H

#include "baton/backend.h"

/* The built-in backend called NAME (transformer, echo, add, counter,
 * chunks, sleep, fail), or NULL. */
const baton_backend *bk_builtin_find(const char *name);

/* Makes the communicator id of a tensor-parallel group that the calling
 * process will be rank 0 of (an NCCL unique id: it names a bootstrap
 * endpoint this process serves, so the process must stay in the group):
 * at most *LEN bytes into ID, *LEN set to its length.  Returns 0, or a
 * negative bt_err with the reason in ERR (a build without CUDA or NCCL). */
#define BK_COMM_ID_MAX 128
int bk_comm_unique_id(void *id, size_t *len, char *err, size_t errlen);

#endif
