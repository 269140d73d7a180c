/* The groups of tensor-parallel models (`tp:` above 1): which workers are
 * a model's ranks, the communicator id its rank 0 made (TpGroup), which
 * the other ranks' Loads carry, the relay of rank 0's steps (TpStep) to
 * the others, and the end of a group when one of its members is lost.
 *
 * It owns the groups' state, one per config model; the worker records
 * (daemon/workers.h) it only reads.  What it cannot do itself, it reports
 * through tpg_hooks: a waiting rank's Load is to go out now, a member must
 * be taken down. */
#ifndef BATON_DAEMON_TPGROUPS_H
#define BATON_DAEMON_TPGROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "daemon/workers.h"
#include "proto/baton.pb-c.h"

typedef struct tpg_hooks {
    void *arg;
    /* Worker W, rank K of model M (an index into the config's models),
     * registered and waits for its group's id, which has come: its Load
     * is to be sent now. */
    void (*load)(void *arg, sup_worker *w, size_t m, size_t k);
    /* Worker W, live, must go (WHY): a member of its group was lost, or a
     * step of its group could not be sent to it. */
    void (*take_down)(void *arg, sup_worker *w, const char *why);
} tpg_hooks;

typedef struct tp_groups tp_groups;

/* The groups of CFG's models; CFG and WS are borrowed.  0 or BT_ENOMEM. */
int tpg_create(const cfg_config *cfg, worker_set *ws, const tpg_hooks *hooks, tp_groups **out);
void tpg_destroy(tp_groups *t);

/* Is W one of the ranks of a tensor-parallel model? */
bool tpg_in_group(const tp_groups *t, const sup_worker *w);
/* The communicator id of model M's group, *LEN bytes: 0 while rank 0 has
 * not sent it. */
const uint8_t *tpg_group_id(const tp_groups *t, size_t m, size_t *len);
/* Must rank K of model M wait before its Load?  True for a rank above 0
 * of a tensor-parallel model whose rank 0 has not sent the group's id yet,
 * and for every rank of a group one of whose ranks failed to load
 * (tpg_load_failed) until that worker registers again. */
bool tpg_waits(const tp_groups *t, size_t m, size_t k);
/* The Load of rank K of tensor-parallel model M went to the registration
 * REGISTRATION of its worker, so that the group's id does not send it
 * again. */
void tpg_load_sent(tp_groups *t, size_t m, size_t k, uint32_t registration);

/* Live worker W sent its group's id (TpGroup): kept, and the other ranks
 * that registered and wait for it get their Load (tpg_hooks.load). */
void tpg_on_group(tp_groups *t, sup_worker *w, const Baton__V1__TpGroup *tg);
/* Live worker W ran a step as rank 0 (TpStep): relayed to the other ranks. */
void tpg_on_step(tp_groups *t, sup_worker *w, const Baton__V1__TpStep *st);
/* Live worker W could not load MODEL (WHY): when it is a rank of that
 * model's tensor-parallel group, the other ranks would wait for it in the
 * group's forming until killed.  The group is held: its other live ranks
 * are taken down (their wait is cancelled as they stop), and no rank gets
 * a Load until W registers again (tpg_registered). */
void tpg_load_failed(tp_groups *t, sup_worker *w, const char *model, const char *why);
/* W registered (again): a group it had held by a failed load is released,
 * and its rank 0, registered and waiting, gets its Load. */
void tpg_registered(tp_groups *t, sup_worker *w);
/* Why model M's group is held, or NULL when it is not. */
const char *tpg_held(const tp_groups *t, size_t m);
/* W was lost: every group it belonged to is broken (the others wait in
 * collectives that will never complete), so its other members are taken
 * down too (but the one whose failed load holds the group, which waits in
 * none) and the group starts over with a new id. */
void tpg_break(tp_groups *t, sup_worker *w);

#endif
