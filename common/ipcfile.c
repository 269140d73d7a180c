/* The socket file behind an ipc:// endpoint (common/ipcfile.h). */
#include "common/ipcfile.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

const char *bt_ipcfile_path(const char *endpoint)
{
    if (!endpoint || strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@' ||
        endpoint[6] == '\0')
        return NULL;
    return endpoint + 6;
}

bt_ipcfile_state bt_ipcfile_probe(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT || errno == ENOTDIR ? BT_IPCFILE_ABSENT : BT_IPCFILE_UNKNOWN;
    if (!S_ISSOCK(st.st_mode)) {
        errno = ENOTSOCK;
        return BT_IPCFILE_UNKNOWN;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        return BT_IPCFILE_UNKNOWN;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return BT_IPCFILE_UNKNOWN;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    /* A listener whose backlog is full refuses with EAGAIN: it is there. */
    if (rc == 0 || e == EAGAIN)
        return BT_IPCFILE_LISTENING;
    /* Refused: the file is a socket nobody has bound and listens on.
     * Gone in between: it was just removed. */
    if (e == ECONNREFUSED)
        return BT_IPCFILE_STALE;
    if (e == ENOENT)
        return BT_IPCFILE_ABSENT;
    errno = e;
    return BT_IPCFILE_UNKNOWN;
}
