/* CURVE keys for ZeroMQ sockets: key files, authorized-key sets, and the
 * socket options of a CURVE server or client.  The crypto is libzmq's own
 * (zmq_curve_keypair, zmq_curve_public, zmq_z85_decode); this module only
 * reads, checks and hands keys around.
 *
 * Key files are ZeroMQ Z85 text: NAME.key holds the 40-character secret
 * key, NAME.pub its 40-character public key, each alone on its first line
 * (a trailing newline is allowed).  A secret key file must not be readable
 * by group or others, as ssh asks of its keys.  The public half of a pair
 * is always derived from the secret one; a .pub twin that does not match
 * is an error rather than trusted.  An authorized-keys file lists public
 * keys, one per line; blank lines and lines starting with '#' are skipped.
 * A key may be followed, after blanks, by one name (letters, digits, and
 * "_.-", at most 63): the worker it belongs to, for batond's worker_keys
 * (a name may carry several keys, so that a key can be rolled over; a key
 * carries at most one name).
 *
 * No function here logs or prints a key.  Error messages name the file and
 * the line, never the key's characters; bt_curve_fingerprint gives the
 * first 8 characters of a PUBLIC key for logs.
 *
 * Functions return 0 or a negative bt_curve_err; those that read files
 * also write a sentence into ERR (ERRLEN bytes, may be 0) saying what and
 * where. */
#ifndef BATON_COMMON_CURVE_H
#define BATON_COMMON_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Characters of a Z85 key, and bytes of the string holding one. */
#define BT_CURVE_Z85_LEN 40
#define BT_CURVE_Z85_SIZE 41
/* Characters of a fingerprint, and bytes of its string. */
#define BT_CURVE_FINGERPRINT_LEN 8

typedef enum bt_curve_err {
    BT_CURVE_OK = 0,
    BT_CURVE_ENOTSUP = -1,   /* libzmq was built without CURVE */
    BT_CURVE_EIO = -2,       /* a file cannot be opened, read or written */
    BT_CURVE_EFORMAT = -3,   /* not a 40-character Z85 key */
    BT_CURVE_EPERM = -4,     /* a secret key file readable by group or others */
    BT_CURVE_EMISMATCH = -5, /* a .pub file that is not the secret key's public half */
    BT_CURVE_EEXIST = -6,    /* a key file to write exists already */
    BT_CURVE_ENOMEM = -7,    /* an allocation failed */
    BT_CURVE_ESOCKOPT = -8,  /* zmq_setsockopt refused a CURVE option */
    BT_CURVE_EINVAL = -9     /* a bad argument (a NULL key, an empty name) */
} bt_curve_err;

/* A key pair, both halves Z85 and NUL-terminated.  The secret half is
 * wiped by bt_curve_keypair_wipe; copies are the holder's to wipe. */
typedef struct bt_curve_keypair {
    char public_z85[BT_CURVE_Z85_SIZE];
    char secret_z85[BT_CURVE_Z85_SIZE];
} bt_curve_keypair;

/* A set of authorized public keys (32 bytes each, decoded). */
typedef struct bt_curve_keyset bt_curve_keyset;

/* A sentence naming ERR; "unknown error" for another number. */
const char *bt_curve_strerror(int err);

/* Whether libzmq has CURVE (zmq_has("curve")). */
bool bt_curve_available(void);

/* Whether Z85 is a 40-character Z85 string that decodes to 32 bytes.
 * When KEY is not NULL the 32 bytes are written there. */
bool bt_curve_z85_valid(const char *z85, uint8_t key[32]);

/* A fresh key pair.  BT_CURVE_ENOTSUP without CURVE. */
int bt_curve_keypair_generate(bt_curve_keypair *out);

/* The public half of SECRET_Z85 into PUBLIC_Z85 (41 bytes). */
int bt_curve_public_derive(const char *secret_z85, char *public_z85);

/* Overwrites the secret half (and the public one) of K.  NULL is a no-op. */
void bt_curve_keypair_wipe(bt_curve_keypair *k);

