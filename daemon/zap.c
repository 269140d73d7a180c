/* The ZAP handler (daemon/zap.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/zapwire.h"
#include "daemon/zap.h"

struct zap {
    void *sock;                            /* the REP socket; owned */
    bt_curve_keyset *files[ZAP_N_SOCKETS]; /* keys of client_keys / worker_keys; owned */
    bt_curve_keyset *own[ZAP_N_SOCKETS];   /* batond's own pairs (gateway, spawns); owned */
    uint64_t refused[ZAP_N_SOCKETS];       /* peers refused since start */
    void *zctx;                            /* borrowed: where the monitors live */
    void *monitor[ZAP_N_SOCKETS];          /* PAIRs reading zap_watch's events; owned */
    bt_log_gate keyless[ZAP_N_SOCKETS];    /* the warnings of keyless refusals */
    char user_id[BT_CURVE_Z85_SIZE];       /* the User-Id of the answer being sent */
};

static const char *const socket_names[ZAP_N_SOCKETS] = {"client", "worker"};

int zap_decide(const char *domain, const char *mechanism, const uint8_t *cred, size_t cred_len,
               const bt_curve_keyset *const allowed[ZAP_N_SOCKETS],
               const bt_curve_keyset *const extra[ZAP_N_SOCKETS], int *which)
{
    *which = -1;
    if (strcmp(domain, ZAP_DOMAIN_CLIENT) == 0)
        *which = ZAP_CLIENT;
    else if (strcmp(domain, ZAP_DOMAIN_WORKER) == 0)
        *which = ZAP_WORKER;
    if (*which < 0)
        return strcmp(mechanism, "NULL") == 0 && !*domain ? 200 : 400;
    if (strcmp(mechanism, "CURVE") != 0 || !cred || cred_len != 32)
        return 400;
    if ((allowed && bt_curve_keyset_contains(allowed[*which], cred)) ||
        (extra && bt_curve_keyset_contains(extra[*which], cred)))
        return 200;
    return 400;
}

int zap_create(void *zctx, zap **out)
{
    *out = NULL;
    zap *z = calloc(1, sizeof(*z));
    if (!z)
        return BT_ENOMEM;
    for (int i = 0; i < ZAP_N_SOCKETS; i++)
        if (!(z->own[i] = bt_curve_keyset_create()))
            goto nomem;
    z->zctx = zctx;
    if (bt_zap_bind(zctx, &z->sock) != 0) {
        bt_error("cannot start the ZAP handler on %s: %s", BT_ZAP_ENDPOINT, zmq_strerror(errno));
        zap_destroy(z);
        return BT_EIO;
    }
    *out = z;
    return 0;
nomem:
    zap_destroy(z);
    return BT_ENOMEM;
}

void zap_destroy(zap *z)
{
    if (!z)
        return;
    if (z->sock)
        zmq_close(z->sock);
    for (int i = 0; i < ZAP_N_SOCKETS; i++)
        if (z->monitor[i])
            zmq_close(z->monitor[i]);
    for (int i = 0; i < ZAP_N_SOCKETS; i++) {
        bt_curve_keyset_destroy(z->files[i]);
        bt_curve_keyset_destroy(z->own[i]);
    }
    free(z);
}

void *zap_sock(const zap *z)
{
    return z->sock;
}

void zap_set_file_keys(zap *z, zap_socket which, bt_curve_keyset *set)
{
    bt_curve_keyset_destroy(z->files[which]);
    z->files[which] = set;
}

int zap_allow(zap *z, zap_socket which, const char *public_z85)
{
    int rc = bt_curve_keyset_add(z->own[which], public_z85);
    return rc == 0 ? 0 : rc == BT_CURVE_ENOMEM ? BT_ENOMEM : BT_EINVAL;
}

void zap_disallow(zap *z, zap_socket which, const char *public_z85)
{
    bt_curve_keyset_remove(z->own[which], public_z85);
}

const bt_curve_keyset *zap_file_keys(const zap *z, zap_socket which)
{
    return z ? z->files[which] : NULL;
}

uint64_t zap_refused(const zap *z, zap_socket which)
{
    return z ? z->refused[which] : 0;
}

/* The decision for one request (a bt_zap_decide_fn): zap_decide, and a
 * refusal counted and logged with the peer's address and key fingerprint. */
