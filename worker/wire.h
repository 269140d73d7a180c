/* The worker's side of the conductor protocol (proto/baton.proto,
 * "worker -> conductor"): packing and sending a WorkerMessage on the
 * DEALER socket, the replies that carry nothing but a status, and tensor
 * references in both directions.
 *
 * Messages are packed straight into a zmq_msg_t, so the one copy of a
 * tensor's bytes that a Fetch or an inline output costs is the packing
 * itself.  Sending happens on the I/O thread only: the socket is its. */
#ifndef BATON_WORKER_WIRE_H
#define BATON_WORKER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "proto/baton.pb-c.h"
#include "worker/store.h"

/* Packs and sends MSG on SOCK.  0, or BT_ENOMEM / BT_EIO (logged).  While
 * the calling thread has SOCK corked, MSG is packed and kept instead. */
int wk_wire_send(void *sock, const Baton__V1__WorkerMessage *msg);
/* From wk_wire_cork to wk_wire_uncork, what the calling thread sends on
 * SOCK is kept, in order, and the uncork sends it as the frames of one
 * ZeroMQ message (the conductor reads each frame as a message): the I/O
 * thread corks each round of its loop, so that the Dones and Chunks of a
 * burst of finished items cost the conductor one wake-up. */
void wk_wire_cork(void *sock);
void wk_wire_uncork(void);

/* Answers dispatch D with a Done of status CODE and MESSAGE alone (and
 * logs the refusal). */
void wk_wire_refuse(void *sock, const Baton__V1__Dispatch *d, baton_status code,
                    const char *message);
/* Answers Put P with a Placed: REF (owner SELF) when CODE is OK, else the
 * refusal with MESSAGE (logged). */
void wk_wire_placed(void *sock, const Baton__V1__Put *p, const wk_ref *ref, uint32_t self,
                    baton_status code, const char *message);

/* A frame of LEN bytes from the conductor that does not parse: when it is
 * a Put or a Dispatch whose request can still be read from it, that
 * request fails at once (a refused Placed, a failed Done), rather than
 * wait for an answer that would never come.  WORKER names this worker in
 * the message. */
void wk_wire_salvage(void *sock, const void *data, size_t len, const char *worker);

/* Fills T (initialized) from REF, an own tensor when REF->own (owner
 * SELF); DIMS is scratch for BATON_MAX_DIMS dims the caller keeps alive
 * until the message is packed. */
void wk_wire_ref_to_proto(const wk_ref *ref, uint32_t self, Baton__V1__TensorRef *t,
                          int64_t *dims);
/* Converts a TensorRef from the conductor (own when its owner is SELF).
 * 0, or BT_EINVAL with ERR on a bad dtype, shape or stride. */
int wk_wire_ref_from_proto(const Baton__V1__TensorRef *t, uint32_t self, wk_ref *out, char *err,
                           size_t errlen);

#endif