/* Overwrites N bytes at P (a buffer that held a key) in a way the compiler
 * does not drop as a dead store. */
void bt_curve_wipe(void *p, size_t n);

/* The first 8 characters of a public key, NUL-terminated, into OUT (at
 * least 9 bytes); "?" when PUBLIC_Z85 is not a key.  Returns OUT. */
const char *bt_curve_fingerprint(const char *public_z85, char *out);

/* Reads the secret key file PATH (normally NAME.key) into OUT->secret_z85
 * and derives OUT->public_z85.  BT_CURVE_EPERM when the file is readable by
 * group or others; when PATH ends in ".key" and the ".pub" twin beside it
 * exists, BT_CURVE_EMISMATCH unless it holds the derived public key. */
int bt_curve_secret_load(const char *path, bt_curve_keypair *out, char *err, size_t errlen);

/* Reads the public key file PATH into OUT (41 bytes). */
int bt_curve_public_load(const char *path, char *out, char *err, size_t errlen);

/* The ".pub" twin of a ".key" path into OUT (OUTLEN bytes): BT_CURVE_EINVAL
 * when PATH does not end in ".key" or the result does not fit. */
int bt_curve_twin_path(const char *path, char *out, size_t outlen);

/* Writes DIR/NAME.key (mode 0600) and DIR/NAME.pub (mode 0644), each
 * created with O_EXCL: BT_CURVE_EEXIST when either exists (nothing is
 * written then).  DIR NULL: the current directory. */
int bt_curve_keypair_write(const char *dir, const char *name, const bt_curve_keypair *k,
                           char *err, size_t errlen);

/* ---- sets of authorized keys ---- */

bt_curve_keyset *bt_curve_keyset_create(void);
/* NULL is a no-op. */
void bt_curve_keyset_destroy(bt_curve_keyset *s);
/* Adds the Z85 public key (a key already there is not added twice). */
int bt_curve_keyset_add(bt_curve_keyset *s, const char *public_z85);
/* The name the 32-byte KEY carries in S, or NULL when it carries none or
 * is not in S. */
const char *bt_curve_keyset_name_of(const bt_curve_keyset *s, const uint8_t key[32]);
/* The name key I of S carries ("" for none); I < bt_curve_keyset_count. */
const char *bt_curve_keyset_name_at(const bt_curve_keyset *s, size_t i);
/* Whether some key of S carries NAME (S NULL: none does). */
bool bt_curve_keyset_names(const bt_curve_keyset *s, const char *name);
/* Removes it; nothing happens when it is not there. */
void bt_curve_keyset_remove(bt_curve_keyset *s, const char *public_z85);
/* Whether the 32-byte KEY is in S (S NULL: never). */
bool bt_curve_keyset_contains(const bt_curve_keyset *s, const uint8_t key[32]);
size_t bt_curve_keyset_count(const bt_curve_keyset *s);
/* Adds every key of the authorized-keys file PATH, with its name when the
 * line gives one.  A line that is not a key (and a name), or a key named
 * twice with different names, is BT_CURVE_EFORMAT, with its number in
 * *LINE (and in ERR); on any error S is left as it was. */
int bt_curve_keyset_load(bt_curve_keyset *s, const char *path, int *line, char *err,
                         size_t errlen);

/* ---- sockets ---- */

/* Makes SOCK (not yet bound) a CURVE server with K's secret key.
 * ZAP_DOMAIN (may be NULL) goes in ZMQ_ZAP_DOMAIN, so that a ZAP handler
 * can tell this socket's peers from another socket's. */
int bt_curve_apply_server(void *sock, const bt_curve_keypair *k, const char *zap_domain);

/* Makes SOCK (not yet connected) a CURVE client with the key pair OWN,
 * talking to the server whose public key is SERVER_PUBLIC_Z85. */
int bt_curve_apply_client(void *sock, const bt_curve_keypair *own, const char *server_public_z85);

#endif
