/* Status codes shared by every module: one internal error space and one
 * client-facing status space.
 *
 * Internal: a function returns 0 or a negative bt_err, like libuv's UV_E*;
 * bt_strerror says what a code means and bt_err_name spells it.  Every
 * module of the project (kernels, backends, config, runtime, daemon,
 * worker) draws from this one space, so a code means the same wherever it
 * surfaces.  A message with detail goes beside the code, formatted by
 * bt_errorf into a buffer the caller owns.
 *
 * The space is libuv's: where a POSIX errno says it, the code IS that
 * errno negated (BT_ENOMEM == -ENOMEM), so that a kernel's or a system
 * call's -errno needs no translation and compares equal to the name;
 * baton's own codes sit below BT_ERR_OWN_BASE, far past every errno, so
 * that the two cannot collide.  Any other negative errno is a code too:
 * bt_strerror and bt_err_name describe it through the C library.
 *
 * Client-facing: bt_code mirrors proto enum Code (gRPC's numbers), the
 * status of a request.  The public headers carry the same numbers under
 * their own names, baton_status (include/baton/backend.h) and
 * baton_client_code (include/baton/client.h), because a plugin or a client
 * program includes only them; status.c checks that the three agree.
 * bt_err_to_code maps an internal failure onto the code a client sees.
 * No bt_err number leaves a process (the wire and the files carry bt_code
 * or text), so the numbers may change between builds. */
#ifndef BATON_COMMON_STATUS_H
#define BATON_COMMON_STATUS_H

#include <errno.h>
#include <stddef.h>

/* Baton's own codes are BT_ERR_OWN_BASE - 1 and below.  Linux's errno
 * values stop under 200; libuv reserves the same neighbourhood for its own
 * codes, for the same reason. */
#define BT_ERR_OWN_BASE (-4000)

typedef enum bt_err {
    BT_OK = 0,
    /* The errno codes. */
    BT_ENOMEM = -ENOMEM,  /* an allocation failed */
    BT_EINVAL = -EINVAL,  /* an argument or input is malformed */
    BT_ENOENT = -ENOENT,  /* a named thing (key, parameter, slot, file) does not exist */
    BT_EEXIST = -EEXIST,  /* a named thing exists already */
    BT_EIO = -EIO,        /* a read, write, open or map failed; errno says more */
    BT_ERANGE = -ERANGE,  /* a size, index or value is out of range */
    BT_EBUSY = -EBUSY,    /* a limit is reached, or work is pending; try later */
    /* Baton's own codes, which no errno says. */
    BT_ECONFIG = BT_ERR_OWN_BASE - 1,       /* the configuration has errors (see the diagnostics) */
    BT_ESTATE = BT_ERR_OWN_BASE - 2,        /* the call is not legal in the current state */
    BT_EINTERNAL = BT_ERR_OWN_BASE - 3,     /* a bug: an invariant that should hold did not */
    BT_EFORMAT = BT_ERR_OWN_BASE - 4,       /* file data is malformed, truncated or of an
                                               unsupported kind */
    BT_ETYPE = BT_ERR_OWN_BASE - 5,         /* a value has another type, dtype or size than
                                               asked for */
    BT_EUNSUPPORTED = BT_ERR_OWN_BASE - 6,  /* a kind of model, tokenizer or template this
                                               build lacks */
    BT_ENOTEMPLATE = BT_ERR_OWN_BASE - 7,   /* no chat template this build can render */
    BT_EORDER = BT_ERR_OWN_BASE - 8,        /* an op reads a value that no earlier op produced */
    BT_EREDEF = BT_ERR_OWN_BASE - 9,        /* an op writes an input, parameter or
                                               already-written value */
    BT_ENOOP = BT_ERR_OWN_BASE - 10,        /* no function in the op table for an op of the
                                               graph */
    BT_EUNBOUND = BT_ERR_OWN_BASE - 11,     /* an input slot or parameter was never set */
    BT_ETHREAD = BT_ERR_OWN_BASE - 12,      /* a thread could not start */
    BT_EOP = BT_ERR_OWN_BASE - 13,          /* an op failed while running (its table says why) */
    BT_EDEVICE = BT_ERR_OWN_BASE - 14       /* the device failed: allocation, stream, event or
                                               graph */
} bt_err;

/* The lowest of baton's own codes (tests walk BT_ERR_OWN_BASE - 1 down to it). */
#define BT_ERR_OWN_LAST BT_EDEVICE

/* The client-facing status codes; numbers equal proto enum Code. */
typedef enum bt_code {
    BT_CODE_OK = 0,
    BT_CODE_CANCELLED = 1,
    BT_CODE_UNKNOWN = 2,
    BT_CODE_INVALID_ARGUMENT = 3,
    BT_CODE_DEADLINE_EXCEEDED = 4,
    BT_CODE_NOT_FOUND = 5,
    BT_CODE_ALREADY_EXISTS = 6,
    BT_CODE_RESOURCE_EXHAUSTED = 8,
    BT_CODE_FAILED_PRECONDITION = 9,
    BT_CODE_INTERNAL = 13,
    BT_CODE_UNAVAILABLE = 14
} bt_code;

/* What ERR means ("out of memory"): a named code's text, else for any
 * other negative errno the C library's ("No space left on device"), else
 * "unknown error".  The text is static: safe from any thread. */
const char *bt_strerror(int err);
/* ERR spelled: a named code's name ("BT_ENOMEM"), else for any other
 * negative errno its macro's ("ENOSPC"), else "BT_E?".  Static, as above. */
const char *bt_err_name(int err);
/* Formats a message into ERR (ERRLEN bytes, truncated, always terminated;
 * ERR may be NULL) and returns STATUS, so that a failure reads
 * `return bt_errorf(err, errlen, BT_EFORMAT, "tensor %s: ...", name);`. */
int bt_errorf(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

const char *bt_code_name(bt_code code);
bt_code bt_err_to_code(int err);

#endif
