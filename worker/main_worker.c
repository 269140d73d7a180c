/* baton-worker: command line and configuration.
 *
 *   baton-worker --config FILE --name WORKER --run-id RUNID --incarnation N
 *                [--endpoint EP] [--key-fd FD]
 *
 * batond spawns it with the config it serves; the worker reads its own
 * `workers:` entry (device, pool_mb, streams, threads) and the daemon's
 * workers_endpoint and log_level from it.  --endpoint overrides the
 * endpoint (tests play the conductor on a socket of their own).
 *
 * On a tcp:// workers_endpoint with daemon.curve set the worker is a CURVE
 * client: a worker batond spawns reads batond's public key and a key pair
 * made for it from the pipe --key-fd names; one started by hand
 * (spawn: external) uses its `key:` file and batond's public key from the
 * config (curve public_key, else the .pub twin of secret_key). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "common/curve.h"
#include "common/log.h"
#include "config/config.h"
#include "worker/device.h"
#include "worker/worker.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: baton-worker --config FILE --name WORKER --run-id RUNID [--incarnation N]\n"
            "                    [--endpoint ENDPOINT] [--key-fd FD]\n"
            "       baton-worker --devices\n"
            "\n"
            "Serves the models the conductor (batond) places on worker WORKER of the\n"
            "deployment FILE.  Normally started by batond, never by hand.\n"
            "\n"
            "  --config FILE      the deployment file batond serves\n"
            "  --name WORKER      this worker's name in its `workers:` list\n"
            "  --run-id RUNID     the conductor's run id (names the shm pool)\n"
            "  --incarnation N    restart count, the high bits of tensor ids (default 0)\n"
            "  --endpoint EP      conductor endpoint instead of daemon.workers_endpoint\n"
            "  --key-fd FD        read the CURVE keys batond made for this worker from FD\n"
            "                     (batond's public key, then the worker's public and secret\n"
            "                     key, one a line); batond passes it to workers it spawns\n"
            "  --devices          print the kinds of device this build serves (cpu, cuda)\n"
            "                     and exit; batond --check-config asks it\n");
}

/* Reads the three keys a spawning batond wrote to FD (see key_pipe in
 * daemon/supervisor.c), then closes FD. */
static int read_key_fd(int fd, char *server_public, bt_curve_keypair *own)
{
    char buf[3 * BT_CURVE_Z85_SIZE + 1];
    size_t n = 0;
    while (n < sizeof(buf) - 1) {
        ssize_t got = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = 0;
    int rc = -1;
    if (n == 3 * BT_CURVE_Z85_SIZE && buf[40] == '\n' && buf[81] == '\n' && buf[122] == '\n') {
        buf[40] = buf[81] = buf[122] = 0;
        memcpy(server_public, buf, BT_CURVE_Z85_SIZE);
        memcpy(own->public_z85, buf + 41, BT_CURVE_Z85_SIZE);
        memcpy(own->secret_z85, buf + 82, BT_CURVE_Z85_SIZE);
        char derived[BT_CURVE_Z85_SIZE];
        if (bt_curve_z85_valid(server_public, NULL) &&
            bt_curve_public_derive(own->secret_z85, derived) == 0 &&
            strcmp(derived, own->public_z85) == 0)
            rc = 0;
    }
    bt_curve_wipe(buf, sizeof(buf));
    return rc;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || s[0] == '-' || v >= (1ull << 24))
        return -1;
    *out = v;
    return 0;
}

/* The command line. */
typedef struct cmdline {
    const char *config, *name, *run_id, *endpoint;
    uint64_t incarnation;
    uint64_t key_fd;
    bool have_key_fd;
} cmdline;

/* Reads the command line into CL.  Returns -1 to go on, else the exit
 * status (0 after --help or --devices, 2 on a usage error). */
