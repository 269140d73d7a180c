/* Where a worker finds the backend a Load names: a built-in one
 * (backends/builtin.h) or a plugin opened with dlopen. */
#ifndef BATON_WORKER_PLUGIN_H
#define BATON_WORKER_PLUGIN_H

#include <stddef.h>

#include "baton/backend.h"

/* A plugin library opened with dlopen; kept open while the worker runs,
 * since its models' code lives in it. */
typedef struct wk_plugin wk_plugin;

/* Opens the plugin at PATH and checks its entry point and ABI version.
 * Returns BATON_STATUS_OK and sets *out, or an error code with a message
 * naming PATH in ERR. */
baton_status wk_plugin_open(const char *path, wk_plugin **out, char *err, size_t errlen);
const baton_backend *wk_plugin_backend(const wk_plugin *p);
const char *wk_plugin_path(const wk_plugin *p);
/* dlcloses; every model of the plugin must be unloaded.  NULL is a no-op. */
void wk_plugin_close(wk_plugin *p);

/* The backends one worker has resolved: plugins are opened once per path. */
typedef struct wk_registry wk_registry;

wk_registry *wk_registry_create(void);
void wk_registry_destroy(wk_registry *r);

/* Resolves SPEC, a Load's `backend`: a built-in name or "plugin:/path".
 * Returns BATON_STATUS_OK and sets *out, or NOT_FOUND for an unknown name,
 * or the plugin's error, each with a message in ERR. */
baton_status wk_registry_find(wk_registry *r, const char *spec, const baton_backend **out,
                              char *err, size_t errlen);

#endif
