/* The internals of loading a deployment file, by layer.  Each file calls
 * only the layers below its own:
 *
 *   load.c        the entry points (cfg_load_string, cfg_load_file), the
 *                 top level, daemon, devices, workers; calls the two below
 *   load_model.c  `models:`   } each calls only load_util.c, config.c and
 *   load_graph.c  `graphs:`   } yaml_tree.c; they do not call each other
 *   load_util.c   the loader's toolkit: names sets, string/alloc helpers
 *   config.c      the config structs: look-ups, built-in profiles,
 *                 destruction; calls no loader
 *
 * graph_build.c and graph_print.c work on a loaded config and are not
 * called by the loaders.  Not part of the config API: names here carry the
 * internal prefix cfg__. */
#ifndef BATON_CONFIG_LOAD_INTERNAL_H
#define BATON_CONFIG_LOAD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "config/yaml_tree.h"

/* A set of names with the place each was first defined, for "duplicate
 * worker name 'x' (first defined at line N)" and for checking references.
 * A hash table, so that a file with a huge list costs linear time, not
 * quadratic.  Names are borrowed from the config being built. */
typedef struct cfg__name {
    const char *name; /* NULL: an empty slot */
    cfg_pos pos;
} cfg__name;

typedef struct cfg__names {
    cfg__name *v;   /* owned array of CAP slots, CAP a power of two */
    size_t n, cap;
} cfg__names;

/* One load in progress.  Schema errors go to DIAG and loading goes on;
 * only an allocation failure is fatal, and it is remembered in RC so that
 * the walk can still finish without touching a missing piece. */
typedef struct cfg__loader {
    bt_diag *diag;      /* borrowed */
    cfg_config *c;      /* the config being filled; owned by the caller */
    int rc;             /* 0, or BT_ENOMEM once an allocation failed */
    cfg__names workers; /* names of the workers loaded, for model placement */
    cfg__names models;  /* names of the models loaded, for nodes */
} cfg__loader;

/* ---- load_util.c ------------------------------------------------------- */

/* Adds NAME to SET; reports a duplicate at POS and returns false.  WHAT
 * names the kind of thing ("worker", "node"). */
bool cfg__names_add(cfg__loader *l, cfg__names *set, const char *name, cfg_pos pos,
                    const char *what);

/* The entry for NAME in SET, or NULL. */
const cfg__name *cfg__names_find(const cfg__names *set, const char *name);

void cfg__names_free(cfg__names *set);

cfg_pos cfg__pos(const yt_node *n);

/* yt_str that records an allocation failure in L; true on success. */
bool cfg__str(cfg__loader *l, const yt_node *v, const char *key, char **out);

/* strdup that records an allocation failure in L. */
char *cfg__strdup(cfg__loader *l, const char *s);

/* calloc of N items of SIZE that records a failure in L; NULL for N == 0
 * without a failure. */
void *cfg__calloc(cfg__loader *l, size_t n, size_t size);

/* The text of MAP's `name` key when it is a plain string, else NULL: it
 * names the thing in messages about its other keys. */
const char *cfg__peek_name(const yt_node *map);

/* ---- config.c ---------------------------------------------------------- */

/* Frees what an option owns and zeroes it. */
void cfg__option_clear(cfg_option *o);

/* Frees S and every section under it (config/config.c); accepts NULL. */
void cfg__section_destroy(cfg_section *s);

/* ---- load_model.c and load_graph.c, called by load.c ------------------- */

/* Loads the top-level `models:` list into l->c (config/load_model.c).
 * Workers must be loaded already: placements are checked against them. */
void cfg__load_models(cfg__loader *l, const yt_node *list);

/* Loads the top-level `graphs:` list into l->c (config/load_graph.c).
 * Workers and models must be loaded already: nodes are checked against
 * the models. */
void cfg__load_graphs(cfg__loader *l, const yt_node *list);

#endif
