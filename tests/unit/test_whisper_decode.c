/* Whisper's token rules and segments (backends/whisper/wdecode.c) on a
 * made-up vocabulary small enough to reason about, one case per branch of
 * CTranslate2's timestamp rules and of faster-whisper's cutting of a window
 * into segments.  (tests/unit/test_whisper_engine.c checks the same code
 * against faster-whisper on real audio.)
 *
 * The vocabulary: ids 0..4 text, 5 end of text, 6 start of transcript,
 * 7 and 8 languages, 9 no timestamps, 10..29 timestamps (<|0.00|> to
 * <|0.38|>); the first timestamp at most 3 steps (<|0.06|>). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "backends/whisper/wdecode.h"

#define V 30
#define TB 10

static wdec_rules rules(void)
{
    wdec_rules r;
    memset(&r, 0, sizeof(r));
    r.vocab = V;
    r.sp = (wtok_special){.eot = 5, .sot = 6, .translate = -1, .transcribe = -1, .sot_lm = -1,
                          .sot_prev = -1, .no_speech = -1, .no_timestamps = 9,
                          .timestamp_begin = TB, .lang_first = 7, .lang_count = 2};
    r.max_initial = 3;
    return r;
}

/* Logits that favour id BEST, every other id a little below. */
static void logits(float *l, int best)
{
    for (int i = 0; i < V; i++)
        l[i] = i == best ? 5.0f : 1.0f;
}

/* Which ids FILTER left open, as a bit set. */
static uint32_t open_ids(const int32_t *seq, int n, int best)
{
    wdec_rules r = rules();
    float l[V];
    logits(l, best);
    wdec_filter(&r, l, seq, n, true);
    uint32_t set = 0;
    for (int i = 0; i < V; i++)
        if (l[i] != -INFINITY)
            set |= 1u << i;
    return set;
}

static uint32_t range(int from, int to) /* [from, to) */
{
    uint32_t s = 0;
    for (int i = from; i < to; i++)
        s |= 1u << i;
    return s;
}

static void test_filter_timestamps(void **state)
{
    (void)state;
    /* The first token: a timestamp from <|0.00|> to <|0.06|>. */
    assert_int_equal(open_ids(NULL, 0, 0), range(TB, TB + 4));
    /* After the first timestamp: text (CTranslate2 takes the one
     * timestamp for a pair). */
    int32_t a[] = {TB + 1};
    assert_int_equal(open_ids(a, 1, 2), range(0, 9));
    /* Inside a segment: text, the end, or a timestamp after its start (the
     * text favoured, so the probability test leaves text open). */
    int32_t b[] = {TB + 1, 2, 3};
    assert_int_equal(open_ids(b, 3, 2), range(0, 9) | range(TB + 2, V));
    /* A segment's end (timestamp after text): no text, and the next start
     * may repeat it.  The end of text (5) and the specials up to 9 stay
     * open unless the timestamps outweigh them, as here. */
    int32_t c[] = {TB + 1, 2, TB + 4};
    assert_int_equal(open_ids(c, 3, 2), range(TB + 4, V));
    assert_int_equal(open_ids(c, 3, 5), range(5, 9) | range(TB + 4, V));
    /* After two timestamps in a row: text. */
    int32_t d[] = {TB + 1, 2, TB + 4, TB + 4};
    assert_int_equal(open_ids(d, 4, 2), range(0, 9));
    /* Timestamps that outweigh every text token force a timestamp: 18
     * timestamps at 1.0 beat a text token at 3.0 (log 18 + 1 > 3). */
    wdec_rules r = rules();
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = i == 2 ? 3.0f : 1.0f;
    wdec_filter(&r, l, b, 3, true);
    assert_true(l[2] == -INFINITY && l[TB + 5] == 1.0f);
    /* But not when the text token is far ahead. */
    for (int i = 0; i < V; i++)
        l[i] = i == 2 ? 9.0f : 1.0f;
    wdec_filter(&r, l, b, 3, true);
    assert_true(l[2] == 9.0f);
    /* Without timestamps: no timestamp rule applies. */
    logits(l, 2);
    wdec_filter(&r, l, NULL, 0, false);
    for (int i = 0; i < V; i++)
        assert_true(l[i] != -INFINITY);
}

