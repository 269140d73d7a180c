/* The worker's own shm segment (segment.h). */
#include "worker/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

static int name_ok(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

int wk_segment_name(char *buf, size_t len, const char *run_id, const char *worker)
{
    if (!name_ok(run_id) || !name_ok(worker))
        return BT_EINVAL;
    int n = snprintf(buf, len, "/baton-%s-%s", run_id, worker);
    /* NAME_MAX for a file under /dev/shm, less the leading slash. */
    return n < 0 || (size_t)n >= len || n > 255 ? BT_EINVAL : 0;
}

int wk_segment_create(wk_segment *s, const char *run_id, const char *worker, uint64_t bytes,
                      char *err, size_t errlen)
{
    *s = (wk_segment){0};
    if (wk_segment_name(s->name, sizeof(s->name), run_id, worker) != 0) {
        snprintf(err, errlen, "run id '%s' and worker name '%s' must be non-empty and made of "
                 "letters, digits, '.', '_' and '-'", run_id ? run_id : "",
                 worker ? worker : "");
        return BT_EINVAL;
    }
    /* shm_open sets FD_CLOEXEC itself; the fd is closed right after mmap
     * anyway, the mapping keeps the memory. */
    int fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Names are per run and per worker, so the holder is an earlier
         * incarnation of this very worker that died before the conductor
         * unlinked its segment. */
        bt_warn("shm segment %s exists (left by an earlier incarnation); replacing it", s->name);
        shm_unlink(s->name);
        fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s): %s", s->name, strerror(errno));
        return BT_EIO;
    }
    s->linked = true;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        snprintf(err, errlen, "ftruncate(%s, %llu): %s", s->name, (unsigned long long)bytes,
                 strerror(errno));
        goto err;
    }
    /* Reserve the pages now.  A sparse segment on a /dev/shm too small for
     * it would instead deliver SIGBUS at the first tensor written past the
     * free space, in the middle of a request; failing at start names the
     * cause. */
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    if (rc != 0) {
        snprintf(err, errlen, "cannot reserve %llu bytes for %s: %s",
                 (unsigned long long)bytes, s->name, strerror(rc));
        goto err;
    }
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s, %llu bytes): %s", s->name, (unsigned long long)bytes,
                 strerror(errno));
        goto err;
    }
    close(fd);
    s->base = base;
    s->size = bytes;
    return 0;
err:
    close(fd);
    wk_segment_unlink(s);
    return BT_EIO;
}

void wk_segment_unlink(wk_segment *s)
{
    if (s->linked) {
        s->linked = false;
        shm_unlink(s->name);
    }
}

void wk_segment_destroy(wk_segment *s)
{
    if (s->base)
        munmap(s->base, s->size);
    s->base = NULL;
    wk_segment_unlink(s);
}
