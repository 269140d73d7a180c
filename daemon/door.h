/* The checks at the door of an InferRequest that depend only on the
 * request and the graphs: request_id, graph, messages, inputs (declared,
 * given once, a valid dtype, dims that are not negative and do not
 * overflow, a byte length that matches; every declared input given, but
 * an optional one left out reads as empty U8),
 * max_iters (loops of the graph, at least 1), raw_inputs (inputs of the
 * graph, not the messages'), and the text limits (stop strings: at most
 * TL_MAX_STOP, each 1 to TL_MAX_STOP_BYTES bytes of UTF-8; text_output: a
 * text stream of the graph).  They run in that order and the first failure
 * answers.  What depends on the daemon's state (a duplicate in flight,
 * draining, max_inflight) is the frontend's. */
#ifndef BATON_DAEMON_DOOR_H
#define BATON_DAEMON_DOOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "config/graph.h"
#include "daemon/textlimit.h"
#include "proto/baton.pb-c.h"

#define DOOR_REQUEST_ID_MAX 256   /* bytes */
#define DOOR_MAX_DIMS 8

/* Checks what the generated parser lets through in a client frame that it
 * parsed: a field numbered 0 (protobuf forbids it, and a re-packed copy
 * would not parse again), and every string field, at any depth (ids,
 * names, map keys, message text), for NUL bytes (the parser hands strings
 * over as C strings, so "a\0b" would become "a") and invalid UTF-8 (the
 * client's runtime would refuse any reply that echoed it).  It reads the
 * wire, where each string's length is known.  Returns BT_CODE_OK, or
 * BT_CODE_INVALID_ARGUMENT with WHY naming the first bad field by its
 * path (never its bytes).  *ID_BAD tells whether the request_id of the
 * infer or cancel is among the bad strings (then no answer may carry it). */
bt_code door_check_wire(const uint8_t *frame, size_t n, bool *id_bad, char *why, size_t len);

/* A request that passed. */
typedef struct door_pass {
    const char *request_id;       /* the request's; "" until it checked out */
    const graph *g;
    const Baton__V1__Tensor **by_input; /* per graph input, borrowed from the request; owned array */
    uint32_t *caps;               /* per entity: the request's max_iters, 0: none; owned */
    int chat_input;               /* the graph input that takes the messages; -1: none */
    Baton__V1__Tensor chat;       /* that input's value: the messages encoded (by_input
                                   * points here) */
    uint8_t *chat_bytes;          /* its data; owned */
    int64_t chat_len;             /* its one dim: the bytes */
    Baton__V1__Tensor *absent;    /* per graph input: the empty U8 tensor of an optional
                                   * input the request left out (by_input points here);
                                   * owned, NULL when none was */
    int64_t absent_len;           /* their one dim: 0 */
    uint8_t *raw;                 /* per graph input: 1 when its text skips the chat
                                   * template (raw_inputs); owned */
    const char *text_output;      /* the text stream that stop and max_tokens apply to
                                   * (borrowed from the graph); NULL: neither was asked */
} door_pass;

/* Checks Q against GS.  Returns BT_CODE_OK with P filled, or the code to
 * answer with and what was wrong in WHY (P->request_id says which id to
 * answer under).  door_pass_free releases P either way. */
bt_code door_check_infer(const graph_set *gs, const Baton__V1__InferRequest *q, door_pass *p,
                         char *why, size_t len);
void door_pass_free(door_pass *p);

#endif
