/* Who may register as which worker: the supervisor's check of a Register.
 *
 * On a CURVE worker socket every connection authenticated with a public
 * key, which the ZAP handler hands back as the connection's User-Id
 * (daemon/zap.h).  A Register only names the worker it speaks for, so the
 * name alone proves nothing: any peer holding an authorized key could
 * claim a live worker's name, take its requests and answer them.  The
 * check binds the name to the key:
 *
 *   - a worker batond spawns must come with the key pair batond made for
 *     that spawn;
 *   - a worker whose name a line of worker_keys gives after a key must
 *     come with one of the keys that name;
 *   - a key that a line names for a worker, or that batond made for a
 *     spawn, or that a live worker registered with, speaks for that worker
 *     only;
 *   - a live worker cannot be taken over by another key: the one it
 *     registered with must come back (a restart, a reconnect);
 *   - the public key a Register offers its peers (Register.curve_public_key)
 *     must be the one the connection authenticated with.
 *
 * Without CURVE (an ipc:// worker socket, whose file mode is the guard)
 * there is no key to bind, and none of this applies. */
#ifndef BATON_DAEMON_IDENTITY_H
#define BATON_DAEMON_IDENTITY_H

#include "common/curve.h"
#include "daemon/workers.h"

typedef enum ident_verdict {
    IDENT_OK = 0,
    IDENT_UNKNOWN_WORKER,   /* the name is no worker of the config */
    IDENT_CONNECTION_TAKEN, /* this connection registered as another worker */
    IDENT_NO_KEY,           /* a CURVE socket, yet no key came with the message */
    IDENT_NOT_ITS_KEY,      /* the worker's keys are known, and this is not one of them */
    IDENT_KEY_OF_ANOTHER,   /* the key speaks for another worker */
    IDENT_NAME_IN_USE,      /* the worker is live under another key */
    IDENT_CLAIMED_KEY,      /* the Register offers its peers a key not its own */
    IDENT_N
} ident_verdict;

/* Whether the connection that authenticated with KEY (Z85; NULL when it
 * carries none) may register as worker W, offering its peers CLAIMED (Z85,
 * "" or NULL: none).  NAMED is the worker socket's authorized-keys file
 * (may be NULL).  WS holds W and the other workers: their spawn keys
 * (key_public) and the keys they registered with (auth_key). */
ident_verdict ident_check(worker_set *ws, const sup_worker *w, const char *key,
                          const char *claimed, const bt_curve_keyset *named);

/* A sentence saying why V refused a registration. */
const char *ident_strerror(ident_verdict v);
/* V's label in baton_worker_registrations_refused_total ("unknown_worker"...). */
const char *ident_label(ident_verdict v);

#endif
