/* A growable byte buffer for the unit tests that write binary files in
 * memory (GGUF, CTranslate2): put appends bytes, put_uN a little-endian
 * integer (the tests run on little-endian machines only, as baton does).
 * Include after <cmocka.h>: a failed allocation fails the test. */
#ifndef BATON_TESTS_WBUF_H
#define BATON_TESTS_WBUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct wbuf {
    uint8_t *p;   /* owned; free() it */
    size_t n;     /* bytes written */
    size_t cap;   /* bytes allocated */
} wbuf;

static inline void put(wbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void put_u8(wbuf *b, uint8_t v) { put(b, &v, 1); }
static inline void put_u16(wbuf *b, uint16_t v) { put(b, &v, 2); }
static inline void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static inline void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }

#endif
