/* CURVE keys (common/curve.h) and the ZAP handler (daemon/zap.h): key
 * files read, checked and written; authorized-key sets; the ZAP decision;
 * and a real handshake over an ipc socket, let in or refused by the
 * handler and counted. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/curve.h"
#include "daemon/zap.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/baton-test-curve-%d", (int)getpid());
    return mkdir(dir, 0700);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *path_of(const char *name)
{
    static char buf[4][160];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 160, "%s/%s", dir, name);
    return p;
}

static void put(const char *name, const char *text, mode_t mode)
{
    FILE *f = fopen(path_of(name), "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path_of(name), mode), 0);
}

static void test_available(void **state)
{
    (void)state;
    /* This build's libzmq has CURVE (the tests below need it). */
    assert_true(bt_curve_available());
}

static void test_generate_derive_fingerprint(void **state)
{
    (void)state;
    bt_curve_keypair k;
    char pub[BT_CURVE_Z85_SIZE], fp[BT_CURVE_FINGERPRINT_LEN + 1];
    assert_int_equal(bt_curve_keypair_generate(&k), 0);
    assert_int_equal(strlen(k.public_z85), 40);
    assert_true(bt_curve_z85_valid(k.secret_z85, NULL));
    assert_int_equal(bt_curve_public_derive(k.secret_z85, pub), 0);
    assert_string_equal(pub, k.public_z85);
    assert_ptr_equal(bt_curve_fingerprint(k.public_z85, fp), fp);
    assert_int_equal(strlen(fp), 8);
    assert_memory_equal(fp, k.public_z85, 8);
    assert_string_equal(bt_curve_fingerprint("short", fp), "?");
    assert_int_equal(bt_curve_public_derive("short", pub), BT_CURVE_EFORMAT);
    assert_false(bt_curve_z85_valid("~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~", NULL));
    bt_curve_keypair_wipe(&k);
    assert_int_equal(k.secret_z85[0], 0);
    assert_string_equal(bt_curve_strerror(BT_CURVE_EPERM),
                        "a secret key file is readable by group or others");
    assert_string_equal(bt_curve_strerror(12345), "unknown error");
}

