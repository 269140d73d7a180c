/* CURVE keys and the socket options around them (common/curve.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/curve.h"
#include "common/vec.h"

/* A key file is one line; anything much longer is the wrong file. */
#define KEY_FILE_MAX 512
/* An authorized-keys file of this size holds some 20000 keys. */
#define KEYSET_FILE_MAX (1u << 20)

/* The longest name a key may carry, and its string's size. */
#define KEY_NAME_MAX 63

/* One authorized key and the worker name it carries ("" for none). */
typedef struct keyset_entry {
    uint8_t key[32];
    char name[KEY_NAME_MAX + 1];
} keyset_entry;

struct bt_curve_keyset {
    keyset_entry *e;     /* owned; n used of cap */
    size_t n, cap;
};

const char *bt_curve_strerror(int err)
{
    switch (err) {
    case BT_CURVE_OK: return "success";
    case BT_CURVE_ENOTSUP: return "this libzmq was built without CURVE";
    case BT_CURVE_EIO: return "a key file cannot be read or written";
    case BT_CURVE_EFORMAT: return "not a 40-character Z85 key";
    case BT_CURVE_EPERM: return "a secret key file is readable by group or others";
    case BT_CURVE_EMISMATCH: return "a .pub file does not match its secret key";
    case BT_CURVE_EEXIST: return "a key file exists already";
    case BT_CURVE_ENOMEM: return "out of memory";
    case BT_CURVE_ESOCKOPT: return "a CURVE socket option was refused";
    case BT_CURVE_EINVAL: return "invalid argument";
    }
    return "unknown error";
}

