/* Whisper's tokenizer (backends/whisper/wtok.c) on Whisper base's own
 * tokenizer.json: ids to text against what faster-whisper's decode gives
 * (tests/unit/data/whisper-decode-vectors.tsv, written by
 * scripts/gen-whisper-tokenizer-vectors.py with Hugging Face's
 * tokenizers), in languages, with emoji, cut characters and special
 * tokens; the special ids, languages and timestamps; and files that are
 * not Whisper tokenizers, refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/skip.h"

#include "backends/whisper/wtok.h"

#define TOKENIZER "models/whisper-base/tokenizer.json"
#define VECTORS "tests/unit/data/whisper-decode-vectors.tsv"
#define N_VOCAB 51865

static wtok *load(void)
{
    char err[512];
    wtok *t = NULL;
    int rc = wtok_create(TOKENIZER, N_VOCAB, &t, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", bt_strerror(rc), err);
    return t;
}

static int hexval(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

static void test_decode_vectors(void **state)
{
    (void)state;
    if (access(TOKENIZER, R_OK) != 0)
        skip_without_model(TOKENIZER);
    wtok *t = load();
    FILE *f = fopen(VECTORS, "r");
    assert_non_null(f);
    char line[16384];
    int cases = 0;
    while (fgets(line, sizeof(line), f)) {
        /* NAME TAB IDS TAB HEX: either of the last two may be empty. */
        line[strcspn(line, "\n")] = '\0';
        char *name = line, *ids_s = strchr(line, '\t');
        assert_non_null(ids_s);
        *ids_s++ = '\0';
        char *hex = strchr(ids_s, '\t');
        assert_non_null(hex);
        *hex++ = '\0';
        int32_t ids[512];
        size_t n = 0;
        for (char *p = strtok(ids_s, " "); p; p = strtok(NULL, " ")) {
            assert_true(n < 512);
            ids[n++] = (int32_t)atoi(p);
        }
        size_t want_len = strlen(hex) / 2;
        char want[4096];
        assert_true(want_len < sizeof(want));
        for (size_t i = 0; i < want_len; i++)
            want[i] = (char)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        char *got;
        size_t len;
        assert_int_equal(wtok_decode(t, ids, n, &got, &len), 0);
        if (len != want_len || memcmp(got, want, len))
            fail_msg("%s: got '%s', want '%.*s'", name, got, (int)want_len, want);
        assert_int_equal(got[len], '\0');
        free(got);
        cases++;
    }
    fclose(f);
    print_message("%d sequences decoded as faster-whisper decodes them\n", cases);
    assert_true(cases >= 30);
    wtok_destroy(t);
}

static void test_specials(void **state)
{
    (void)state;
    if (access(TOKENIZER, R_OK) != 0)
        skip_without_model(TOKENIZER);
    wtok *t = load();
    const wtok_special *sp = wtok_specials(t);
    assert_int_equal(sp->eot, 50257);
    assert_int_equal(sp->sot, 50258);
    assert_int_equal(sp->translate, 50358);
    assert_int_equal(sp->transcribe, 50359);
    assert_int_equal(sp->sot_lm, 50360);
    assert_int_equal(sp->sot_prev, 50361);
    assert_int_equal(sp->no_speech, 50362);
    assert_int_equal(sp->no_timestamps, 50363);
    assert_int_equal(sp->timestamp_begin, 50364);
    assert_int_equal(sp->lang_first, 50259);
    assert_int_equal(sp->lang_count, 99);
    assert_int_equal(wtok_lang_id(t, "en"), 50259);
    assert_int_equal(wtok_lang_id(t, "de"), 50261);
    assert_int_equal(wtok_lang_id(t, "yue"), -1);  /* large-v3 only */
    assert_int_equal(wtok_lang_id(t, "xx"), -1);
    assert_string_equal(wtok_lang_code(t, 50259), "en");
    assert_null(wtok_lang_code(t, 50358));
    assert_null(wtok_lang_code(t, 100));
    /* Timestamps, 20 ms apart, to 30 s at the last id. */
    assert_true(wtok_timestamp(t, 50364) == 0.0);
    assert_true(wtok_timestamp(t, 50365) > 0.0199 && wtok_timestamp(t, 50365) < 0.0201);
    assert_true(wtok_timestamp(t, N_VOCAB - 1) > 29.999 && wtok_timestamp(t, N_VOCAB - 1) < 30.001);
    assert_true(wtok_timestamp(t, 50363) < 0);
    size_t len;
    const char *p = wtok_piece(t, N_VOCAB - 1, &len);
    assert_non_null(p);
    assert_int_equal(len, 9);
    assert_memory_equal(p, "<|30.00|>", 9);
    p = wtok_piece(t, 50259, &len);
    assert_memory_equal(p, "<|en|>", len);
    /* A text token's raw bytes: id 220 is the space (GPT-2's "Ġ"). */
    p = wtok_piece(t, 220, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], ' ');
    assert_null(wtok_piece(t, N_VOCAB, &len));
    assert_null(wtok_piece(t, -1, &len));
    int32_t bad[] = {1, N_VOCAB};
    char *out;
    assert_int_equal(wtok_decode(t, bad, 2, &out, &len), BT_ERANGE);
    assert_null(out);
    wtok_destroy(t);
}

/* Writes TEXT to a temporary file and expects wtok_create to refuse it
 * with WANT in the message. */
static void refused(const char *text, int32_t n_vocab, const char *want)
{
    char path[] = "/tmp/baton-test-wtok-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char err[512];
    wtok *t = (wtok *)1;
    int rc = wtok_create(path, n_vocab, &t, err, sizeof(err));
    unlink(path);
    assert_null(t);
    if (rc == 0 || !strstr(err, want))
        fail_msg("expected '%s', got %s: '%s'", want, bt_strerror(rc), err);
    assert_non_null(strstr(err, "/tmp/baton-test-wtok-"));
}

static void test_refusals(void **state)
{
    (void)state;
    refused("{", 10, "line 1");
    refused("{\"model\": {\"type\": \"Unigram\"}}", 10, "not a BPE tokenizer.json");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 12}}, \"added_tokens\": []}", 10,
            "model.vocab['a'] is not an id from 0 to 9");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": []}", 1,
            "not a Whisper tokenizer");
    /* "\u0100" stands for byte 0; "\u0200" for none. */
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u0200\": 0}}, \"added_tokens\": []}",
            1, "token 0");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": ["
            "{\"id\": 2, \"content\": \"<|endoftext|>\"},"
            "{\"id\": 3, \"content\": \"<|startoftranscript|>\"},"
            "{\"id\": 4, \"content\": \"<|translate|>\"},"
            "{\"id\": 5, \"content\": \"<|transcribe|>\"},"
            "{\"id\": 6, \"content\": \"<|notimestamps|>\"}]}", 8,
            "id 1 of the model's 8 has no token");
    wtok *t = NULL;
    char err[256];
    assert_int_equal(wtok_create("/nonexistent/tokenizer.json", 10, &t, err, sizeof(err)),
                     BT_EIO);
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
    wtok_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_vectors),
        cmocka_unit_test(test_specials),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
