/* The cache of peers' pools (peers.h). */
#include "worker/peers.h"

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

/* Whether this build can open a CUDA pool at all: a worker built without
 * CUDA leaves them closed instead of failing at every Peers message (a read
 * of one fails on its request, saying why). */
#ifdef BATON_CUDA
#define CAN_OPEN_CUDA true
#else
#define CAN_OPEN_CUDA false
#endif

struct wk_peer {
    uint32_t index;
    char *name;
    char *hostname;
    uint64_t incarnation;
    bool up;
    size_t n_pools;
    struct {
        uint32_t pool;
        char *shm_name;   /* NULL: not a shm pool */
        uint8_t *ipc;     /* CUDA IPC handle, or NULL: not a CUDA pool */
        size_t ipc_len;
        int cuda_device;
        uint64_t bytes;
    } *pools;
};

void wk_peers_init(wk_peers *ps, const char *hostname, wk_device *dev)
{
    *ps = (wk_peers){0};
    ps->dev = dev;
    snprintf(ps->hostname, sizeof(ps->hostname), "%s", hostname ? hostname : "");
}

static void peers_free_table(wk_peers *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        for (size_t k = 0; k < ps->peers[i].n_pools; k++) {
            free(ps->peers[i].pools[k].shm_name);
            free(ps->peers[i].pools[k].ipc);
        }
        free(ps->peers[i].pools);
        free(ps->peers[i].name);
        free(ps->peers[i].hostname);
    }
    free(ps->peers);
    ps->peers = NULL;
    ps->n = 0;
}

static void unmap_unpinned_stale(wk_peers *ps)
{
    for (wk_mapping **pp = &ps->maps; *pp;) {
        wk_mapping *m = *pp;
        if (m->stale && m->pins == 0) {
            if (m->cuda_device >= 0)
                wk_device_ipc_close(ps->dev, m->cuda_device, (void *)m->base);
            else
                munmap((void *)m->base, m->size);
            bt_debug("closed pool %u of worker %u", m->pool, m->peer);
            *pp = m->next;
            free(m);
        } else {
            pp = &m->next;
        }
    }
}

void wk_peers_destroy(wk_peers *ps)
{
    for (wk_mapping *m = ps->maps; m; m = m->next)
        m->stale = true;
    unmap_unpinned_stale(ps);
    peers_free_table(ps);
}

static const wk_peer *peer_find(const wk_peers *ps, uint32_t index)
{
    for (size_t i = 0; i < ps->n; i++)
        if (ps->peers[i].index == index)
            return &ps->peers[i];
    return NULL;
}

/* Opens pool K of P, a CUDA slab, from its IPC handle. */
static wk_mapping *map_cuda(wk_peers *ps, const wk_peer *p, size_t k, char *err, size_t errlen)
{
    wk_mapping *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    void *base = NULL;
    char why[384];
    if (wk_device_ipc_open(ps->dev, p->pools[k].cuda_device, p->pools[k].ipc,
                           p->pools[k].ipc_len, &base, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "cannot open the GPU pool of worker %s: %s", p->name, why);
        free(m);
        return NULL;
    }
    m->peer = p->index;
    m->pool = p->pools[k].pool;
    m->incarnation = p->incarnation;
    m->base = base;
    m->size = p->pools[k].bytes;
    m->cuda_device = p->pools[k].cuda_device;
    m->next = ps->maps;
    ps->maps = m;
    bt_debug("opened pool %u of worker %s (cuda:%d, %llu bytes) by CUDA IPC", m->pool, p->name,
             m->cuda_device, (unsigned long long)m->size);
    return m;
}

static wk_mapping *map_new(wk_peers *ps, const wk_peer *p, uint32_t pool, char *err,
                           size_t errlen)
{
    if (!p->up) {
        snprintf(err, errlen, "worker %u (%s) is down", p->index, p->name);
        return NULL;
    }
    if (p->hostname && *p->hostname && *ps->hostname && strcmp(p->hostname, ps->hostname) != 0) {
        snprintf(err, errlen, "worker %u (%s) runs on host %s, not here (%s): its pool cannot "
                 "be mapped and SOCKET transfers are not built", p->index, p->name, p->hostname,
                 ps->hostname);
        return NULL;
    }
    size_t k = 0;
    while (k < p->n_pools && p->pools[k].pool != pool)
        k++;
    if (k == p->n_pools || (!p->pools[k].shm_name && !p->pools[k].ipc)) {
        snprintf(err, errlen, "worker %u (%s) has no pool %u", p->index, p->name, pool);
        return NULL;
    }
    if (p->pools[k].ipc)
        return map_cuda(ps, p, k, err, errlen);
    const char *name = p->pools[k].shm_name;
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s) of worker %s: %s", name, p->name, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < p->pools[k].bytes || st.st_size == 0) {
        snprintf(err, errlen, "shm segment %s of worker %s is smaller than its %llu bytes", name,
                 p->name, (unsigned long long)p->pools[k].bytes);
        close(fd);
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    void *base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s): %s", name, strerror(errno));
        return NULL;
    }
    wk_mapping *m = calloc(1, sizeof(*m));
    if (!m) {
        munmap(base, size);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->peer = p->index;
    m->pool = pool;
    m->incarnation = p->incarnation;
    m->base = base;
    m->size = size;
    m->cuda_device = -1;
    m->next = ps->maps;
    ps->maps = m;
    bt_debug("mapped pool %u of worker %s (%s, %llu bytes)", pool, p->name, name,
             (unsigned long long)size);
    return m;
}