/* keygen's files: modes, contents, and no overwrite. */
static void test_write_and_load(void **state)
{
    (void)state;
    bt_curve_keypair k, back;
    char err[600], pub[BT_CURVE_Z85_SIZE];
    assert_int_equal(bt_curve_keypair_generate(&k), 0);
    assert_int_equal(bt_curve_keypair_write(dir, "alice", &k, err, sizeof(err)), 0);
    struct stat st;
    assert_int_equal(stat(path_of("alice.key"), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(stat(path_of("alice.pub"), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(bt_curve_secret_load(path_of("alice.key"), &back, err, sizeof(err)), 0);
    assert_string_equal(back.secret_z85, k.secret_z85);
    assert_string_equal(back.public_z85, k.public_z85);
    assert_int_equal(bt_curve_public_load(path_of("alice.pub"), pub, err, sizeof(err)), 0);
    assert_string_equal(pub, k.public_z85);

    /* Never overwritten, neither half. */
    bt_curve_keypair k2;
    assert_int_equal(bt_curve_keypair_generate(&k2), 0);
    assert_int_equal(bt_curve_keypair_write(dir, "alice", &k2, err, sizeof(err)),
                     BT_CURVE_EEXIST);
    assert_non_null(strstr(err, "never overwritten"));
    assert_int_equal(bt_curve_secret_load(path_of("alice.key"), &back, err, sizeof(err)), 0);
    assert_string_equal(back.secret_z85, k.secret_z85);
    unlink(path_of("alice.pub"));
    assert_int_equal(bt_curve_keypair_write(dir, "alice", &k2, err, sizeof(err)),
                     BT_CURVE_EEXIST);
    assert_int_equal(access(path_of("alice.pub"), F_OK), -1);
    assert_int_equal(bt_curve_keypair_write(dir, "a/b", &k2, err, sizeof(err)), BT_CURVE_EINVAL);

    /* The secret never appears in a message. */
    char line[64];
    snprintf(line, sizeof(line), "%s\n", k.secret_z85);
    put("open.key", line, 0644);
    assert_int_equal(bt_curve_secret_load(path_of("open.key"), &back, err, sizeof(err)),
                     BT_CURVE_EPERM);
    assert_non_null(strstr(err, "chmod 600"));
    assert_null(strstr(err, k.secret_z85));
    put("bad.key", "0123456789\n", 0600);
    assert_int_equal(bt_curve_secret_load(path_of("bad.key"), &back, err, sizeof(err)),
                     BT_CURVE_EFORMAT);
    assert_int_equal(bt_curve_secret_load(path_of("none.key"), &back, err, sizeof(err)),
                     BT_CURVE_EIO);

    /* A .pub twin of another key is refused, not trusted. */
    put("twin.key", line, 0600);
    snprintf(line, sizeof(line), "%s\n", k2.public_z85);
    put("twin.pub", line, 0644);
    assert_int_equal(bt_curve_secret_load(path_of("twin.key"), &back, err, sizeof(err)),
                     BT_CURVE_EMISMATCH);
    char twin[64];
    assert_int_equal(bt_curve_twin_path("/x/y.key", twin, sizeof(twin)), 0);
    assert_string_equal(twin, "/x/y.pub");
    assert_int_equal(bt_curve_twin_path("/x/y", twin, sizeof(twin)), BT_CURVE_EINVAL);
}

static void test_keyset(void **state)
{
    (void)state;
    bt_curve_keypair a, b, c;
    uint8_t ka[32], kb[32], kc[32];
    assert_int_equal(bt_curve_keypair_generate(&a), 0);
    assert_int_equal(bt_curve_keypair_generate(&b), 0);
    assert_int_equal(bt_curve_keypair_generate(&c), 0);
    assert_true(bt_curve_z85_valid(a.public_z85, ka));
    assert_true(bt_curve_z85_valid(b.public_z85, kb));
    assert_true(bt_curve_z85_valid(c.public_z85, kc));
    char text[512], err[600];
    snprintf(text, sizeof(text), "# authorized\n%s\n\n   %s\t\n# %s\n", a.public_z85, b.public_z85,
             c.public_z85);
    put("keys", text, 0644);
    bt_curve_keyset *s = bt_curve_keyset_create();
    int line = -1;
    assert_int_equal(bt_curve_keyset_load(s, path_of("keys"), &line, err, sizeof(err)), 0);
    assert_int_equal(bt_curve_keyset_count(s), 2);
    assert_true(bt_curve_keyset_contains(s, ka));
    assert_true(bt_curve_keyset_contains(s, kb));
    assert_false(bt_curve_keyset_contains(s, kc)); /* commented out */

    /* A bad line: its number, and the set left as it was. */
    snprintf(text, sizeof(text), "%s\n%s\n  not-a-key\n", c.public_z85, a.public_z85);
    put("bad", text, 0644);
    assert_int_equal(bt_curve_keyset_load(s, path_of("bad"), &line, err, sizeof(err)),
                     BT_CURVE_EFORMAT);
    assert_int_equal(line, 3);
    assert_non_null(strstr(err, "bad:3:3: not a public key"));
    assert_false(bt_curve_keyset_contains(s, kc));
    assert_int_equal(bt_curve_keyset_count(s), 2);

    assert_int_equal(bt_curve_keyset_add(s, c.public_z85), 0);
    assert_int_equal(bt_curve_keyset_add(s, c.public_z85), 0);
    assert_int_equal(bt_curve_keyset_count(s), 3);
    bt_curve_keyset_remove(s, a.public_z85);
    assert_false(bt_curve_keyset_contains(s, ka));
    assert_true(bt_curve_keyset_contains(s, kc));
    assert_int_equal(bt_curve_keyset_add(s, "nope"), BT_CURVE_EFORMAT);
    assert_false(bt_curve_keyset_contains(NULL, ka));
    bt_curve_keyset_destroy(s);
    bt_curve_keyset_destroy(NULL);

    /* Names after keys: a worker's keys (two while one is rolled over),
     * an unnamed key, and a key named again with its own name. */
    snprintf(text, sizeof(text), "%s gpu1\n%s\tgpu1  \n%s\n%s gpu1\n", a.public_z85,
             b.public_z85, c.public_z85, a.public_z85);
    put("named", text, 0644);
    s = bt_curve_keyset_create();
    assert_int_equal(bt_curve_keyset_load(s, path_of("named"), &line, err, sizeof(err)), 0);
    assert_int_equal(bt_curve_keyset_count(s), 3);
    assert_string_equal(bt_curve_keyset_name_of(s, ka), "gpu1");
    assert_string_equal(bt_curve_keyset_name_of(s, kb), "gpu1");
    assert_null(bt_curve_keyset_name_of(s, kc));
    assert_true(bt_curve_keyset_names(s, "gpu1"));
    assert_false(bt_curve_keyset_names(s, "gpu2"));
    assert_false(bt_curve_keyset_names(NULL, "gpu1"));
    /* Removing a key keeps the names of the others beside their keys. */
    bt_curve_keyset_remove(s, a.public_z85);
    assert_string_equal(bt_curve_keyset_name_of(s, kb), "gpu1");
    assert_null(bt_curve_keyset_name_of(s, kc));
    assert_null(bt_curve_keyset_name_of(s, ka));
    /* A key given two names, two words after a key, a name with a character
     * names do not have: errors at their line and column. */
    const char *bad[] = {"%s gpu1\n%s gpu2\n", "%s gpu1 gpu2\n", "%s gpu/1\n"};
    const int bad_line[] = {2, 1, 1};
    for (int i = 0; i < 3; i++) {
        snprintf(text, sizeof(text), bad[i], c.public_z85, c.public_z85);
        put("badname", text, 0644);
        assert_int_equal(bt_curve_keyset_load(s, path_of("badname"), &line, err, sizeof(err)),
                         BT_CURVE_EFORMAT);
        assert_int_equal(line, bad_line[i]);
        assert_non_null(strstr(err, ":42: "));
        assert_null(bt_curve_keyset_name_of(s, kc));
    }
    bt_curve_keyset_destroy(s);
}

/* The decision alone: per domain, per mechanism, per key. */
static void test_zap_decide(void **state)
{
    (void)state;
    bt_curve_keypair a, b, w;
    uint8_t ka[32], kb[32], kw[32];
    assert_int_equal(bt_curve_keypair_generate(&a), 0);
    assert_int_equal(bt_curve_keypair_generate(&b), 0);
    assert_int_equal(bt_curve_keypair_generate(&w), 0);
    assert_true(bt_curve_z85_valid(a.public_z85, ka));
    assert_true(bt_curve_z85_valid(b.public_z85, kb));
    assert_true(bt_curve_z85_valid(w.public_z85, kw));
    bt_curve_keyset *clients = bt_curve_keyset_create(), *workers = bt_curve_keyset_create();
    bt_curve_keyset *own_workers = bt_curve_keyset_create();
    assert_int_equal(bt_curve_keyset_add(clients, a.public_z85), 0);
    assert_int_equal(bt_curve_keyset_add(own_workers, w.public_z85), 0);
    const bt_curve_keyset *files[ZAP_N_SOCKETS] = {clients, workers};
    const bt_curve_keyset *own[ZAP_N_SOCKETS] = {NULL, own_workers};
    int which;
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "CURVE", ka, 32, files, own, &which), 200);
    assert_int_equal(which, ZAP_CLIENT);
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "CURVE", kb, 32, files, own, &which), 400);
    assert_int_equal(which, ZAP_CLIENT);
    /* A client's key does not open the worker socket, nor the reverse. */
    assert_int_equal(zap_decide(ZAP_DOMAIN_WORKER, "CURVE", ka, 32, files, own, &which), 400);
    assert_int_equal(which, ZAP_WORKER);
    assert_int_equal(zap_decide(ZAP_DOMAIN_WORKER, "CURVE", kw, 32, files, own, &which), 200);
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "CURVE", kw, 32, files, own, &which), 400);
    /* Other mechanisms and malformed credentials on a CURVE domain. */
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "NULL", NULL, 0, files, own, &which), 400);
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "PLAIN", ka, 32, files, own, &which), 400);
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "CURVE", ka, 31, files, own, &which), 400);
    /* An unknown domain is refused; a NULL request without one is not
     * ours to refuse. */
    assert_int_equal(zap_decide("other", "CURVE", ka, 32, files, own, &which), 400);
    assert_int_equal(which, -1);
    assert_int_equal(zap_decide("", "NULL", NULL, 0, files, own, &which), 200);
    assert_int_equal(zap_decide(ZAP_DOMAIN_CLIENT, "CURVE", ka, 32, NULL, NULL, &which), 400);
    bt_curve_keyset_destroy(clients);
    bt_curve_keyset_destroy(workers);
    bt_curve_keyset_destroy(own_workers);
}

