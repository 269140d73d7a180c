/* A Dispatch as the worker holds one, for the unit tests that drive the
 * worker's modules (executor, run-ahead chains) without a conductor. */
#ifndef BATON_TESTS_WK_DISPATCH_MSG_H
#define BATON_TESTS_WK_DISPATCH_MSG_H

#include <stdint.h>

#include "worker/item.h"
#include "worker/store.h"

/* A Dispatch of node "step" (model "m", mode "decode") of request KEY
 * (id RID, borrowed until the call returns) at iteration ITER of one loop
 * level, granting a window up to UPTO (0: none), packed and unpacked as
 * the worker receives one (so that it owns its message), in a wk_dispatch
 * of STORE with one reference.  Fails the test when memory is short. */
wk_dispatch *tu_dispatch_new(wk_store *store, uint64_t key, const char *rid, uint32_t iter,
                             uint32_t upto, uint64_t dispatch_id);

#endif
