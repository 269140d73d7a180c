/* Who may register as which worker (daemon/identity.h). */
#include "daemon/identity.h"

#include <string.h>

static const char *const labels[IDENT_N] = {
    [IDENT_OK] = "ok",
    [IDENT_UNKNOWN_WORKER] = "unknown_worker",
    [IDENT_CONNECTION_TAKEN] = "connection_taken",
    [IDENT_NO_KEY] = "no_key",
    [IDENT_NOT_ITS_KEY] = "not_its_key",
    [IDENT_KEY_OF_ANOTHER] = "key_of_another",
    [IDENT_NAME_IN_USE] = "name_in_use",
    [IDENT_CLAIMED_KEY] = "claimed_key",
};

static const char *const sentences[IDENT_N] = {
    [IDENT_OK] = "accepted",
    [IDENT_UNKNOWN_WORKER] = "it names no worker of this config",
    [IDENT_CONNECTION_TAKEN] = "its connection registered as another worker",
    [IDENT_NO_KEY] = "its connection carries no CURVE key",
    [IDENT_NOT_ITS_KEY] = "its key is not the worker's (a spawned worker's key is the one batond "
                          "made for it; an external one's, a key worker_keys names it with)",
    [IDENT_KEY_OF_ANOTHER] = "its key belongs to another worker",
    [IDENT_NAME_IN_USE] = "the worker is registered and live under another key",
    [IDENT_CLAIMED_KEY] = "it offers its peers a public key other than the one it "
                          "authenticated with",
};

const char *ident_strerror(ident_verdict v)
{
    return v >= 0 && v < IDENT_N ? sentences[v] : "unknown verdict";
}

const char *ident_label(ident_verdict v)
{
    return v >= 0 && v < IDENT_N ? labels[v] : "unknown";
}

ident_verdict ident_check(worker_set *ws, const sup_worker *w, const char *key,
                          const char *claimed, const bt_curve_keyset *named)
{
    uint8_t raw[32];
    if (!key || !bt_curve_z85_valid(key, raw))
        return IDENT_NO_KEY;
    if (claimed && *claimed && strcmp(claimed, key) != 0)
        return IDENT_CLAIMED_KEY;
    if (w->cfg->spawn == CFG_SPAWN_AUTO) {
        /* Only the child batond spawned holds this spawn's secret key. */
        if (strcmp(w->key_public, key) != 0)
            return IDENT_NOT_ITS_KEY;
    } else {
        const char *owner = bt_curve_keyset_name_of(named, raw);
        if (owner && strcmp(owner, w->cfg->name) != 0)
            return IDENT_KEY_OF_ANOTHER;
        if (!owner && bt_curve_keyset_names(named, w->cfg->name))
            return IDENT_NOT_ITS_KEY;
        if (workers_live(w) && w->auth_key[0] && strcmp(w->auth_key, key) != 0)
            return IDENT_NAME_IN_USE;
    }
    for (size_t i = 0; i < workers_count(ws); i++) {
        const sup_worker *m = workers_at(ws, (int)i);
        if (m == w)
            continue;
        if ((m->key_public[0] && strcmp(m->key_public, key) == 0) ||
            (workers_live(m) && strcmp(m->auth_key, key) == 0))
            return IDENT_KEY_OF_ANOTHER;
    }
    return IDENT_OK;
}
