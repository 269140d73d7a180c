/* A reader of CTranslate2 model files (model.bin, binary version 6), the
 * format faster-whisper's converted models come in.  The file is, all
 * little-endian:
 *
 *   u32 binary version
 *   string spec name ("WhisperSpec"), u32 spec revision
 *   u32 variable count, then per variable:
 *     string name ("encoder/layer_0/ffn/linear_0/weight"), u8 rank,
 *     u32 dims[rank] (outermost first), u8 dtype (CT2_*), u32 byte count,
 *     the bytes
 *   u32 alias count, then per alias: string alias, string variable name
 *
 * where a string is a u16 length, NUL included, then its bytes.  Scalars
 * (the number of heads, the activation) are rank-0 variables.
 *
 * The whole file is mapped read-only and every count, length and dim is
 * checked against the file before use: a truncated, foreign or corrupt file
 * fails ct2_open with a message naming the file and, for a fault found
 * while reading, the byte offset and the variable (a duplicate name or a
 * dangling alias is found after, and named without an offset); nothing
 * after a successful open reads outside the mapping.  Names and data are pointers into the mapping, valid until
 * ct2_close.  Data is not aligned in the file (a name's length sets the
 * offset of the bytes after it), so a reader copies it out with memcpy or
 * converts it; it never casts the pointer.
 *
 * Not supported, each an error at open: other binary versions, ranks
 * above CT2_MAX_RANK, dtypes outside CT2_*, two variables or aliases of
 * one name, an alias of a name that is not a variable, bytes after the
 * aliases. */
#ifndef BATON_BACKENDS_WHISPER_CT2_H
#define BATON_BACKENDS_WHISPER_CT2_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define CT2_BINARY_VERSION 6
#define CT2_MAX_RANK 4

/* Element types, numbered as CTranslate2's DataType. */
enum {
    CT2_F32 = 0,
    CT2_I8 = 1,
    CT2_I16 = 2,
    CT2_I32 = 3,
    CT2_F16 = 4,
    CT2_BF16 = 5
};

typedef struct ct2_file ct2_file;  /* opaque; owns the mapping */

typedef struct ct2_var {
    const char *name;              /* NUL-terminated, in the mapping */
    uint32_t rank;                 /* 0..CT2_MAX_RANK; 0 is a scalar */
    uint32_t dims[CT2_MAX_RANK];   /* elements per dim, outermost first; unused: 1 */
    uint32_t dtype;                /* CT2_* */
    size_t nelems;                 /* product of dims (1 for a scalar) */
    size_t nbytes;                 /* nelems * ct2_dtype_size(dtype) */
    size_t offset;                 /* bytes from the file's start to the data */
    const void *data;              /* in the mapping, unaligned; valid until ct2_close */
} ct2_var;

/* Maps and parses the file at PATH.  On success *OUT is the file (release
 * with ct2_close); on failure *OUT is NULL, the status (BT_EIO, BT_EFORMAT,
 * BT_ENOMEM) is returned and ERR[ERRLEN] (may be NULL) says what was wrong,
 * in which file and at which byte offset. */
int ct2_open(const char *path, ct2_file **out, char *err, size_t errlen);
/* The same over LEN bytes at BUF, which the caller keeps alive and
 * unchanged until ct2_close; NAME stands for the file in messages. */
int ct2_open_memory(const void *buf, size_t len, const char *name, ct2_file **out,
                    char *err, size_t errlen);
void ct2_close(ct2_file *f);  /* NULL is a no-op */

const char *ct2_dtype_name(uint32_t dtype);  /* "f16"; "?" when unknown */
size_t ct2_dtype_size(uint32_t dtype);       /* bytes per element; 0 when unknown */

const char *ct2_path(const ct2_file *f);     /* the PATH or NAME it was opened with */
uint32_t ct2_version(const ct2_file *f);
const char *ct2_spec(const ct2_file *f);     /* "WhisperSpec" */
uint32_t ct2_spec_revision(const ct2_file *f);

size_t ct2_var_count(const ct2_file *f);
const ct2_var *ct2_var_at(const ct2_file *f, size_t i);  /* NULL past the end */
/* The variable of NAME, or of the variable NAME is an alias of; NULL when
 * neither. */
const ct2_var *ct2_find(const ct2_file *f, const char *name);
size_t ct2_alias_count(const ct2_file *f);
/* The I-th alias, in name order (not file order), and the variable it
 * names; BT_ERANGE past the end. */
int ct2_alias_at(const ct2_file *f, size_t i, const char **alias, const char **target);

/* The variable NAME, checked: it exists, has dtype DTYPE (any when
 * UINT32_MAX) and rank RANK with dims DIMS (a dim of 0 matches any; DIMS
 * may be NULL to check the rank only).  On a mismatch returns BT_ENOENT or
 * BT_ETYPE with a message naming the file, the variable, what it has and
 * what was expected; *OUT is set on success. */
int ct2_expect(const ct2_file *f, const char *name, uint32_t dtype, uint32_t rank,
               const uint32_t *dims, const ct2_var **out, char *err, size_t errlen);
/* A scalar integer variable (CT2_I8, CT2_I16 or CT2_I32, rank 0) as an
 * int64_t; BT_ENOENT or BT_ETYPE, with a message, otherwise. */
int ct2_get_int(const ct2_file *f, const char *name, int64_t *out, char *err, size_t errlen);

#endif
