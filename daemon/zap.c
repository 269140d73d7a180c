/* The ZAP handler (daemon/zap.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "common/status.h"
#include "daemon/zap.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
/* Frames of a request: version, request id, domain, address, routing id,
 * mechanism, then the mechanism's credentials (one for CURVE). */
#define ZAP_MAX_FRAMES 8

struct zap {
    void *sock;                            /* the REP socket; owned */
    bt_curve_keyset *files[ZAP_N_SOCKETS]; /* keys of client_keys / worker_keys; owned */
    bt_curve_keyset *own[ZAP_N_SOCKETS];   /* batond's own pairs (gateway, spawns); owned */
    uint64_t refused[ZAP_N_SOCKETS];       /* peers refused since start */
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
    int zero = 0;
    for (int i = 0; i < ZAP_N_SOCKETS; i++)
        if (!(z->own[i] = bt_curve_keyset_create()))
            goto nomem;
    if (!(z->sock = zmq_socket(zctx, ZMQ_REP)) ||
        zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
        bt_error("cannot start the ZAP handler on %s: %s", ZAP_ENDPOINT, zmq_strerror(errno));
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

uint64_t zap_refused(const zap *z, zap_socket which)
{
    return z ? z->refused[which] : 0;
}

/* A frame's bytes as a NUL-terminated string (cut at CAP - 1). */
static void frame_str(zmq_msg_t *m, char *out, size_t cap)
{
    size_t n = zmq_msg_size(m);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, zmq_msg_data(m), n);
    out[n] = 0;
}

/* Reads one whole request (every frame, so that the REP socket is ready to
 * answer even when the request is malformed) and answers it. */
static void answer_one(zap *z)
{
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch, *m = n < ZAP_MAX_FRAMES ? &f[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, z->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            break;
        }
        more = zmq_msg_more(m);
        if (m == &scratch)
            zmq_msg_close(m);
        else
            n++;
    }
    if (n == 0)
        return;
    char version[8] = "", domain[256] = "", mechanism[32] = "";
    int status = 400, which = -1;
    if (n >= 6) {
        frame_str(&f[0], version, sizeof(version));
        frame_str(&f[2], domain, sizeof(domain));
        frame_str(&f[5], mechanism, sizeof(mechanism));
        const uint8_t *cred = n >= 7 ? zmq_msg_data(&f[6]) : NULL;
        size_t cred_len = n >= 7 ? zmq_msg_size(&f[6]) : 0;
        const bt_curve_keyset *files[ZAP_N_SOCKETS] = {z->files[0], z->files[1]};
        const bt_curve_keyset *own[ZAP_N_SOCKETS] = {z->own[0], z->own[1]};
        if (strcmp(version, "1.0") == 0)
            status = zap_decide(domain, mechanism, cred, cred_len, files, own, &which);
        if (status != 200 && which >= 0) {
            z->refused[which]++;
            char fp[BT_CURVE_FINGERPRINT_LEN + 1] = "?", addr[64];
            if (cred_len == 32) {
                char z85[BT_CURVE_Z85_SIZE];
                if (zmq_z85_encode(z85, cred, 32))
                    bt_curve_fingerprint(z85, fp);
            }
            frame_str(&f[3], addr, sizeof(addr));
            bt_warn("refused a %s peer from %s on the %s socket: its public key (%s...) is not "
                    "authorized", mechanism, addr, socket_names[which], fp);
        }
    }
    /* The reply: version, request id (echoed), status code, status text,
     * user id, metadata. */
    const char *code = status == 200 ? "200" : "400";
    const char *text = status == 200 ? "OK" : "not authorized";
    int rc = zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(z->sock, n >= 2 ? zmq_msg_data(&f[1]) : "", n >= 2 ? zmq_msg_size(&f[1]) : 0,
                      ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(z->sock, code, 3, ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(z->sock, text, strlen(text), ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(z->sock, which >= 0 ? socket_names[which] : "",
                      which >= 0 ? strlen(socket_names[which]) : 0, ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(z->sock, "", 0, 0);
    if (rc < 0)
        bt_warn("cannot answer a ZAP request: %s", zmq_strerror(errno));
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

void zap_on_readable(evloop *l, void *arg)
{
    (void)l;
    zap *z = arg;
    for (;;) {
        int events = 0;
        size_t len = sizeof(events);
        if (zmq_getsockopt(z->sock, ZMQ_EVENTS, &events, &len) != 0 || !(events & ZMQ_POLLIN))
            return;
        answer_one(z);
    }
}
