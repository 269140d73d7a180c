/* The end of a text stream that a request asks for: stop strings and
 * max_tokens (InferRequest.stop, max_tokens).
 *
 * A text stream arrives as values, one per token, each some bytes of UTF-8
 * (a token may end inside a character).  tl_feed takes them in order and
 * says which bytes may go to the client now: everything before the first
 * stop string, less the bytes at the end that could still be the start of
 * one (they wait for the next value to decide).  So a stop string is found
 * however the tokens cut it, and the text sent never holds one.  The
 * matching is on bytes: a stop string is valid UTF-8 (the door checks), so
 * in valid text it can only match at a character's start, and the text
 * sent ends between two characters.
 *
 * No I/O: the outbound path calls it for every value of the stream
 * (daemon/outbound.h). */
#ifndef BATON_DAEMON_TEXTLIMIT_H
#define BATON_DAEMON_TEXTLIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TL_MAX_STOP 16            /* stop strings a request may give */
#define TL_MAX_STOP_BYTES 256     /* bytes in one stop string */

/* Why a stream ended early. */
typedef enum tl_end {
    TL_RUNNING = 0,               /* it has not */
    TL_STOP = 1,                  /* a stop string was found */
    TL_LENGTH = 2                 /* max_tokens values were taken */
} tl_end;

typedef struct tl_limit {
    char *stop[TL_MAX_STOP];      /* owned */
    size_t stop_len[TL_MAX_STOP];
    size_t n_stop;
    uint32_t max_tokens;          /* 0: no cap */
    uint32_t tokens;              /* non-empty values taken */
    tl_end end;
    uint8_t hold[TL_MAX_STOP_BYTES]; /* bytes held back: they may begin a stop string */
    size_t held;
    uint8_t *buf;                 /* owned: the held bytes and the value being fed */
    size_t cap;
} tl_limit;

/* Sets L up for N_STOP stop strings (each non-empty, at most
 * TL_MAX_STOP_BYTES; copied) and MAX_TOKENS (0: none).  0, BT_EINVAL for
 * strings the door would refuse, or BT_ENOMEM. */
int tl_init(tl_limit *l, const char *const *stop, size_t n_stop, uint32_t max_tokens);
void tl_free(tl_limit *l);

/* Takes the next value of the stream, LEN bytes at P.  *OUT and *OUT_LEN
 * are the bytes to send now (into L, valid until the next call; possibly
 * none).  Returns TL_STOP when a stop string ended the text (*OUT stops
 * before it), TL_LENGTH when this value was the max_tokens-th non-empty
 * one (*OUT holds everything held, as no stop string can follow), else
 * TL_RUNNING.  An empty value is not a token.  Once ended, every later
 * value gives nothing and the same answer. */
tl_end tl_feed(tl_limit *l, const uint8_t *p, size_t len, const uint8_t **out, size_t *out_len);

/* The stream ended by itself: the bytes still held back, which no stop
 * string followed (into L, as for tl_feed).  Nothing after an early end. */
void tl_flush(tl_limit *l, const uint8_t **out, size_t *out_len);

#endif
