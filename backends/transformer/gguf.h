/* A reader of GGUF model files (versions 2 and 3, little-endian), the
 * format llama.cpp and ggml write: a header, typed key/value metadata, a
 * table of tensor infos, then an aligned data section of tensor bytes.
 *
 * The whole file is mapped read-only and every offset, length and count in
 * it is checked against the file size before use, so a hostile or
 * truncated file fails gguf_open with a message naming what was wrong and
 * at which byte offset; nothing after a successful open reads outside the
 * mapping.  Strings and tensor data are handed out as pointers into the
 * mapping (valid until gguf_close) rather than copied: a 100 MB model is
 * paged in only where the caller reads it.
 *
 * The tokenizer reads tens of thousands of array strings, so gguf_open
 * indexes the elements of every string array as it validates them, and
 * gguf_array_string is O(1) in the array's length.
 *
 * Not supported, each an error at open: arrays of arrays (no known writer
 * produces them), big-endian files, GGUF version 1, tensors of more than
 * four dims, and ggml types outside the table of gguf_type_name.
 *
 * A gguf_file can also be built in memory (gguf_build_*, at the end), for
 * weights read from another format. */
#ifndef BATON_BACKENDS_TRANSFORMER_GGUF_H
#define BATON_BACKENDS_TRANSFORMER_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32  /* bytes, when general.alignment is absent */

/* Metadata value types, as numbered in the file. */
enum {
    GGUF_VAL_U8 = 0,
    GGUF_VAL_I8 = 1,
    GGUF_VAL_U16 = 2,
    GGUF_VAL_I16 = 3,
    GGUF_VAL_U32 = 4,
    GGUF_VAL_I32 = 5,
    GGUF_VAL_F32 = 6,
    GGUF_VAL_BOOL = 7,
    GGUF_VAL_STRING = 8,
    GGUF_VAL_ARRAY = 9,
    GGUF_VAL_U64 = 10,
    GGUF_VAL_I64 = 11,
    GGUF_VAL_F64 = 12
};

/* Tensor element types, numbered as ggml's enum ggml_type.  Only these are
 * known; 4 and 5 (the removed Q4_2, Q4_3) and the IQ types are not. */
enum {
    GGUF_GGML_F32 = 0,
    GGUF_GGML_F16 = 1,
    GGUF_GGML_Q4_0 = 2,
    GGUF_GGML_Q4_1 = 3,
    GGUF_GGML_Q5_0 = 6,
    GGUF_GGML_Q5_1 = 7,
    GGUF_GGML_Q8_0 = 8,
    GGUF_GGML_Q8_1 = 9,
    GGUF_GGML_Q2_K = 10,
    GGUF_GGML_Q3_K = 11,
    GGUF_GGML_Q4_K = 12,
    GGUF_GGML_Q5_K = 13,
    GGUF_GGML_Q6_K = 14,
    GGUF_GGML_Q8_K = 15,
    GGUF_GGML_I8 = 24,
    GGUF_GGML_I16 = 25,
    GGUF_GGML_I32 = 26,
    GGUF_GGML_I64 = 27,
    GGUF_GGML_F64 = 28,
    GGUF_GGML_BF16 = 30
};

typedef struct gguf_file gguf_file;  /* opaque; owns the mapping */

typedef struct gguf_tensor {
    const char *name;              /* NUL-terminated copy; owned by the gguf_file */
    size_t name_len;               /* bytes, without the NUL */
    uint32_t type;                 /* GGUF_GGML_* */
    uint32_t n_dims;               /* 0..GGUF_MAX_DIMS as stored in the file */
    int64_t ne[GGUF_MAX_DIMS];     /* elements per dim, innermost first as ggml; unused: 1 */
    size_t nbytes;                 /* bytes of data */
    uint64_t offset;               /* bytes from the start of the data section */
    const void *data;              /* into the read-only mapping; valid until gguf_close */
} gguf_tensor;

/* Maps and parses the file at PATH.  On success *OUT is the file (release
 * with gguf_close); on failure *OUT is NULL, the status is returned and
 * ERR[ERRLEN] (may be NULL) holds a message saying what was wrong and at
 * which byte offset. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen);
void gguf_close(gguf_file *f);  /* NULL is a no-op */


/* The name of a ggml type ("q4_1"), or "?" for an unknown one. */
const char *gguf_type_name(uint32_t ggml_type);
/* The elements per block and bytes per block of a ggml type (1 and the
 * element size for unquantised types); 0 for an unknown one. */
size_t gguf_type_block_elems(uint32_t ggml_type);
size_t gguf_type_block_bytes(uint32_t ggml_type);
/* The name of a metadata value type ("u32", "string"), or "?". */
const char *gguf_value_type_name(uint32_t type);

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);    /* bytes */
size_t gguf_data_offset(const gguf_file *f);  /* bytes from the file start to the data section */

