/* Backend plugins (dlopen) and the per-worker registry of backends.
 *
 * A plugin is refused before any of its code beyond the entry point runs
 * when its ABI version differs from ours or a required slot is empty: a
 * plugin built against another header would otherwise read our structs
 * with the wrong layout and fail in ways that name nothing. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "worker/plugin.h"

struct wk_plugin {
    char *path;
    void *handle;               /* from dlopen */
    const baton_backend *backend;
    wk_plugin *next;            /* in its registry */
};

struct wk_registry {
    wk_plugin *plugins;         /* opened plugins, newest first */
};

#define PLUGIN_PREFIX "plugin:"

baton_status wk_plugin_open(const char *path, wk_plugin **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!path || !*path) {
        snprintf(err, errlen, "plugin path is empty");
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    /* RTLD_NOW: an unresolved symbol is an error at load, not a crash in
     * the middle of a request.  RTLD_LOCAL: plugins do not see each
     * other's symbols. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errlen, "cannot load plugin %s: %s", path, e ? e : "unknown error");
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    baton_backend_entry_fn entry;
    /* POSIX's blessed way to turn a data pointer into a function pointer. */
    *(void **)&entry = dlsym(h, BATON_BACKEND_ENTRY_SYMBOL);
    if (!entry) {
        snprintf(err, errlen, "plugin %s does not export %s()", path, BATON_BACKEND_ENTRY_SYMBOL);
        goto err;
    }
    const baton_backend *b = entry();
    if (!b) {
        snprintf(err, errlen, "plugin %s: %s() returned no backend", path,
                 BATON_BACKEND_ENTRY_SYMBOL);
        goto err;
    }
    if (b->abi_version != BATON_BACKEND_ABI_VERSION) {
        snprintf(err, errlen, "plugin %s was built for backend ABI version %u; this worker "
                 "speaks version %u", path, b->abi_version, BATON_BACKEND_ABI_VERSION);
        goto err;
    }
    const char *missing = !b->model_load ? "model_load"
                          : !b->model_unload ? "model_unload"
                          : !b->execute ? "execute" : NULL;
    if (missing) {
        snprintf(err, errlen, "plugin %s lacks the required slot %s", path, missing);
        goto err;
    }
    wk_plugin *p = calloc(1, sizeof(*p));
    if (!p || !(p->path = strdup(path))) {
        free(p);
        snprintf(err, errlen, "out of memory loading plugin %s", path);
        dlclose(h);
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    p->handle = h;
    p->backend = b;
    *out = p;
    return BATON_STATUS_OK;
err:
    dlclose(h);
    return BATON_STATUS_FAILED_PRECONDITION;
}

const baton_backend *wk_plugin_backend(const wk_plugin *p)
{
    return p->backend;
}

const char *wk_plugin_path(const wk_plugin *p)
{
    return p->path;
}

void wk_plugin_close(wk_plugin *p)
{
    if (!p)
        return;
    dlclose(p->handle);
    free(p->path);
    free(p);
}

wk_registry *wk_registry_create(void)
{
    return calloc(1, sizeof(wk_registry));
}

void wk_registry_destroy(wk_registry *r)
{
    if (!r)
        return;
    for (wk_plugin *p = r->plugins, *n; p; p = n) {
        n = p->next;
        wk_plugin_close(p);
    }
    free(r);
}

baton_status wk_registry_find(wk_registry *r, const char *spec, const baton_backend **out,
                              char *err, size_t errlen)
{
    *out = NULL;
    if (!spec)
        spec = "";
    if (strncmp(spec, PLUGIN_PREFIX, strlen(PLUGIN_PREFIX)) == 0) {
        const char *path = spec + strlen(PLUGIN_PREFIX);
        for (wk_plugin *p = r->plugins; p; p = p->next)
            if (strcmp(p->path, path) == 0) {
                *out = p->backend;
                return BATON_STATUS_OK;
            }
        wk_plugin *p;
        baton_status st = wk_plugin_open(path, &p, err, errlen);
        if (st != BATON_STATUS_OK)
            return st;
        p->next = r->plugins;
        r->plugins = p;
        *out = p->backend;
        return BATON_STATUS_OK;
    }
    const baton_backend *b = bk_builtin_find(spec);
    if (b) {
        *out = b;
        return BATON_STATUS_OK;
    }
    snprintf(err, errlen, "unknown backend '%s' (built-ins: transformer, echo, add, counter, "
             "chunks, sleep, fail; plugins: plugin:/path/lib.so)", spec);
    return BATON_STATUS_NOT_FOUND;
}
