/* An allocator that fails on demand, for tests of allocation failures.
 *
 * A test binary that links failalloc.o must be linked with
 * -Wl,--wrap=SYMBOL for every allocation function below (the Makefile does
 * this for the programs in FAILALLOC_TESTS).  The linker then routes every
 * call from the statically linked baton code through the wrappers here;
 * calls made inside shared libraries (libzmq, libprotobuf-c, libc itself)
 * are not wrapped and never fail.
 *
 * Freed blocks are overwritten before they go back to the C library, so a
 * read of freed memory returns garbage at once instead of the old values,
 * also in builds without AddressSanitizer. */
#ifndef BATON_TESTS_FAILALLOC_H
#define BATON_TESTS_FAILALLOC_H

#include <stdbool.h>

/* Counts allocations from now on and makes the Nth one (1-based) fail; N = 0
 * counts without failing.  Only that one allocation fails. */
void fa_fail_nth(long n);
/* Stops counting and failing. */
void fa_off(void);
/* Allocations counted since the last fa_fail_nth. */
long fa_count(void);
/* Whether the allocation chosen by fa_fail_nth has been failed. */
bool fa_failed(void);
/* While held (ON true; calls nest), allocations are neither counted nor
 * failed: for test scaffolding that plays the world around the code under
 * test (tests/unit/rt_harness.c holds them around its own). */
void fa_hold(bool on);

#endif
