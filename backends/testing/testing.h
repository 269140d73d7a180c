/* The test backends (echo, add, counter, chunks, sleep, fail, group): small,
 * exactly specified behaviours that integration tests and outside users
 * are written against.  config/README.md states each one. */
#ifndef BATON_BACKENDS_TESTING_H
#define BATON_BACKENDS_TESTING_H

#include "baton/backend.h"

/* The test backend called NAME, or NULL (also for "transformer"). */
const baton_backend *bk_testing_backend(const char *name);

#endif
