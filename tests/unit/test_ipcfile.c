/* The socket file behind an ipc:// endpoint (common/ipcfile.h): the path
 * of an endpoint, and each state a probe tells apart: no file, a socket a
 * process listens on, a socket file nobody listens on, and a file that is
 * no socket. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/ipcfile.h"

static void test_path(void **state)
{
    (void)state;
    assert_string_equal(bt_ipcfile_path("ipc:///tmp/x/baton.sock"), "/tmp/x/baton.sock");
    assert_string_equal(bt_ipcfile_path("ipc://rel.sock"), "rel.sock");
    assert_null(bt_ipcfile_path("ipc://@abstract"));
    assert_null(bt_ipcfile_path("ipc://"));
    assert_null(bt_ipcfile_path("tcp://127.0.0.1:5555"));
    assert_null(bt_ipcfile_path(NULL));
}

/* A unix socket bound at PATH; listening when LISTEN.  Returns its fd. */
static int bound(const char *path, int listen_too)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (listen_too)
        assert_int_equal(listen(fd, 4), 0);
    return fd;
}

static void test_probe(void **state)
{
    (void)state;
    char dir[] = "/tmp/baton-test-ipcfile-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], file[256];
    snprintf(path, sizeof(path), "%s/baton.sock", dir);
    snprintf(file, sizeof(file), "%s/plain", dir);

    assert_int_equal(bt_ipcfile_probe(path), BT_IPCFILE_ABSENT);
    snprintf(file, sizeof(file), "%s/no/such/folder.sock", dir);
    assert_int_equal(bt_ipcfile_probe(file), BT_IPCFILE_ABSENT);

    /* Listening: a daemon is there. */
    int fd = bound(path, 1);
    assert_int_equal(bt_ipcfile_probe(path), BT_IPCFILE_LISTENING);
    /* Its process gone, the file stays: stale. */
    close(fd);
    assert_int_equal(bt_ipcfile_probe(path), BT_IPCFILE_STALE);
    assert_int_equal(unlink(path), 0);
    /* Bound but not listening refuses too: nobody serves it. */
    fd = bound(path, 0);
    assert_int_equal(bt_ipcfile_probe(path), BT_IPCFILE_STALE);
    close(fd);
    assert_int_equal(unlink(path), 0);

    /* A file that is no socket is neither: the caller leaves it alone. */
    snprintf(file, sizeof(file), "%s/plain", dir);
    int f = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    assert_true(f >= 0);
    close(f);
    assert_int_equal(bt_ipcfile_probe(file), BT_IPCFILE_UNKNOWN);
    assert_int_equal(errno, ENOTSOCK);
    assert_int_equal(unlink(file), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