__attribute__((format(printf, 3, 4))) static void say(char *err, size_t errlen,
                                                      const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

bool bt_curve_available(void)
{
    return zmq_has("curve") != 0;
}

bool bt_curve_z85_valid(const char *z85, uint8_t key[32])
{
    uint8_t buf[32];
    if (!z85 || strlen(z85) != BT_CURVE_Z85_LEN)
        return false;
    /* zmq_z85_decode reads characters outside the alphabet through a table
     * of its own without complaint on some versions: check them first. */
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";
    for (const char *p = z85; *p; p++)
        if (!strchr(alphabet, *p))
            return false;
    if (!zmq_z85_decode(buf, z85))
        return false;
    if (key)
        memcpy(key, buf, 32);
    return true;
}

int bt_curve_keypair_generate(bt_curve_keypair *out)
{
    if (!bt_curve_available())
        return BT_CURVE_ENOTSUP;
    if (zmq_curve_keypair(out->public_z85, out->secret_z85) != 0)
        return BT_CURVE_ENOTSUP;
    return 0;
}

int bt_curve_public_derive(const char *secret_z85, char *public_z85)
{
    if (!bt_curve_available())
        return BT_CURVE_ENOTSUP;
    if (!bt_curve_z85_valid(secret_z85, NULL))
        return BT_CURVE_EFORMAT;
    if (zmq_curve_public(public_z85, secret_z85) != 0)
        return BT_CURVE_EFORMAT;
    return 0;
}

void bt_curve_wipe(void *p, size_t n)
{
    /* A volatile pointer keeps the compiler from dropping the stores. */
    volatile char *v = p;
    for (size_t i = 0; i < n; i++)
        v[i] = 0;
}

void bt_curve_keypair_wipe(bt_curve_keypair *k)
{
    if (k)
        bt_curve_wipe(k, sizeof(*k));
}

const char *bt_curve_fingerprint(const char *public_z85, char *out)
{
    if (!bt_curve_z85_valid(public_z85, NULL)) {
        strcpy(out, "?");
        return out;
    }
    memcpy(out, public_z85, BT_CURVE_FINGERPRINT_LEN);
    out[BT_CURVE_FINGERPRINT_LEN] = 0;
    return out;
}

/* Reads the file at FD (at most MAX bytes) into a new NUL-terminated
 * buffer; NULL with errno set. */
static char *read_fd(int fd, size_t max, size_t *len)
{
    size_t cap = 256, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= max) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return NULL;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Wipes and frees a buffer that held a key. */
static void free_wiped(char *buf, size_t len)
{
    if (!buf)
        return;
    bt_curve_wipe(buf, len);
    free(buf);
}

/* The one key of a key file's text: leading and trailing white space is
 * dropped, and what remains must be exactly one Z85 key.  OUT holds 41
 * bytes. */
static int parse_key_text(const char *text, char *out)
{
    const char *b = text, *e = text + strlen(text);
    while (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r')
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        e--;
    if (e - b != BT_CURVE_Z85_LEN)
        return BT_CURVE_EFORMAT;
    memcpy(out, b, BT_CURVE_Z85_LEN);
    out[BT_CURVE_Z85_LEN] = 0;
    return bt_curve_z85_valid(out, NULL) ? 0 : BT_CURVE_EFORMAT;
}

/* Opens PATH (close-on-exec) and reads it into a new buffer. */
static int read_key_file(const char *path, bool secret, char **text, size_t *len, char *err,
                         size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        say(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return BT_CURVE_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        say(err, errlen, "%s is not a regular file", path);
        close(fd);
        return BT_CURVE_EIO;
    }
    if (secret && (st.st_mode & 077)) {
        say(err, errlen,
            "%s holds a secret key but is readable by group or others (mode %04o); "
            "chmod 600 it", path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return BT_CURVE_EPERM;
    }
    *text = read_fd(fd, KEY_FILE_MAX, len);
    int e = errno;
    close(fd);
    if (!*text) {
        say(err, errlen, "cannot read %s: %s", path,
            e == EFBIG ? "longer than a key file can be" : strerror(e));
        return e == ENOMEM ? BT_CURVE_ENOMEM : BT_CURVE_EIO;
    }
    return 0;
}

int bt_curve_twin_path(const char *path, char *out, size_t outlen)
{
    size_t n = path ? strlen(path) : 0;
    if (n < 5 || strcmp(path + n - 4, ".key") != 0 || n + 1 > outlen)
        return BT_CURVE_EINVAL;
    memcpy(out, path, n - 4);
    memcpy(out + n - 4, ".pub", 5);
    return 0;
}

int bt_curve_public_load(const char *path, char *out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_key_file(path, false, &text, &len, err, errlen);
    if (rc)
        return rc;
    rc = parse_key_text(text, out);
    free(text);
    if (rc)
        say(err, errlen, "%s does not hold a public key (40 Z85 characters on one line)", path);
    return rc;
}

int bt_curve_secret_load(const char *path, bt_curve_keypair *out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    bt_curve_keypair k;
    if (!bt_curve_available()) {
        say(err, errlen, "cannot use %s: %s", path, bt_curve_strerror(BT_CURVE_ENOTSUP));
        return BT_CURVE_ENOTSUP;
    }
    int rc = read_key_file(path, true, &text, &len, err, errlen);
    if (rc)
        return rc;
    rc = parse_key_text(text, k.secret_z85);
    free_wiped(text, len);
    if (rc == 0)
        rc = bt_curve_public_derive(k.secret_z85, k.public_z85);
    if (rc) {
        say(err, errlen, "%s does not hold a secret key (40 Z85 characters on one line)", path);
        goto err;
    }
    char twin[4096], pub[BT_CURVE_Z85_SIZE];
    if (bt_curve_twin_path(path, twin, sizeof(twin)) == 0 && access(twin, F_OK) == 0) {
        char why[512];
        if ((rc = bt_curve_public_load(twin, pub, why, sizeof(why))) != 0) {
            say(err, errlen, "%s", why);
            goto err;
        }
        if (strcmp(pub, k.public_z85) != 0) {
            say(err, errlen,
                "%s is not the public key of %s (it was made for another key); write it "
                "again or remove it", twin, path);
            rc = BT_CURVE_EMISMATCH;
            goto err;
        }
    }
    *out = k;
    bt_curve_keypair_wipe(&k);
    return 0;

err:
    bt_curve_keypair_wipe(&k);
    return rc;
}

/* Creates PATH with O_EXCL and MODE and writes KEY and a newline. */
static int write_key_file(const char *path, mode_t mode, const char *key, char *err,
                          size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
        say(err, errlen, "cannot create %s: %s%s", path, strerror(errno),
            errno == EEXIST ? " (key files are never overwritten)" : "");
        return errno == EEXIST ? BT_CURVE_EEXIST : BT_CURVE_EIO;
    }
    char line[BT_CURVE_Z85_SIZE + 1];
    memcpy(line, key, BT_CURVE_Z85_LEN);
    line[BT_CURVE_Z85_LEN] = '\n';
    /* fchmod: the umask must not widen nor narrow what was asked. */
    bool ok = fchmod(fd, mode) == 0 &&
              write(fd, line, BT_CURVE_Z85_LEN + 1) == BT_CURVE_Z85_LEN + 1 && fsync(fd) == 0;
    int e = errno;
    bt_curve_wipe(line, sizeof(line));
    if (close(fd) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        say(err, errlen, "cannot write %s: %s", path, strerror(e));
        unlink(path);
        return BT_CURVE_EIO;
    }
    return 0;
}

int bt_curve_keypair_write(const char *dir, const char *name, const bt_curve_keypair *k,
                           char *err, size_t errlen)
{
    char key_path[4096], pub_path[4096];
    if (!name || !*name || strchr(name, '/')) {
        say(err, errlen, "a key name must be non-empty and hold no '/'");
        return BT_CURVE_EINVAL;
    }
    if (!dir || !*dir)
        dir = ".";
    if ((size_t)snprintf(key_path, sizeof(key_path), "%s/%s.key", dir, name) >=
            sizeof(key_path) ||
        (size_t)snprintf(pub_path, sizeof(pub_path), "%s/%s.pub", dir, name) >=
            sizeof(pub_path)) {
        say(err, errlen, "the key path is too long");
        return BT_CURVE_EINVAL;
    }
    /* Both are checked before either is written, so that a refusal leaves
     * nothing behind; O_EXCL below closes the race. */
    if (access(pub_path, F_OK) == 0) {
        say(err, errlen, "%s exists already (key files are never overwritten)", pub_path);
        return BT_CURVE_EEXIST;
    }
    int rc = write_key_file(key_path, 0600, k->secret_z85, err, errlen);
    if (rc)
        return rc;
    rc = write_key_file(pub_path, 0644, k->public_z85, err, errlen);
    if (rc)
        unlink(key_path);
    return rc;
}

/* ---- sets ---- */

bt_curve_keyset *bt_curve_keyset_create(void)
{
    return calloc(1, sizeof(bt_curve_keyset));
}

void bt_curve_keyset_destroy(bt_curve_keyset *s)
{
    if (!s)
        return;
    free(s->e);
    free(s);
}

/* The index of KEY in S, or -1. */
static ptrdiff_t keyset_find(const bt_curve_keyset *s, const uint8_t key[32])
{
    /* A few dozen keys at most: a scan is as fast as anything sorted. */
    for (size_t i = 0; s && i < s->n; i++)
        if (memcmp(s->e[i].key, key, 32) == 0)
            return (ptrdiff_t)i;
    return -1;
}

/* Adds KEY carrying NAME ("" none) unless it is there: a name then joins
 * an unnamed key.  BT_CURVE_EFORMAT when the key carries another name. */
static int keyset_add_raw(bt_curve_keyset *s, const uint8_t key[32], const char *name)
{
    ptrdiff_t at = keyset_find(s, key);
    if (at >= 0) {
        keyset_entry *e = &s->e[at];
        if (e->name[0] && *name && strcmp(e->name, name) != 0)
            return BT_CURVE_EFORMAT;
        if (*name)
            snprintf(e->name, sizeof(e->name), "%s", name);
        return 0;
    }
    if (BT_RESERVE(s->e, s->n, s->cap, 8))
        return BT_CURVE_ENOMEM;
    keyset_entry *e = &s->e[s->n++];
    memcpy(e->key, key, 32);
    snprintf(e->name, sizeof(e->name), "%s", name);
    return 0;
}

int bt_curve_keyset_add(bt_curve_keyset *s, const char *public_z85)
{
    uint8_t key[32];
    if (!bt_curve_z85_valid(public_z85, key))
        return BT_CURVE_EFORMAT;
    return keyset_add_raw(s, key, "");
}

const char *bt_curve_keyset_name_of(const bt_curve_keyset *s, const uint8_t key[32])
{
    ptrdiff_t at = keyset_find(s, key);
    return at >= 0 && s->e[at].name[0] ? s->e[at].name : NULL;
}

const char *bt_curve_keyset_name_at(const bt_curve_keyset *s, size_t i)
{
    return s->e[i].name;
}

bool bt_curve_keyset_names(const bt_curve_keyset *s, const char *name)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0)
            return true;
    return false;
}

