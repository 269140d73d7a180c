/* batond: the conductor.  `batond --config FILE` serves a deployment in the
 * foreground; `batond --check-config FILE` loads,
 * validates, builds and partitions it and prints a summary (like
 * `nginx -t`). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/version.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/status.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/conductor.h"
#include "daemon/supervisor.h"


static void usage(FILE *out)
{
    fprintf(out,
            "usage: batond --config FILE         serve a deployment in the foreground\n"
            "       batond --check-config FILE   validate a deployment and print its summary\n"
            "       batond --version\n"
            "\n"
            "Exit status: 0 when the file is valid, 1 when it has errors (each printed as\n"
            "FILE:LINE:COL: message), 2 on a usage error.\n");
}

/* Loads, validates and summarizes PATH.  Returns the process exit status. */
static int check_config(const char *path, int quiet)
{
    int status = 1;
    cfg_config *cfg = NULL;
    graph_set *gs = NULL;
    bt_diag *diag = bt_diag_create(path);
    if (!diag) {
        fprintf(stderr, "batond: out of memory\n");
        return 1;
    }
    int rc = cfg_load_file(path, diag, &cfg);
    if (rc == 0)
        rc = graph_set_build(cfg, diag, &gs);
    if (rc == 0)
        cfg_check_paths(cfg, diag);
    /* batond's own key files: errors, as at start (the check runs where
     * batond runs, e.g. as ExecStartPre). */
    if (rc == 0 && cfg_check_keys(cfg, NULL, diag) != 0)
        rc = BT_ECONFIG;
    char exe[4096];
    if (rc == 0 && (rc = sup_worker_exe(exe, sizeof(exe))) == 0)
        rc = sup_check_devices(cfg, exe, diag);
    bt_diag_sort(diag);
    bt_diag_print(diag, stderr);
    if (rc != 0) {
        if (rc == BT_ECONFIG)
            fprintf(stderr, "%s: %zu error%s\n", path, diag->n_errors,
                    diag->n_errors == 1 ? "" : "s");
        else if (diag->n_errors == 0)
            fprintf(stderr, "%s: %s\n", path, bt_strerror(rc));
        goto out;
    }
    if (!quiet)
        graph_set_print(gs, stdout);
    if (cfg->daemon.curve) {
        /* The fingerprint of the public key only: keys are never printed. */
        char pub[BT_CURVE_Z85_SIZE], fp[BT_CURVE_FINGERPRINT_LEN + 1], err[600];
        if (cfg_server_public_key(cfg, pub, err, sizeof(err)) == 0)
            printf("curve: server public key %s...\n", bt_curve_fingerprint(pub, fp));
    }
    printf("%s: configuration OK (%zu graph%s, %zu worker%s, %zu model%s)\n", path,
           cfg->n_graphs, cfg->n_graphs == 1 ? "" : "s", cfg->n_workers,
           cfg->n_workers == 1 ? "" : "s", cfg->n_models, cfg->n_models == 1 ? "" : "s");
    status = 0;
out:
    graph_set_destroy(gs);
    cfg_config_destroy(cfg);
    bt_diag_destroy(diag);
    return status;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"check-config", required_argument, NULL, 'c'},
        {"config", required_argument, NULL, 'f'},
        {"quiet", no_argument, NULL, 'q'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *check = NULL, *serve = NULL;
    int quiet = 0, c;
    while ((c = getopt_long(argc, argv, "c:f:qVh", opts, NULL)) != -1) {
        switch (c) {
        case 'c': check = optarg; break;
        case 'f': serve = optarg; break;
        case 'q': quiet = 1; break;
        case 'V': printf("batond %s\n", BATON_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc || !!check == !!serve) {
        usage(stderr);
        return 2;
    }
    if (check)
        return check_config(check, quiet);
    bt_log_init("batond", BT_LOG_INFO);
    conductor *cd = NULL;
    int rc = conductor_create(serve, &cd);
    if (rc != 0) {
        bt_error("cannot start: %s", bt_strerror(rc));
        return 1;
    }
    rc = conductor_run(cd);
    conductor_destroy(cd);
    return rc == 0 ? 0 : 1;
}