static void test_split(void **state)
{
    (void)state;
    wdec_rules r = rules();
    wdec_segment s[8];
    int next = -1;
    /* Two segments closed by a pair, the tail ends in one timestamp: all
     * three are segments, and the next window starts after this one. */
    int32_t a[] = {TB + 0, 1, 2, TB + 5, TB + 5, 3, TB + 9, TB + 9, 4, TB + 12};
    assert_int_equal(wdec_split(&r, a, 10, 100, 3000, true, s, &next), 3);
    assert_int_equal(next, 3100);
    assert_int_equal(s[0].first, 0);
    assert_int_equal(s[0].count, 4);
    assert_true(fabs(s[0].start - 1.00) < 1e-9 && fabs(s[0].end - 1.10) < 1e-9);
    assert_int_equal(s[1].first, 4);
    assert_int_equal(s[1].count, 3);
    assert_true(fabs(s[1].start - 1.10) < 1e-9 && fabs(s[1].end - 1.18) < 1e-9);
    assert_int_equal(s[2].first, 7);
    assert_int_equal(s[2].count, 3);
    assert_true(fabs(s[2].end - 1.24) < 1e-9);
    /* While decoding goes on, only the closed ones. */
    assert_int_equal(wdec_split(&r, a, 10, 100, 3000, false, s, NULL), 2);
    assert_int_equal(wdec_split(&r, a, 4, 100, 3000, false, s, NULL), 0);
    assert_int_equal(wdec_split(&r, a, 5, 100, 3000, false, s, NULL), 1);
    /* An unfinished tail (text at the end): left for the next window,
     * which starts at the last closed segment's end: 9 steps, 18 frames. */
    int32_t b[] = {TB + 0, 1, 2, TB + 5, TB + 5, 3, TB + 9, TB + 9, 4};
    assert_int_equal(wdec_split(&r, b, 9, 100, 3000, true, s, &next), 2);
    assert_int_equal(next, 118);
    /* No pair: one segment over the window, to its last timestamp. */
    int32_t c[] = {TB + 0, 1, 2, TB + 7};
    assert_int_equal(wdec_split(&r, c, 4, 0, 1100, true, s, &next), 1);
    assert_int_equal(next, 1100);
    assert_true(s[0].start == 0 && fabs(s[0].end - 0.14) < 1e-9);
    /* No timestamp after the start: to the window's end. */
    int32_t d[] = {TB + 0, 1, 2};
    assert_int_equal(wdec_split(&r, d, 3, 0, 1100, true, s, &next), 1);
    assert_true(fabs(s[0].end - 11.0) < 1e-9);
    /* Nothing decoded: one empty segment (the caller leaves it out). */
    assert_int_equal(wdec_split(&r, d, 0, 0, 1100, true, s, &next), 1);
    assert_int_equal(s[0].count, 0);
}

/* Segments faster-whisper leaves out: zero length, blank text. */
static void test_segment_shown(void **state)
{
    (void)state;
    wdec_segment a = {0, 3, 1.10, 1.18}, z = {0, 3, 1.10, 1.10};
    assert_true(wdec_segment_shown(&a, " Hi.", 4));
    assert_false(wdec_segment_shown(&z, " Hi.", 4));
    assert_false(wdec_segment_shown(&a, " \n ", 3));
    assert_false(wdec_segment_shown(&a, "", 0));
}

/* What a window is judged by.  The compression ratios are those Python's
 * zlib.compress gives the stripped text (faster-whisper's
 * get_compression_ratio); a text that repeats compresses well. */
static void test_judging(void **state)
{
    (void)state;
    char rep[201];
    for (int i = 0; i < 50; i++)
        memcpy(rep + 4 * i, "you ", 4);
    rep[200] = 0;
    const char *s = "  And so my fellow Americans ask not.  ";
    assert_true(fabs(wdec_compression_ratio(s, strlen(s)) - 0.813953488372093) < 1e-12);
    assert_true(fabs(wdec_compression_ratio(rep, 200) - 13.266666666666667) < 1e-12);
    assert_true(fabs(wdec_compression_ratio("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", 12) -
                     0.5714285714285714) < 1e-12);
    assert_true(wdec_compression_ratio(" \n ", 3) == 0);
    assert_true(wdec_compression_ratio("", 0) == 0);

    /* Log softmax: id 2 at 5, the other 29 at 1; a disabled id counts for
     * nothing. */
    wdec_rules r = rules();
    float l[V];
    logits(l, 2);
    double lse = log(exp(5.0) + 29 * exp(1.0));
    assert_true(fabs(wdec_logprob(&r, l, 2) - (5.0 - lse)) < 1e-6);
    assert_true(fabs(wdec_logprob(&r, l, 0) - (1.0 - lse)) < 1e-6);
    l[3] = -INFINITY;
    lse = log(exp(5.0) + 28 * exp(1.0));
    assert_true(fabs(wdec_logprob(&r, l, 2) - (5.0 - lse)) < 1e-6);
    /* No speech: its softmax probability; 0 without such a token. */
    assert_true(wdec_no_speech_prob(&r, l) == 0);
    r.sp.no_speech = 2;
    assert_true(fabs(wdec_no_speech_prob(&r, l) - exp(5.0 - lse)) < 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_timestamps),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_segment_shown),
        cmocka_unit_test(test_judging),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