void bt_curve_keyset_remove(bt_curve_keyset *s, const char *public_z85)
{
    uint8_t key[32];
    if (!s || !bt_curve_z85_valid(public_z85, key))
        return;
    ptrdiff_t i = keyset_find(s, key);
    if (i < 0)
        return;
    memmove(&s->e[i], &s->e[i + 1], (s->n - (size_t)i - 1) * sizeof(*s->e));
    s->n--;
}

bool bt_curve_keyset_contains(const bt_curve_keyset *s, const uint8_t key[32])
{
    return keyset_find(s, key) >= 0;
}

size_t bt_curve_keyset_count(const bt_curve_keyset *s)
{
    return s ? s->n : 0;
}

/* Whether NAME ("" for none) may follow a key on its line. */
static bool key_name_ok(const char *name)
{
    size_t len = strlen(name);
    if (len > KEY_NAME_MAX)
        return false;
    for (const char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_.-", *c))
            return false;
    return true;
}

int bt_curve_keyset_load(bt_curve_keyset *s, const char *path, int *line, char *err,
                         size_t errlen)
{
    *line = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        say(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return BT_CURVE_EIO;
    }
    size_t len = 0;
    char *text = read_fd(fd, KEYSET_FILE_MAX, &len);
    int e = errno;
    close(fd);
    if (!text) {
        say(err, errlen, "cannot read %s: %s", path,
            e == EFBIG ? "larger than 1 MiB; is it a key list?" : strerror(e));
        return e == ENOMEM ? BT_CURVE_ENOMEM : BT_CURVE_EIO;
    }
    /* Keys go to a set of their own first, so that S is left unchanged on
     * an error. */
    bt_curve_keyset *add = bt_curve_keyset_create();
    int rc = add ? 0 : BT_CURVE_ENOMEM;
    int n = 0;
    for (char *p = text; rc == 0 && p && *p;) {
        char *eol = strchr(p, '\n');
        if (eol)
            *eol = 0;
        n++;
        char *b = p, *end = p + strlen(p);
        while (*b == ' ' || *b == '\t')
            b++;
        while (end > b && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        *end = 0;
        uint8_t key[32];
        if (*b && *b != '#') {
            /* The key, then after blanks the name it carries, if any. */
            char *name = b + strcspn(b, " \t");
            if (*name) {
                *name++ = 0;
                name += strspn(name, " \t");
            }
            if (!bt_curve_z85_valid(b, key)) {
                *line = n;
                say(err, errlen,
                    "%s:%d:%d: not a public key (expected 40 Z85 characters, got %zu "
                    "characters)", path, n, (int)(b - p) + 1, strlen(b));
                rc = BT_CURVE_EFORMAT;
            } else if (!key_name_ok(name)) {
                *line = n;
                say(err, errlen,
                    "%s:%d:%d: after the key, one name of a worker (letters, digits, '_', "
                    "'.', '-'; at most %d characters) is allowed, nothing else", path, n,
                    (int)(name - p) + 1, KEY_NAME_MAX);
                rc = BT_CURVE_EFORMAT;
            } else if ((rc = keyset_add_raw(add, key, name)) == BT_CURVE_EFORMAT) {
                *line = n;
                say(err, errlen, "%s:%d:%d: this key was given another name on an earlier "
                    "line (a key belongs to one worker)", path, n, (int)(name - p) + 1);
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    for (size_t i = 0; rc == 0 && i < add->n; i++)
        rc = keyset_add_raw(s, add->e[i].key, add->e[i].name);
    bt_curve_keyset_destroy(add);
    free(text);
    return rc;
}

/* ---- sockets ---- */

int bt_curve_apply_server(void *sock, const bt_curve_keypair *k, const char *zap_domain)
{
    int one = 1;
    if (!sock || !k)
        return BT_CURVE_EINVAL;
    if (!bt_curve_available())
        return BT_CURVE_ENOTSUP;
    /* Z85 keys are set as 40-character strings (41 bytes with the NUL). */
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->secret_z85, BT_CURVE_Z85_SIZE) != 0)
        return BT_CURVE_ESOCKOPT;
    if (zap_domain &&
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, zap_domain, strlen(zap_domain)) != 0)
        return BT_CURVE_ESOCKOPT;
    return 0;
}

int bt_curve_apply_client(void *sock, const bt_curve_keypair *own, const char *server_public_z85)
{
    if (!sock || !own || !server_public_z85)
        return BT_CURVE_EINVAL;
    if (!bt_curve_available())
        return BT_CURVE_ENOTSUP;
    if (!bt_curve_z85_valid(server_public_z85, NULL))
        return BT_CURVE_EFORMAT;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, BT_CURVE_Z85_SIZE) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, own->public_z85, BT_CURVE_Z85_SIZE) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, BT_CURVE_Z85_SIZE) != 0)
        return BT_CURVE_ESOCKOPT;
    return 0;
}
