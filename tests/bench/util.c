/* Shared pieces of the benchmarks (util.h). */
#include "tests/bench/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double bench_now_us(void)
{
    return (double)bench_now_ns() / 1e3;
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- order statistics ----------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_sort(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
}

double bench_quantile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    if (p <= 0)
        return sorted[0];
    if (p >= 1)
        return sorted[n - 1];
    double pos = p * (double)(n - 1);
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    return lo + 1 < n ? sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]) : sorted[lo];
}

double bench_median(const double *v, size_t n)
{
    if (n == 0)
        return 0;
    double *c = malloc(n * sizeof(*c));
    if (!c)
        abort();
    memcpy(c, v, n * sizeof(*c));
    bench_sort(c, n);
    double m = bench_quantile(c, n, 0.5);
    free(c);
    return m;
}

double bench_mean(const double *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    return n ? s / (double)n : 0;
}

/* ---- options -------------------------------------------------------------- */

void bench_opts_parse(bench_opts *o, const char *name, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    const char *b = getenv("BUILD");
    o->build = b && *b ? b : "build";
    snprintf(o->batond, sizeof(o->batond), "%s/batond", o->build);
    snprintf(o->configs, sizeof(o->configs), "tests/bench/configs");
    snprintf(o->json, sizeof(o->json), "%s/bench/%s.json", o->build, name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o->quick = true;
        } else if (!strcmp(a, "--json") && v) {
            snprintf(o->json, sizeof(o->json), "%s", v);
            i++;
        } else if (!strcmp(a, "--batond") && v) {
            snprintf(o->batond, sizeof(o->batond), "%s", v);
            i++;
        } else if (!strcmp(a, "--configs") && v) {
            snprintf(o->configs, sizeof(o->configs), "%s", v);
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] [--json PATH] [--batond PATH] [--configs DIR]\n"
                    "  run from the repository root (make bench); see tests/bench/README.md\n",
                    argv[0]);
            exit(!strcmp(a, "--help") ? 0 : 2);
        }
    }
}

/* ---- folders -------------------------------------------------------------- */

int bench_mkdtemp(char *buf, size_t len)
{
    if (snprintf(buf, len, "/tmp/baton-bench-XXXXXX") >= (int)len || !mkdtemp(buf)) {
        fprintf(stderr, "bench: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void bench_rmtree(const char *dir)
{
    if (dir && *dir)
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- processes ------------------------------------------------------------ */

pid_t bench_spawn(int (*fn)(void *), void *arg)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* A helper that outlives a crashed benchmark would keep its CPU. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        _exit(fn(arg));
    }
    return pid;
}

static bool wait_exit(pid_t pid, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD))
            return true;
        usleep(10000);
    }
    return false;
}

void bench_reap(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    if (!wait_exit(pid, 5000)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/* ---- daemon --------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* TEXT with every FROM replaced by TO, newly allocated (TEXT is freed). */
static char *replace_all(char *text, const char *from, const char *to)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = text ? open_memstream(&out, &len) : NULL;
    if (!f) {
        free(text);
        return NULL;
    }
    size_t fl = strlen(from);
    const char *p = text;
    for (const char *q; fl && (q = strstr(p, from)); p = q + fl) {
        fwrite(p, 1, (size_t)(q - p), f);
        fputs(to, f);
    }
    fputs(p, f);
    fclose(f);
    free(text);
    return out;
}

static void print_log_tail(const char *log)
{
    size_t n = 0;
    char *t = read_file(log, &n);
    if (!t)
        return;
    fprintf(stderr, "--- %s (tail) ---\n%s\n", log, n > 3000 ? t + n - 3000 : t);
    free(t);
}

int bench_wait_ready(const char *endpoint, int timeout_ms)
{
    return bench_wait_ready_with(endpoint, NULL, timeout_ms);
}

int bench_wait_ready_with(const char *endpoint, const baton_client_options *copts,
                          int timeout_ms)
{
    baton_client *c = NULL;
    if (baton_client_create_with(endpoint, copts, &c) != 0)
        return -1;
    baton_client_set_connect_timeout(c, 500);
    double deadline = bench_now_us() + timeout_ms * 1e3;
    int rc = -1;
    while (bench_now_us() < deadline) {
        baton_client_event *ev = NULL;
        if (baton_client_health(c, 500, &ev) == 0) {
            bool ready = ev->ready;
            baton_client_event_free(ev);
            if (ready) {
                rc = 0;
                break;
            }
        }
        usleep(20000);
    }
    baton_client_destroy(c);
    return rc;
}

int bench_daemon_start(bench_daemon *d, const bench_opts *o, const char *template_name,
                       const char *const *subst)
{
    return bench_daemon_start_with(d, o, template_name, subst, NULL, NULL);
}

int bench_daemon_start_with(bench_daemon *d, const bench_opts *o, const char *template_name,
                            const char *const *subst, const char *endpoint,
                            const baton_client_options *copts)
{
    memset(d, 0, sizeof(*d));
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", o->configs, template_name);
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        fprintf(stderr, "bench: cannot read %s: %s (run from the repository root)\n", path,
                strerror(errno));
        return -1;
    }
    if (bench_mkdtemp(d->dir, sizeof(d->dir)) != 0) {
        free(text);
        return -1;
    }
    char config[300];
    snprintf(config, sizeof(config), "%s/baton.yaml", d->dir);
    if (endpoint)
        snprintf(d->endpoint, sizeof(d->endpoint), "%s", endpoint);
    else
        snprintf(d->endpoint, sizeof(d->endpoint), "ipc://%s/baton.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/batond.log", d->dir);
    for (size_t i = 0; subst && subst[i] && subst[i + 1]; i += 2)
        text = replace_all(text, subst[i], subst[i + 1]);
    text = replace_all(text, "/tmp/baton-bench", d->dir);
    FILE *cf = text ? fopen(config, "w") : NULL;
    int wr = cf && fputs(text, cf) >= 0 ? 0 : -1;
    if (cf && fclose(cf) != 0)
        wr = -1;
    free(text);
    if (wr != 0) {
        fprintf(stderr, "bench: cannot write %s\n", config);
        goto err;
    }
    pid_t parent = getpid();
    d->pid = fork();
    if (d->pid < 0) {
        d->pid = 0;
        goto err;
    }
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(o->batond, o->batond, "--config", config, (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", o->batond, strerror(errno));
        _exit(127);
    }
    if (bench_wait_ready_with(d->endpoint, copts, 30000) != 0) {
        fprintf(stderr, "bench: batond on %s did not become ready\n", template_name);
        print_log_tail(d->log);
        goto err;
    }
    return 0;
err:
    bench_daemon_stop(d);
    return -1;
}

void bench_daemon_stop(bench_daemon *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        if (!wait_exit(d->pid, 10000)) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
        }
        d->pid = 0;
    }
    if (d->dir[0])
        bench_rmtree(d->dir);
    d->dir[0] = '\0';
}

