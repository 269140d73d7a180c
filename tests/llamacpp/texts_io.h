/* The line format shared by the tokenizer programs of tests/llamacpp/
 * (llama_tok.c, which links llama.cpp, and baton_tok.c, which links
 * baton): each input line is one text in lower-case hex, each output line
 * the ids of the text on the same input line, separated by spaces.  Hex
 * keeps newlines, tabs, NULs and control bytes inside one line, so no text
 * needs escaping and both programs read exactly the same bytes.
 *
 * Header-only (static functions) because the two programs are built by
 * different means: baton_tok by the Makefile, llama_tok by
 * tests/llamacpp/run.sh against a llama.cpp build outside the repository. */
#ifndef BATON_TESTS_LLAMACPP_TEXTS_IO_H
#define BATON_TESTS_LLAMACPP_TEXTS_IO_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tio_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads the next line of FP into *LINE (grown as needed, capacity *CAP)
 * and decodes it in place; returns the text's length, -1 at the end of
 * the file, or -2 on a malformed line or no memory (reported on stderr
 * with the line's number LINENO). */
static long tio_read_text(FILE *fp, char **line, size_t *cap, long lineno)
{
    size_t n = 0;
    int c;
    while ((c = getc(fp)) != EOF && c != '\n') {
        if (n + 1 >= *cap) {
            size_t nc = *cap ? 2 * *cap : 4096;
            char *p = realloc(*line, nc);
            if (!p) {
                fprintf(stderr, "out of memory reading line %ld\n", lineno);
                return -2;
            }
            *line = p;
            *cap = nc;
        }
        (*line)[n++] = (char)c;
    }
    if (c == EOF && n == 0)
        return -1;
    if (n % 2) {
        fprintf(stderr, "line %ld: odd number of hex digits\n", lineno);
        return -2;
    }
    for (size_t i = 0; i < n / 2; i++) {
        int hi = tio_hexval((unsigned char)(*line)[2 * i]);
        int lo = tio_hexval((unsigned char)(*line)[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            fprintf(stderr, "line %ld: not hex\n", lineno);
            return -2;
        }
        (*line)[i] = (char)(hi << 4 | lo);
    }
    return (long)(n / 2);
}

static void tio_write_ids(FILE *fp, const int32_t *ids, long n)
{
    for (long i = 0; i < n; i++)
        fprintf(fp, i ? " %d" : "%d", (int)ids[i]);
    putc('\n', fp);
}

#endif