static int parse_args(int argc, char **argv, cmdline *cl)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},  {"name", required_argument, NULL, 'n'},
        {"run-id", required_argument, NULL, 'r'},  {"incarnation", required_argument, NULL, 'i'},
        {"endpoint", required_argument, NULL, 'e'}, {"help", no_argument, NULL, 'h'},
        {"devices", no_argument, NULL, 'd'},      {"key-fd", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': cl->config = optarg; break;
        case 'n': cl->name = optarg; break;
        case 'r': cl->run_id = optarg; break;
        case 'e': cl->endpoint = optarg; break;
        case 'i':
            if (parse_u64(optarg, &cl->incarnation) != 0) {
                fprintf(stderr, "baton-worker: --incarnation takes an integer in [0, 2^24), "
                        "not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'k':
            if (parse_u64(optarg, &cl->key_fd) != 0) {
                fprintf(stderr, "baton-worker: --key-fd takes a file descriptor, not '%s'\n",
                        optarg);
                return 2;
            }
            cl->have_key_fd = true;
            break;
        case 'h': usage(stdout); return 0;
        case 'd': {
            char why[256];
            printf("cpu%s\n", wk_device_supported("cuda:0", why, sizeof(why)) ? " cuda" : "");
            return 0;
        }
        default: usage(stderr); return 2;
        }
    }
    if (!cl->config || !cl->name || !cl->run_id || optind != argc) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The deployment file, its errors printed; NULL when it does not load.  A
 * worker started by hand (no key pipe) checks the key files it uses. */
static cfg_config *load_config(const cmdline *cl)
{
    bt_diag *diag = bt_diag_create(cl->config);
    cfg_config *cfg = NULL;
    int rc = diag ? cfg_load_file(cl->config, diag, &cfg) : -1;
    if (rc == 0 && !cl->have_key_fd && cfg_check_keys(cfg, cl->name, diag) != 0) {
        cfg_config_destroy(cfg);
        cfg = NULL;
        rc = -1;
    }
    if (rc != 0) {
        if (diag)
            bt_diag_print(diag, stderr);
        bt_error("cannot load the configuration %s", cl->config);
    }
    bt_diag_destroy(diag);
    return rc == 0 ? cfg : NULL;
}

/* The options of worker CW of CFG, strings borrowed from both. */
static wk_options worker_options(const cmdline *cl, const cfg_config *cfg, const cfg_worker *cw)
{
    wk_options opt = {
        .name = cl->name,
        .run_id = cl->run_id,
        .incarnation = cl->incarnation,
        .endpoint = cl->endpoint ? cl->endpoint : cfg->daemon.workers_endpoint,
        .device = cw->device,
        .pool_bytes = cw->pool_mb << 20,
        .streams = cw->streams_compute ? cw->streams_compute : 1,
        .threads = cw->threads ? cw->threads : 1,
        .inline_us = cw->inline_us,
        .index = (uint32_t)(cw - cfg->workers),
        .comm_streams = cw->streams_comm > 0 ? 1 : 0,
        .host = cw->host,
        .peer_listen = cw->peer_listen,
    };
    /* Every worker has a profile: cfg_worker_profile falls back to the
     * built-in default of its device, and the config check refused a name
     * that matches neither. */
    const cfg_profile *cp = cfg_worker_profile(cfg, cw);
    if (cp)
        opt.profile = *cp;
    return opt;
}

/* The CURVE keys of OPT.  With daemon.curve every worker has a key pair:
 * batond's key pipe gives the ones it spawns theirs (already read into OWN
 * and SERVER_PUBLIC), one started by hand reads its `key:`.  It is the
 * client key towards a tcp workers endpoint, and the server key of the
 * worker-to-worker socket (peer_listen).  0, or -1 (logged). */
static int curve_options(const cmdline *cl, const cfg_config *cfg, const cfg_worker *cw,
                         char *server_public, bt_curve_keypair *own, wk_options *opt)
{
    bool tcp = cfg_endpoint_is_tcp(opt->endpoint);
    if (cl->have_key_fd) {
        opt->curve_own = own;
        if (tcp)
            opt->curve_server_public = server_public;
    } else if (cfg->daemon.curve) {
        /* Even without tcp or a peer_listen of its own: it may pull from a
         * worker on another host, whose socket speaks only CURVE. */
        char err[600];
        if (!cw->key.s) {
            bt_error("worker '%s' has no 'key:', which daemon.curve needs", cl->name);
            return -1;
        }
        if ((tcp && cfg_server_public_key(cfg, server_public, err, sizeof(err)) != 0) ||
            bt_curve_secret_load(cw->key.s, own, err, sizeof(err)) != 0) {
            bt_error("%s", err);
            return -1;
        }
        opt->curve_own = own;
        if (tcp)
            opt->curve_server_public = server_public;
    }
    if (opt->curve_server_public) {
        char fp[BT_CURVE_FINGERPRINT_LEN + 1], sfp[BT_CURVE_FINGERPRINT_LEN + 1];
        bt_info("curve: key %s... towards server key %s...",
                bt_curve_fingerprint(own->public_z85, fp),
                bt_curve_fingerprint(server_public, sfp));
    } else if (opt->curve_own) {
        char fp[BT_CURVE_FINGERPRINT_LEN + 1];
        bt_info("curve: key %s... for the worker-to-worker socket",
                bt_curve_fingerprint(own->public_z85, fp));
    }
    return 0;
}

/* How many models of CFG are placed on worker NAME (each logged). */
static size_t models_placed(const cfg_config *cfg, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < cfg->n_models; i++)
        for (size_t k = 0; k < cfg->models[i].n_workers; k++)
            if (strcmp(cfg->models[i].workers[k].s, name) == 0) {
                bt_debug("model %s (%s) is placed here", cfg->models[i].name,
                         cfg->models[i].backend);
                n++;
            }
    return n;
}

