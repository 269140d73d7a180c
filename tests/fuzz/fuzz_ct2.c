/* libFuzzer target: a CTranslate2 model file (backends/whisper/ct2.c),
 * opened from memory in a buffer of exactly its size, so that a read past
 * the end is an ASan report.
 *
 * Beyond the sanitizers it asserts the reader's promises: every variable's
 * bytes lie inside the file and are its dims times its element size, each
 * variable is found by its name, each alias finds the variable it names,
 * and an index past the end answers NULL or BT_ERANGE.  With
 * BATON_FUZZ_VERBOSE set in the environment it says why a file was
 * refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/whisper/ct2.h"
#include "common/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_ct2: %s failed at line %d\n", #c, __LINE__); abort(); } } while (0)

/* Reads of the data land here, so that the compiler keeps them. */
static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    char err[512];
    ct2_file *f = NULL;
    int rc = ct2_open_memory(copy, size, "fuzz.bin", &f, err, sizeof(err));
    if (rc) {
        CHECK(f == NULL);
        CHECK(err[0] != '\0');
        if (getenv("BATON_FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_ct2: refused: %s\n", err);
        free(copy);
        return 0;
    }
    CHECK(ct2_spec(f)[0] != '\0');
    size_t n = ct2_var_count(f);
    for (size_t i = 0; i < n; i++) {
        const ct2_var *v = ct2_var_at(f, i);
        CHECK(v != NULL);
        CHECK(v->rank <= CT2_MAX_RANK);
        size_t elems = 1;
        for (uint32_t d = 0; d < v->rank; d++)
            elems *= v->dims[d];
        CHECK(elems == v->nelems);
        CHECK(v->nbytes == v->nelems * ct2_dtype_size(v->dtype));
        CHECK(v->offset <= size && v->nbytes <= size - v->offset);
        CHECK((const uint8_t *)v->data == copy + v->offset);
        uint8_t x = 0;
        for (size_t b = 0; b < v->nbytes; b++)
            x ^= ((const uint8_t *)v->data)[b];
        sink = x;
        CHECK(ct2_find(f, v->name) == v);
        const ct2_var *got;
        CHECK(ct2_expect(f, v->name, v->dtype, v->rank, v->dims, &got, err, sizeof(err)) == 0);
        int64_t iv;
        (void)ct2_get_int(f, v->name, &iv, err, sizeof(err));
    }
    CHECK(ct2_var_at(f, n) == NULL);
    for (size_t i = 0; i < ct2_alias_count(f); i++) {
        const char *alias, *target;
        CHECK(ct2_alias_at(f, i, &alias, &target) == 0);
        CHECK(ct2_find(f, alias) == ct2_find(f, target));
        CHECK(ct2_find(f, alias) != NULL);
    }
    const char *a, *t;
    CHECK(ct2_alias_at(f, ct2_alias_count(f), &a, &t) == BT_ERANGE);
    ct2_close(f);
    free(copy);
    return 0;
}
