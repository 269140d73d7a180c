/* The wire side of a ZAP handler (ZeroMQ's authentication protocol, RFC
 * 27): reading a request from the handler's REP socket at
 * inproc://zeromq.zap.01 and sending the answer.  libzmq asks the handler
 * of a socket's context whether a peer that completed its handshake (CURVE
 * here) may in; what to answer is the caller's decision.
 *
 * batond's handler (daemon/zap.c) and a worker's, which guards its
 * worker-to-worker socket, both answer through this module; they differ
 * only in which keys they let in. */
#ifndef BATON_COMMON_ZAPWIRE_H
#define BATON_COMMON_ZAPWIRE_H

#include <stddef.h>
#include <stdint.h>

#define BT_ZAP_ENDPOINT "inproc://zeromq.zap.01"

/* One request, its strings NUL-terminated (cut to fit). */
typedef struct bt_zap_request {
    char version[8];      /* "1.0" for the protocol libzmq speaks */
    char domain[256];     /* the socket's ZMQ_ZAP_DOMAIN; "" when none */
    char address[64];     /* the peer's address, for logs */
    char mechanism[32];   /* "NULL", "PLAIN" or "CURVE" */
    const uint8_t *cred;  /* CURVE: the peer's 32-byte public key; NULL when absent */
    size_t cred_len;      /* bytes at CRED */
} bt_zap_request;

/* The decision for REQ: 200 to let the peer in, anything else to refuse.
 * *USER_ID (may be left NULL) is handed to libzmq as the peer's user id. */
typedef int (*bt_zap_decide_fn)(void *arg, const bt_zap_request *req, const char **user_id);

/* Binds a REP socket in ZCTX at BT_ZAP_ENDPOINT into *OUT (linger 0).  Bind
 * it before any socket of ZCTX that asks: libzmq lets a peer in unasked
 * while no handler is bound.  0, or -1 with errno set. */
int bt_zap_bind(void *zctx, void **out);

/* Answers every request waiting on REP (none waiting: returns at once),
 * asking DECIDE for each well-formed one; a malformed request, or one of
 * another protocol version, is refused without asking.  Returns how many
 * were answered, or -1 when an answer could not be sent (errno set). */
int bt_zap_serve(void *rep, bt_zap_decide_fn decide, void *arg);

#endif