/* Runs the worker of OPT to its end; the process exit status. */
static int serve(const wk_options *opt)
{
    char err[512];
    wk_worker *w;
    if (wk_worker_create(opt, &w, err, sizeof(err)) != 0) {
        bt_error("%s", err);
        return 1;
    }
    int status = wk_worker_run(w);
    wk_worker_destroy(w);
    bt_info("exited with status %d", status);
    return status;
}

int main(int argc, char **argv)
{
    bk_blas_check_core(argv);
    cmdline cl = {0};
    int rc = parse_args(argc, argv, &cl);
    if (rc >= 0)
        return rc;
    char ident[160];
    snprintf(ident, sizeof(ident), "baton-worker[%s]", cl.name);
    bt_log_init(ident, BT_LOG_INFO);
    if (getenv("BATON_BLAS_CORE_SET"))
        bt_info("OpenBLAS runs its %s kernels: it took Prescott's (SSE3) on this CPU, and "
                "baton-worker started again with OPENBLAS_CORETYPE set",
                getenv("BATON_BLAS_CORE_SET"));

    /* Die with the conductor.  The check after the prctl closes the race
     * where the parent died before it took effect. */
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) {
        bt_error("the parent process is gone; exiting");
        return 1;
    }
    /* SIGTERM and SIGINT reach the I/O loop through a handler and a
     * self-pipe (wk_worker_create installs them).  A signalfd would need
     * them blocked in every thread, and a library may start threads before
     * main (OpenBLAS's pool does): the signal would land there and kill the
     * process instead of stopping it. */
    signal(SIGPIPE, SIG_IGN);

    /* The key pipe first: it is read and closed before anything else can
     * fail, so that its bytes never linger. */
    char server_public[BT_CURVE_Z85_SIZE] = "";
    bt_curve_keypair own;
    memset(&own, 0, sizeof(own));
    if (cl.have_key_fd && read_key_fd((int)cl.key_fd, server_public, &own) != 0) {
        bt_error("--key-fd %llu does not hold the three keys batond passes",
                 (unsigned long long)cl.key_fd);
        return 1;
    }
    cfg_config *cfg = load_config(&cl);
    if (!cfg)
        return 1;
    int status = 1;
    const cfg_worker *cw = cfg_worker_find(cfg, cl.name);
    if (!cw) {
        bt_error("%s has no worker named '%s'", cl.config, cl.name);
        goto out;
    }
    bt_log_level level = BT_LOG_INFO;
    if (cfg->daemon.log_level && bt_log_level_from_name(cfg->daemon.log_level, &level) != 0)
        bt_warn("unknown log level '%s'; using info", cfg->daemon.log_level);
    bt_log_set_level(level);
    char why[256];
    if (!wk_device_supported(cw->device, why, sizeof(why))) {
        bt_error("device '%s': %s", cw->device, why);
        goto out;
    }
    size_t n_models = models_placed(cfg, cl.name);
    wk_options opt = worker_options(&cl, cfg, cw);
    if (curve_options(&cl, cfg, cw, server_public, &own, &opt) != 0)
        goto out;
    bt_info("starting: device %s, pool %llu MiB, %u lane(s), %zu model(s) placed, incarnation "
            "%llu", cw->device, (unsigned long long)cw->pool_mb, opt.streams, n_models,
            (unsigned long long)cl.incarnation);
    status = serve(&opt);
out:
    bt_curve_keypair_wipe(&own);
    cfg_config_destroy(cfg);
    return status;
}
