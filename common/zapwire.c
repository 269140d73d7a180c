/* The wire side of a ZAP handler (common/zapwire.h). */
#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "common/zapwire.h"

/* Frames of a request: version, request id, domain, address, routing id,
 * mechanism, then the mechanism's credentials (one for CURVE). */
#define ZAP_MAX_FRAMES 8

int bt_zap_bind(void *zctx, void **out)
{
    int zero = 0;
    void *s = zmq_socket(zctx, ZMQ_REP);
    if (!s)
        return -1;
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_bind(s, BT_ZAP_ENDPOINT) != 0) {
        int e = errno;
        zmq_close(s);
        errno = e;
        return -1;
    }
    *out = s;
    return 0;
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
 * answer even when the request is malformed) and answers it.  1 answered,
 * 0 nothing waiting, -1 the answer could not go. */
static int answer_one(void *rep, bt_zap_decide_fn decide, void *arg)
{
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch, *m = n < ZAP_MAX_FRAMES ? &f[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, rep, ZMQ_DONTWAIT) < 0) {
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
        return 0;
    int status = 400;
    const char *user_id = NULL;
    if (n >= 6) {
        bt_zap_request req;
        memset(&req, 0, sizeof(req));
        frame_str(&f[0], req.version, sizeof(req.version));
        frame_str(&f[2], req.domain, sizeof(req.domain));
        frame_str(&f[3], req.address, sizeof(req.address));
        frame_str(&f[5], req.mechanism, sizeof(req.mechanism));
        req.cred = n >= 7 ? zmq_msg_data(&f[6]) : NULL;
        req.cred_len = n >= 7 ? zmq_msg_size(&f[6]) : 0;
        if (strcmp(req.version, "1.0") == 0)
            status = decide(arg, &req, &user_id);
    }
    /* The reply: version, request id (echoed), status code, status text,
     * user id, metadata. */
    const char *code = status == 200 ? "200" : "400";
    const char *text = status == 200 ? "OK" : "not authorized";
    if (!user_id)
        user_id = "";
    int rc = zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(rep, n >= 2 ? zmq_msg_data(&f[1]) : "", n >= 2 ? zmq_msg_size(&f[1]) : 0,
                      ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(rep, code, 3, ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(rep, text, strlen(text), ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(rep, user_id, strlen(user_id), ZMQ_SNDMORE);
    if (rc >= 0)
        rc = zmq_send(rep, "", 0, 0);
    int e = errno;
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    errno = e;
    return rc < 0 ? -1 : 1;
}

int bt_zap_serve(void *rep, bt_zap_decide_fn decide, void *arg)
{
    int answered = 0;
    for (;;) {
        int events = 0;
        size_t len = sizeof(events);
        if (zmq_getsockopt(rep, ZMQ_EVENTS, &events, &len) != 0 || !(events & ZMQ_POLLIN))
            return answered;
        int rc = answer_one(rep, decide, arg);
        if (rc < 0)
            return -1;
        if (rc == 0)
            return answered;
        answered++;
    }
}
