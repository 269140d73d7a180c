/* The wrappers of failalloc.h.  The counter is global and atomic: lanes of
 * a worker allocate from their own threads. */
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/failalloc.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
int __real_posix_memalign(void **out, size_t align, size_t n);
void __real_free(void *p);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t m, size_t n);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
int __wrap_posix_memalign(void **out, size_t align, size_t n);
void __wrap_free(void *p);

static atomic_bool armed;
static atomic_long counted;
static long fail_at;
static atomic_bool has_failed;
static atomic_int held;

void fa_fail_nth(long n)
{
    atomic_store(&armed, false);
    atomic_store(&counted, 0);
    atomic_store(&has_failed, false);
    fail_at = n;
    atomic_store(&armed, true);
}

void fa_off(void)
{
    atomic_store(&armed, false);
}

long fa_count(void)
{
    return atomic_load(&counted);
}

bool fa_failed(void)
{
    return atomic_load(&has_failed);
}

void fa_hold(bool on)
{
    atomic_fetch_add(&held, on ? 1 : -1);
}

/* True when this allocation is the one to fail. */
static bool should_fail(void)
{
    if (!atomic_load(&armed) || atomic_load(&held) > 0)
        return false;
    long k = atomic_fetch_add(&counted, 1) + 1;
    if (fail_at == 0 || k != fail_at)
        return false;
    atomic_store(&has_failed, true);
    return true;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t m, size_t n)
{
    return should_fail() ? NULL : __real_calloc(m, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    /* realloc(p, 0) frees; only a real allocation may fail. */
    if (n && should_fail())
        return NULL;
    return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    return should_fail() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    return should_fail() ? NULL : __real_strndup(s, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    return should_fail() ? NULL : __real_aligned_alloc(align, n);
}

int __wrap_posix_memalign(void **out, size_t align, size_t n)
{
    return should_fail() ? ENOMEM : __real_posix_memalign(out, align, n);
}

void __wrap_free(void *p)
{
    if (p)
        memset(p, 0xa5, malloc_usable_size(p));
    __real_free(p);
}
