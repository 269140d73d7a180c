/* The conductor refuses to serve on a socket whose options it could not
 * set, and says which one.  Linked with -Wl,--wrap=zmq_setsockopt (see the
 * Makefile), so the Nth call from the daemon code can be made to fail. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "common/log.h"
#include "daemon/conductor.h"

int __real_zmq_setsockopt(void *s, int option, const void *value, size_t len);
int __wrap_zmq_setsockopt(void *s, int option, const void *value, size_t len);

static int calls, fail_at;

int __wrap_zmq_setsockopt(void *s, int option, const void *value, size_t len)
{
    if (++calls == fail_at) {
        errno = EINVAL;
        return -1;
    }
    return __real_zmq_setsockopt(s, option, value, len);
}

/* Runs conductor_create on CFG with stderr in a file; returns its result
 * and what it logged (malloc'd) in *LOG. */
static int create_logged(const char *cfg, const char *log_path, char **log)
{
    fflush(stderr);
    int saved = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    conductor *c = NULL;
    int rc = conductor_create(cfg, &c);
    if (c)
        conductor_destroy(c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(log_path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 65536);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = 0;
    fclose(f);
    *log = buf;
    return rc;
}

static void test_each_option_checked(void **state)
{
    (void)state;
    char dir[] = "/tmp/baton-sockopt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg[256], log_path[256];
    snprintf(cfg, sizeof(cfg), "%s/baton.yaml", dir);
    snprintf(log_path, sizeof(log_path), "%s/log", dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f,
            "version: 1\n"
            "daemon:\n"
            "  listen: ipc://%s/baton.sock\n"
            "  workers_endpoint: ipc://%s/workers.sock\n"
            "workers:\n"
            "  - {name: cpu0, device: cpu, pool_mb: 16}\n"
            "models:\n"
            "  - {name: echo0, backend: echo, worker: cpu0}\n"
            "graphs:\n"
            "  - name: echo\n"
            "    inputs: [x]\n"
            "    body:\n"
            "      node: {name: e, model: echo0, inputs: [x], outputs: [{name: x, to: client}]}\n",
            dir, dir);
    fclose(f);
    char worker[512];
    const char *build = getenv("BUILD");
    snprintf(worker, sizeof(worker), "%s/baton-worker", build ? build : "build");
    setenv("BATON_WORKER", worker, 1);

    /* Every option the conductor sets: both routers' high-water marks,
     * linger and MANDATORY, the client router's frame size cap. */
    int n = 0;
    for (;; n++) {
        calls = 0;
        fail_at = n + 1;
        char *log = NULL;
        int rc = create_logged(cfg, log_path, &log);
        bool failed = calls >= fail_at;
        if (failed) {
            if (rc == 0 || !strstr(log, "cannot set ZMQ_"))
                fail_msg("setsockopt call %d failed, yet conductor_create returned %d and "
                         "logged: %s", n + 1, rc, log);
        } else {
            if (rc != 0)
                fail_msg("conductor_create: %d: %s", rc, log);
        }
        free(log);
        if (!failed)
            break;
    }
    assert_int_equal(n, 9);
    unlink(cfg);
    unlink(log_path);
    char sock[256];
    snprintf(sock, sizeof(sock), "%s/baton.sock", dir);
    unlink(sock);
    snprintf(sock, sizeof(sock), "%s/workers.sock", dir);
    unlink(sock);
    rmdir(dir);
}

int main(void)
{
    bt_log_init("test", BT_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_option_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
