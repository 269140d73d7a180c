/* The ZAP handler of batond (ZeroMQ's authentication protocol, RFC 27):
 * libzmq asks it, over inproc://zeromq.zap.01, whether a peer that
 * completed a CURVE handshake on one of batond's tcp:// sockets may in.
 * The answer is yes when the peer's public key is authorized for that
 * socket: the client ROUTER and the worker ROUTER set different ZAP
 * domains, each with its own keys (daemon.curve client_keys and
 * worker_keys, plus the key pairs batond makes itself for its HTTP gateway
 * and for the workers it spawns).  Refusals are counted per socket for
 * baton_auth_refused_total.  A peer let in gets its public key (Z85) as
 * its User-Id, which libzmq attaches to each of its messages.
 *
 * The REP socket is one more socket of the conductor's loop
 * (daemon/evloop.c) rather than a thread of its own: the key sets change
 * on that loop (a spawn authorizes the new worker's key, SIGHUP re-reads
 * the files), so reading them there needs no lock, and a handshake waits
 * at most one loop round for its answer.  Sockets without a ZAP domain
 * (the ipc:// ones, NULL mechanism) never ask: libzmq consults ZAP for the
 * NULL mechanism only when a domain is set. */
#ifndef BATON_DAEMON_ZAP_H
#define BATON_DAEMON_ZAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/evloop.h"

/* The ZAP domains of the two sockets. */
#define ZAP_DOMAIN_CLIENT "baton-client"
#define ZAP_DOMAIN_WORKER "baton-worker"

typedef enum zap_socket { ZAP_CLIENT = 0, ZAP_WORKER = 1, ZAP_N_SOCKETS = 2 } zap_socket;

typedef struct zap zap;

/* The decision for one request, a pure function: 200 when MECHANISM is
 * "CURVE", DOMAIN names one of the sockets and the 32-byte CRED is in
 * ALLOWED[that socket] or EXTRA[that socket] (either may be NULL); else
 * 400.  A NULL-mechanism request without a domain (a socket batond did not
 * make a CURVE server) is 200.  *WHICH is the socket the domain names, or
 * -1. */
int zap_decide(const char *domain, const char *mechanism, const uint8_t *cred, size_t cred_len,
               const bt_curve_keyset *const allowed[ZAP_N_SOCKETS],
               const bt_curve_keyset *const extra[ZAP_N_SOCKETS], int *which);

/* Binds the handler in ZCTX (before any CURVE socket of ZCTX binds, so
 * that no peer gets in unasked).  0 or a negative bt_err. */
int zap_create(void *zctx, zap **out);
/* NULL is a no-op. */
void zap_destroy(zap *z);

/* The REP socket, for evloop_add with zap_on_readable. */
void *zap_sock(const zap *z);
/* Answers every request waiting (an evloop callback; ARG is the zap). */
void zap_on_readable(evloop *l, void *arg);

/* The keys read from the file for socket WHICH (NULL: none); valid until
 * the next zap_set_file_keys. */
const bt_curve_keyset *zap_file_keys(const zap *z, zap_socket which);
/* Replaces the keys read from a file for socket WHICH with SET (taken;
 * NULL: none). */
void zap_set_file_keys(zap *z, zap_socket which, bt_curve_keyset *set);
/* Authorizes, or stops authorizing, one of batond's own public keys on
 * socket WHICH (the gateway's, a spawned worker's).  0 or BT_ENOMEM. */
int zap_allow(zap *z, zap_socket which, const char *public_z85);
void zap_disallow(zap *z, zap_socket which, const char *public_z85);

/* Watches SOCK, batond's CURVE server for socket WHICH, with a ZeroMQ
 * socket monitor: a peer without CURVE at all fails the handshake on a
 * mechanism mismatch before ZAP is asked, and is then refused, logged and
 * counted like the peers ZAP refuses.  Call once per socket, before it
 * binds.  0 or a negative bt_err. */
int zap_watch(zap *z, void *sock, zap_socket which);
/* The PAIR that reads the events of socket WHICH (NULL when not watched),
 * for evloop_add with zap_on_monitor (ARG: the zap). */
void *zap_monitor_sock(const zap *z, zap_socket which);
void zap_on_monitor(evloop *l, void *arg);

/* Peers refused on socket WHICH since start (by ZAP, or for coming
 * without CURVE). */
uint64_t zap_refused(const zap *z, zap_socket which);

#endif
