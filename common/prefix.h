/* Chained block hashes of a sequence: the keys of prefix caching.
 *
 * A sequence (token ids, or a prompt's bytes) is cut into blocks of BLOCK
 * elements; the hash of block j covers block j and, through the hash of
 * block j - 1 it starts from, every block before it.  Two sequences share
 * their first j blocks exactly when (but for a 64-bit collision, which a
 * user of the hashes verifies where it matters) their j-th hashes are
 * equal, so a table of hashes answers "the longest cached prefix" block by
 * block, as vLLM's automatic prefix caching does.  Only full blocks are
 * hashed.  A hash is never 0 or UINT64_MAX (the keys common/u64map.h
 * cannot hold). */
#ifndef BATON_COMMON_PREFIX_H
#define BATON_COMMON_PREFIX_H

#include <stddef.h>
#include <stdint.h>

/* Tokens per block of the transformer's prefix cache. */
#define BT_PREFIX_TOKENS 16
/* Bytes per block of a prompt's routing key (the conductor's match). */
#define BT_PREFIX_BYTES 64

/* The hashes of the full blocks of the N bytes at DATA, BLOCK bytes a
 * block, into OUT (at most CAP); returns how many blocks there are (which
 * may exceed CAP: only CAP are written). */
size_t bt_prefix_hashes(const void *data, size_t n, size_t block, uint64_t *out, size_t cap);

#endif