/* ---- where the CPU goes --------------------------------------------------- */

void bench_cpu_read(pid_t pid, bench_cpu *out)
{
    memset(out, 0, sizeof(*out));
    char path[128];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char p[300], line[256];
        snprintf(p, sizeof(p), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        FILE *f = fopen(p, "r");
        if (f) {
            unsigned long long ns = 0;
            if (fscanf(f, "%llu", &ns) == 1)
                out->cpu_ns += ns;
            fclose(f);
        }
        snprintf(p, sizeof(p), "/proc/%d/task/%s/status", (int)pid, e->d_name);
        if ((f = fopen(p, "r"))) {
            while (fgets(line, sizeof(line), f)) {
                unsigned long long n = 0;
                if (sscanf(line, "voluntary_ctxt_switches: %llu", &n) == 1 ||
                    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &n) == 1)
                    out->ctxsw += n;
            }
            fclose(f);
        }
    }
    closedir(d);
}

size_t bench_children(pid_t pid, pid_t *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    for (struct dirent *e; n < max && (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char p[300], buf[512];
        snprintf(p, sizeof(p), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* The command name may hold spaces and parentheses: skip to the
         * last ')'; then come the state and the parent's pid. */
        char *rp = strrchr(buf, ')');
        int ppid = 0;
        char state;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)pid)
            out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

pid_t bench_child_named(pid_t pid, const char *name)
{
    pid_t kids[64];
    size_t n = bench_children(pid, kids, 64);
    for (size_t i = 0; i < n; i++) {
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)kids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* Arguments are NUL-separated. */
        for (size_t at = 0; at < len; at += strlen(buf + at) + 1)
            if (!strcmp(buf + at, name))
                return kids[i];
    }
    return 0;
}

/* ---- reports -------------------------------------------------------------- */

static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *c = strchr(line, ':');
        if (!c)
            break;
        c++;
        while (*c == ' ' || *c == '\t')
            c++;
        c[strcspn(c, "\n")] = '\0';
        snprintf(buf, len, "%s", c);
        break;
    }
    fclose(f);
}

void bench_machine_line(char *buf, size_t len)
{
    char cpu[256];
    cpu_model(cpu, sizeof(cpu));
    struct sysinfo si;
    double gib = sysinfo(&si) == 0 ? (double)si.totalram * si.mem_unit / (1u << 30) : 0;
    snprintf(buf, len, "%d CPUs (%s), %.0f GiB RAM, no GPU used", get_nprocs(), cpu, gib);
}

void bench_json_machine(FILE *f)
{
    char cpu[256];
    cpu_model(cpu, sizeof(cpu));
    struct utsname u;
    if (uname(&u) != 0)
        memset(&u, 0, sizeof(u));
    struct sysinfo si;
    double gib = sysinfo(&si) == 0 ? (double)si.totalram * si.mem_unit / (1u << 30) : 0;
    for (char *p = cpu; *p; p++)
        if (*p == '"' || *p == '\\')
            *p = ' ';
    fprintf(f,
            "\"machine\": {\"cpus\": %d, \"cpu_model\": \"%s\", \"memory_gib\": %.1f, "
            "\"kernel\": \"%s %s\", \"gpu\": null}",
            get_nprocs(), cpu, gib, u.sysname, u.release);
}

FILE *bench_json_open(const bench_opts *o)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", o->json);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdir(dir, 0755);
    }
    FILE *f = fopen(o->json, "w");
    if (!f)
        fprintf(stderr, "bench: cannot write %s: %s\n", o->json, strerror(errno));
    return f;
}