int wk_peers_update(wk_peers *ps, const Baton__V1__Peers *msg, uint32_t self)
{
    wk_peer *t = calloc(msg->n_peers ? msg->n_peers : 1, sizeof(*t));
    if (!t)
        return BT_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < msg->n_peers; i++, n++) {
        const Baton__V1__PeerInfo *pi = msg->peers[i];
        wk_peer *p = &t[i];
        p->index = pi->index;
        p->incarnation = pi->incarnation;
        p->up = pi->up;
        p->name = strdup(pi->name ? pi->name : "");
        p->hostname = strdup(pi->hostname ? pi->hostname : "");
        p->pools = calloc(pi->n_pools ? pi->n_pools : 1, sizeof(*p->pools));
        if (!p->name || !p->hostname || !p->pools)
            goto nomem;
        p->n_pools = pi->n_pools;
        for (size_t k = 0; k < pi->n_pools; k++) {
            const Baton__V1__PoolHandle *h = pi->pools[k];
            p->pools[k].pool = h->pool;
            p->pools[k].bytes = h->pool_bytes;
            p->pools[k].cuda_device = h->cuda_device;
            if (h->kind == BATON__V1__POOL_KIND__POOL_KIND_SHM && h->shm_name && *h->shm_name &&
                !(p->pools[k].shm_name = strdup(h->shm_name)))
                goto nomem;
            if (h->kind == BATON__V1__POOL_KIND__POOL_KIND_CUDA_IPC && h->cuda_ipc_handle.len &&
                h->cuda_device >= 0) {
                if (!(p->pools[k].ipc = malloc(h->cuda_ipc_handle.len)))
                    goto nomem;
                memcpy(p->pools[k].ipc, h->cuda_ipc_handle.data, h->cuda_ipc_handle.len);
                p->pools[k].ipc_len = h->cuda_ipc_handle.len;
            }
        }
    }
    peers_free_table(ps);
    ps->peers = t;
    ps->n = n;
    /* A mapping is stale once its peer is gone or came back as a new
     * incarnation (its old segment was unlinked; a new one has the name). */
    for (wk_mapping *m = ps->maps; m; m = m->next) {
        const wk_peer *p = peer_find(ps, m->peer);
        if (!p || !p->up || p->incarnation != m->incarnation)
            m->stale = true;
    }
    unmap_unpinned_stale(ps);
    /* Map the pools of live local peers now, off the request path. */
    for (size_t i = 0; i < ps->n; i++) {
        const wk_peer *p = &ps->peers[i];
        if (p->index == self || !p->up)
            continue;
        bool read = false;
        for (size_t j = 0; j < msg->n_reads_from && !read; j++)
            read = msg->reads_from[j] == p->index;
        for (size_t k = 0; k < p->n_pools; k++) {
            /* A CUDA pool on this worker's own GPU is opened whatever the
             * graphs say (it costs no context); one on another GPU, or
             * any for a CPU worker, only when the graphs can bring this
             * worker a tensor from it (see peers.h). */
            bool cuda_here = p->pools[k].ipc && ps->dev &&
                             wk_device_space(ps->dev) == WK_SPACE_CUDA &&
                             p->pools[k].cuda_device == wk_device_ordinal(ps->dev);
            bool cuda_read = p->pools[k].ipc && ps->dev && read && CAN_OPEN_CUDA;
            if (!p->pools[k].shm_name && !cuda_here && !cuda_read)
                continue;
            if (p->hostname && *p->hostname && strcmp(p->hostname, ps->hostname) != 0)
                continue;
            int have = 0;
            for (wk_mapping *m = ps->maps; m; m = m->next)
                have |= !m->stale && m->peer == p->index && m->pool == p->pools[k].pool;
            char err[512];
            wk_mapping *m = have ? NULL : map_new(ps, p, p->pools[k].pool, err, sizeof(err));
            if (m && m->cuda_device >= 0)
                ps->ipc_opens_ahead++;
            else if (!have && !m)
                bt_info("pool %u of worker %s not mapped yet: %s", p->pools[k].pool, p->name,
                        err);
        }
    }
    return 0;
nomem:
    {
        wk_peers tmp = {.peers = t, .n = n + 1};
        peers_free_table(&tmp);
    }
    return BT_ENOMEM;
}

wk_mapping *wk_peers_pin(wk_peers *ps, uint32_t peer, uint32_t pool, char *err, size_t errlen)
{
    for (wk_mapping *m = ps->maps; m; m = m->next)
        if (!m->stale && m->peer == peer && m->pool == pool) {
            m->pins++;
            return m;
        }
    const wk_peer *p = peer_find(ps, peer);
    if (!p) {
        snprintf(err, errlen, "worker %u is not among the known peers", peer);
        return NULL;
    }
    wk_mapping *m = map_new(ps, p, pool, err, errlen);
    if (m)
        m->pins++;
    if (m && m->cuda_device >= 0)
        ps->ipc_opens_on_request++;
    return m;
}

void wk_peers_unpin(wk_peers *ps, wk_mapping *m)
{
    if (!m)
        return;
    if (m->pins)
        m->pins--;
    if (m->stale && m->pins == 0)
        unmap_unpinned_stale(ps);
}

const void *wk_peers_bytes(const wk_peers *ps, uint32_t peer, uint32_t pool, uint64_t offset,
                           uint64_t nbytes, bool *device)
{
    for (const wk_mapping *m = ps->maps; m; m = m->next)
        if (!m->stale && m->peer == peer && m->pool == pool && offset <= m->size &&
            nbytes <= m->size - offset) {
            *device = m->cuda_device >= 0;
            return (const uint8_t *)m->base + offset;
        }
    return NULL;
}
