/* Whole files mapped read-only (mapfile.h). */
#include "common/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int bt_mapfile_map(const char *path, const char *name, void **data, size_t *size, char *err,
                   size_t errlen)
{
    *data = NULL;
    *size = 0;
    if (!name)
        name = path;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bt_errorf(err, errlen, BT_EIO, "%s: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: fstat: %s", name, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: not a regular file", name);
        goto out;
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = bt_errorf(err, errlen, BT_EIO, "%s: mmap: %s", name, strerror(errno));
            goto out;
        }
        *data = m;
        *size = (size_t)st.st_size;
    }
out:
    close(fd);
    return rc;
}

void bt_mapfile_unmap(void *data, size_t size)
{
    if (data)
        munmap(data, size);
}