static int decide(void *arg, const bt_zap_request *req, const char **user_id)
{
    zap *z = arg;
    int which = -1;
    const bt_curve_keyset *files[ZAP_N_SOCKETS] = {z->files[0], z->files[1]};
    const bt_curve_keyset *own[ZAP_N_SOCKETS] = {z->own[0], z->own[1]};
    int status = zap_decide(req->domain, req->mechanism, req->cred, req->cred_len, files, own,
                            &which);
    /* The User-Id is the peer's public key: libzmq puts it in the metadata
     * of every message from that connection, where the supervisor reads
     * which key a worker authenticated with (daemon/identity.h).  ZAP's
     * properties go in before the peer's own, so a peer cannot name one. */
    if (status == 200 && which >= 0 && zmq_z85_encode(z->user_id, req->cred, 32))
        *user_id = z->user_id;
    if (status != 200 && which >= 0) {
        z->refused[which]++;
        char fp[BT_CURVE_FINGERPRINT_LEN + 1] = "?";
        if (req->cred_len == 32) {
            char z85[BT_CURVE_Z85_SIZE];
            if (zmq_z85_encode(z85, req->cred, 32))
                bt_curve_fingerprint(z85, fp);
        }
        bt_warn("refused a %s peer from %s on the %s socket: its public key (%s...) is not "
                "authorized", req->mechanism, req->address, socket_names[which], fp);
    }
    return status;
}

int zap_watch(zap *z, void *sock, zap_socket which)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "inproc://baton-zap-monitor-%s", socket_names[which]);
    if (z->monitor[which] ||
        zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
        return BT_EIO;
    void *pair = zmq_socket(z->zctx, ZMQ_PAIR);
    if (!pair)
        return BT_EIO;
    int zero = 0;
    zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_connect(pair, ep) != 0) {
        zmq_close(pair);
        return BT_EIO;
    }
    z->monitor[which] = pair;
    return 0;
}

void *zap_monitor_sock(const zap *z, zap_socket which)
{
    return z ? z->monitor[which] : NULL;
}

/* One handshake on socket WHICH that failed before ZAP was asked (a peer
 * without CURVE, MISMATCH when ZeroMQ saw that; or one that broke the
 * handshake off): counted; logged at most once a second (such a client
 * reconnects every 100 ms), with how many came since the last line. */
static void refuse_keyless(zap *z, zap_socket which, const char *endpoint, bool mismatch)
{
    z->refused[which]++;
    uint64_t n;
    if (!bt_log_gate_pass(&z->keyless[which], bt_now_ms(), &n))
        return;
    bt_warn("refused %llu peer%s on the %s socket (%s): %s", (unsigned long long)n,
            n == 1 ? "" : "s", socket_names[which], endpoint,
            mismatch ? "the handshake offered another security mechanism than CURVE"
                     : "the handshake failed before its key was checked (no CURVE, or broken "
                       "off)");
}

void zap_on_monitor(evloop *l, void *arg)
{
    (void)l;
    zap *z = arg;
    for (int w = 0; w < ZAP_N_SOCKETS; w++) {
        if (!z->monitor[w])
            continue;
        /* An event is two frames: 6 bytes (the event, u16, and its value,
         * u32, in host order), then the endpoint. */
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        while (zmq_msg_recv(&ev, z->monitor[w], ZMQ_DONTWAIT) >= 0) {
            uint16_t event = 0;
            uint32_t value = 0;
            if (zmq_msg_size(&ev) >= 6) {
                memcpy(&event, zmq_msg_data(&ev), 2);
                memcpy(&value, (const uint8_t *)zmq_msg_data(&ev) + 2, 4);
            }
            char endpoint[128] = "";
            zmq_msg_init(&addr);
            if (zmq_msg_more(&ev) && zmq_msg_recv(&addr, z->monitor[w], 0) >= 0) {
                size_t n = zmq_msg_size(&addr);
                n = n < sizeof(endpoint) - 1 ? n : sizeof(endpoint) - 1;
                memcpy(endpoint, zmq_msg_data(&addr), n);
                endpoint[n] = 0;
            }
            zmq_msg_close(&addr);
            /* A peer without CURVE fails on the mechanism mismatch when
             * batond reads its greeting first; when the peer reads
             * batond's first, it hangs up, and batond's side fails with
             * no detail (EPIPE, ECONNRESET): which one comes is a race. */
            if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
                refuse_keyless(z, (zap_socket)w, endpoint,
                               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
                                   value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH);
        }
        zmq_msg_close(&ev);
    }
}

void zap_on_readable(evloop *l, void *arg)
{
    (void)l;
    zap *z = arg;
    if (bt_zap_serve(z->sock, decide, z) < 0)
        bt_warn("cannot answer a ZAP request: %s", zmq_strerror(errno));
}