/* The User-Id of the last message serve_for got ("" when it had none). */
static char last_user_id[64];

/* Polls the server socket and the ZAP handler for up to MS; returns
 * whether the server got a message. */
static bool serve_for(void *server, zap *z, int ms)
{
    for (int t = 0; t < ms; t += 20) {
        zmq_pollitem_t it[2] = {{server, 0, ZMQ_POLLIN, 0}, {zap_sock(z), 0, ZMQ_POLLIN, 0}};
        assert_true(zmq_poll(it, 2, 20) >= 0);
        if (it[1].revents & ZMQ_POLLIN)
            zap_on_readable(NULL, z);
        if (it[0].revents & ZMQ_POLLIN) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            last_user_id[0] = 0;
            while (zmq_msg_recv(&m, server, ZMQ_DONTWAIT) >= 0) {
                const char *uid = zmq_msg_gets(&m, "User-Id");
                snprintf(last_user_id, sizeof(last_user_id), "%s", uid ? uid : "");
                if (!zmq_msg_more(&m))
                    break;
            }
            zmq_msg_close(&m);
            return true;
        }
    }
    return false;
}

/* Sends one frame from a DEALER connected with OWN (NULL: no CURVE at
 * all) and says whether the server got it. */
static bool try_client(void *ctx, const char *ep, void *server, zap *z,
                       const bt_curve_keypair *own, const char *server_pub)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    if (own)
        assert_int_equal(bt_curve_apply_client(d, own, server_pub), 0);
    assert_int_equal(zmq_connect(d, ep), 0);
    zmq_send(d, "hi", 2, ZMQ_DONTWAIT);
    bool got = serve_for(server, z, 1500);
    zmq_close(d);
    return got;
}