/* Metadata by index (0..gguf_kv_count-1, in file order).  Keys point into
 * the mapping and are not NUL-terminated; *LEN gets their length. */
size_t gguf_kv_count(const gguf_file *f);
const char *gguf_kv_key(const gguf_file *f, size_t i, size_t *len);
uint32_t gguf_kv_type(const gguf_file *f, size_t i);  /* GGUF_VAL_*; UINT32_MAX out of range */
/* Sets *INDEX to the index of KEY; returns 0 or BT_ENOENT. */
int gguf_find_key(const gguf_file *f, const char *key, size_t *index);

/* Scalar values by key.  Integers convert between all integer widths and
 * signednesses where the value fits (else BT_ERANGE); gguf_get_f32 takes
 * an f32, or an f64 that is exactly a float.  Each returns 0,
 * BT_ENOENT, BT_ETYPE (another type, arrays included) or
 * BT_ERANGE, and leaves *OUT alone unless it returns 0. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out);
/* A string value: *S points into the mapping (not NUL-terminated), *LEN
 * its length in bytes. */
int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len);

/* An array value's element type (GGUF_VAL_*) and count. */
int gguf_get_array(const gguf_file *f, const char *key, uint32_t *elem_type, uint64_t *count);
/* The raw elements of a numeric or bool array: little-endian, packed, and
 * possibly unaligned (read with memcpy).  BT_ETYPE for string arrays. */
int gguf_array_data(const gguf_file *f, const char *key, const void **data);
/* Element I of a string array; O(1).  BT_ERANGE when I >= count. */
int gguf_array_string(const gguf_file *f, const char *key, uint64_t i, const char **s,
                      size_t *len);
/* Element I of an integer or bool array as int64 (BT_ERANGE for a u64
 * above INT64_MAX), or of an f32 array (or f64 exactly a float) as float. */
int gguf_array_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out);
int gguf_array_f32(const gguf_file *f, const char *key, uint64_t i, float *out);

/* Tensors, in file order; at() returns NULL past the end, find() NULL for
 * an unknown name (names are unique: gguf_open rejects duplicates). */
size_t gguf_tensor_count(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, size_t i);
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* ---- files built in memory ----------------------------------------------------
 *
 * Weights that come in another format (backends/transformer/hf.c reads
 * Hugging Face folders) are handed to the backend as a gguf_file assembled
 * in memory, so that everything downstream reads one kind of object:
 * gguf_build_create makes an empty file, the gguf_build_* setters add
 * metadata and tensors, and every reader above then answers as it would for
 * a file on disk holding the same keys and tensors (gguf_version 3, the
 * default alignment, gguf_data_offset 0, tensor offsets 0).
 *
 * Keys, string values and tensor names are copied.  Tensor data is not: it
 * must live as long as the file, which it does when its memory is handed to
 * the file with gguf_build_own (malloc'd, freed at gguf_close) or
 * gguf_build_own_map (a mapping, unmapped at gguf_close).
 *
 * Each setter returns 0, BT_EEXIST when the key or tensor name is present
 * already, BT_EINVAL for a bad argument (a tensor whose byte count is not
 * what its type and dims take, an unknown type, more than four dims), or
 * BT_ENOMEM; on failure the file is unchanged.  The pointers that
 * gguf_tensor_at and gguf_tensor_find return are valid until the next
 * gguf_build_tensor. */
int gguf_build_create(gguf_file **out);
int gguf_build_u32(gguf_file *f, const char *key, uint32_t v);
int gguf_build_f32(gguf_file *f, const char *key, float v);
int gguf_build_bool(gguf_file *f, const char *key, bool v);
int gguf_build_str(gguf_file *f, const char *key, const char *s, size_t len);
int gguf_build_i32_array(gguf_file *f, const char *key, const int32_t *v, size_t n);
/* N strings: S[i] of LEN[i] bytes. */
int gguf_build_str_array(gguf_file *f, const char *key, const char *const *s, const size_t *len,
                         size_t n);
/* A tensor of ggml TYPE with N_DIMS dims NE (innermost first, as in a
 * file), whose NBYTES bytes are at DATA. */
int gguf_build_tensor(gguf_file *f, const char *name, uint32_t type, uint32_t n_dims,
                      const int64_t *ne, const void *data, size_t nbytes);
/* Hands P (malloc'd) or the mapping P[N] to F, which releases it at
 * gguf_close.  BT_ENOMEM when F cannot record it: P is then released at
 * once, so the caller never releases it either way. */
int gguf_build_own(gguf_file *f, void *p);
int gguf_build_own_map(gguf_file *f, void *p, size_t n);

#endif
