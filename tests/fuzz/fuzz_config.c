/* libFuzzer target: the deployment file, as `batond --check-config` reads
 * it, on arbitrary bytes.  The bytes are loaded as YAML (cfg_load_string),
 * the graphs built and partitioned (graph_set_build), the paths checked,
 * the diagnostics sorted and printed and the summary rendered, every step
 * that --check-config takes except asking the worker binary which devices
 * it serves (a process spawn per input would be all the fuzzer measured).
 *
 * Beyond the sanitizers it asserts what the loader promises: a load either
 * succeeds with a config and no error, or fails with no config and at least
 * one error in the diagnostics (unless memory ran out).  With
 * BATON_FUZZ_VERBOSE set in the environment the diagnostics go to stderr. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/diag.h"
#include "common/status.h"
#include "config/config.h"
#include "config/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!sink && !(sink = fopen("/dev/null", "w")))
        abort();
    cfg_config *cfg = NULL;
    graph_set *gs = NULL;
    bt_diag *diag = bt_diag_create("fuzz.yaml");
    if (!diag)
        return 0;
    int rc = cfg_load_string((const char *)data, size, "fuzz.yaml", diag, &cfg);
    if (rc == 0 && !cfg)
        abort();
    if (rc != 0 && cfg)
        abort();
    if (rc == BT_ECONFIG && diag->n_errors == 0)
        abort();
    if (rc == 0) {
        rc = graph_set_build(cfg, diag, &gs);
        if (rc == 0 && !gs)
            abort();
        if (rc == BT_ECONFIG && diag->n_errors == 0)
            abort();
    }
    if (rc == 0)
        cfg_check_paths(cfg, diag);
    bt_diag_sort(diag);
    bt_diag_print(diag, getenv("BATON_FUZZ_VERBOSE") ? stderr : sink);
    if (rc == 0)
        graph_set_print(gs, sink);
    graph_set_destroy(gs);
    cfg_config_destroy(cfg);
    bt_diag_destroy(diag);
    return 0;
}