/* The handler in a real context: an authorized key gets through, an
 * unknown key and a keyless client do not, and the refusal is counted. */
static void test_zap_handshake(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    zap *z = NULL;
    assert_int_equal(zap_create(ctx, &z), 0);
    bt_curve_keypair srv, good, bad, spawned;
    assert_int_equal(bt_curve_keypair_generate(&srv), 0);
    assert_int_equal(bt_curve_keypair_generate(&good), 0);
    assert_int_equal(bt_curve_keypair_generate(&bad), 0);
    assert_int_equal(bt_curve_keypair_generate(&spawned), 0);
    bt_curve_keyset *files = bt_curve_keyset_create();
    assert_int_equal(bt_curve_keyset_add(files, good.public_z85), 0);
    zap_set_file_keys(z, ZAP_CLIENT, files);

    void *server = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    assert_int_equal(zmq_setsockopt(server, ZMQ_LINGER, &zero, sizeof(zero)), 0);
    assert_int_equal(bt_curve_apply_server(server, &srv, ZAP_DOMAIN_CLIENT), 0);
    char ep[96];
    snprintf(ep, sizeof(ep), "ipc://%s/s.sock", dir);
    assert_int_equal(zmq_bind(server, ep), 0);

    void *cctx = zmq_ctx_new(); /* clients in a context without a handler */
    assert_true(try_client(cctx, ep, server, z, &good, srv.public_z85));
    assert_int_equal(zap_refused(z, ZAP_CLIENT), 0);
    /* Its messages carry its public key as their User-Id. */
    assert_string_equal(last_user_id, good.public_z85);
    assert_false(try_client(cctx, ep, server, z, &bad, srv.public_z85));
    assert_int_equal(zap_refused(z, ZAP_CLIENT), 1);
    assert_false(try_client(cctx, ep, server, z, NULL, NULL));
    /* batond's own keys: allowed while authorized, then not. */
    assert_false(try_client(cctx, ep, server, z, &spawned, srv.public_z85));
    assert_int_equal(zap_allow(z, ZAP_CLIENT, spawned.public_z85), 0);
    assert_true(try_client(cctx, ep, server, z, &spawned, srv.public_z85));
    zap_disallow(z, ZAP_CLIENT, spawned.public_z85);
    assert_false(try_client(cctx, ep, server, z, &spawned, srv.public_z85));
    assert_int_equal(zap_refused(z, ZAP_CLIENT), 3);
    assert_int_equal(zap_refused(z, ZAP_WORKER), 0);
    /* A wrong server key: the handshake fails before any ZAP request. */
    assert_false(try_client(cctx, ep, server, z, &good, bad.public_z85));

    zmq_close(server);
    zap_destroy(z);
    zap_destroy(NULL);
    zmq_ctx_term(cctx);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_available),
        cmocka_unit_test(test_generate_derive_fingerprint),
        cmocka_unit_test(test_write_and_load),
        cmocka_unit_test(test_keyset),
        cmocka_unit_test(test_zap_decide),
        cmocka_unit_test(test_zap_handshake),
    };
    return cmocka_run_group_tests_name("curve", tests, setup, teardown);
}
