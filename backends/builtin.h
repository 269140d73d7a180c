/* The backends built into baton-worker, by name.  This is how the worker
 * reaches them: through the same ABI a plugin implements
 * (include/baton/backend.h), never through a backend's own headers. */
#ifndef BATON_BACKENDS_BUILTIN_H
#define BATON_BACKENDS_BUILTIN_H

#include "baton/backend.h"

/* The built-in backend called NAME (transformer, echo, add, counter,
 * chunks, sleep, fail), or NULL. */
const baton_backend *bk_builtin_find(const char *name);

#endif
