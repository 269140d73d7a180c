/* Status codes shared by every module: one internal error space and one
 * client-facing status space.
 *
 * Internal: a function returns 0 or a negative bt_err, like libuv's UV_E*;
 * bt_strerror says what a code means and bt_err_name spells it.  Every
 * module of the project (kernels, backends, config, runtime, daemon,
 * worker) draws from this one list, so a code means the same wherever it
 * surfaces.  A message with detail goes beside the code, formatted by
 * bt_errorf into a buffer the caller owns.
 *
 * Client-facing: bt_code mirrors proto enum Code (gRPC's numbers), the
 * status of a request.  The public headers carry the same numbers under
 * their own names, baton_status (include/baton/backend.h) and
 * baton_client_code (include/baton/client.h), because a plugin or a client
 * program includes only them; status.c checks that the three agree.
 * bt_err_to_code maps an internal failure onto the code a client sees. */
#ifndef BATON_COMMON_STATUS_H
#define BATON_COMMON_STATUS_H

#include <stddef.h>

typedef enum bt_err {
    BT_OK = 0,
    BT_ENOMEM = -1,       /* an allocation failed */
    BT_EINVAL = -2,       /* an argument or input is malformed */
    BT_ENOENT = -3,       /* a named thing (key, parameter, slot, file) does not exist */
    BT_EEXIST = -4,       /* a named thing exists already */
    BT_EIO = -5,          /* a read, write, open or map failed; errno says more */
    BT_ECONFIG = -6,      /* the configuration has errors (see the diagnostics) */
    BT_ESTATE = -7,       /* the call is not legal in the current state */
    BT_ERANGE = -8,       /* a size, index or value is out of range */
    BT_EBUSY = -9,        /* a limit is reached, or work is pending; try later */
    BT_EINTERNAL = -10,   /* a bug: an invariant that should hold did not */
    BT_EFORMAT = -11,     /* file data is malformed, truncated or of an unsupported kind */
    BT_ETYPE = -12,       /* a value has another type, dtype or size than asked for */
    BT_EUNSUPPORTED = -13, /* a kind of model, tokenizer or template this build lacks */
    BT_ENOTEMPLATE = -14, /* no chat template this build can render */
    BT_EORDER = -15,      /* an op reads a value that no earlier op produced */
    BT_EREDEF = -16,      /* an op writes an input, parameter or already-written value */
    BT_ENOOP = -17,       /* no function in the op table for an op of the graph */
    BT_EUNBOUND = -18,    /* an input slot or parameter was never set */
    BT_ETHREAD = -19,     /* a thread could not start */
    BT_EOP = -20,         /* an op failed while running (its table says why) */
    BT_EDEVICE = -21      /* the device failed: allocation, stream, event or graph */
} bt_err;

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

/* What ERR means ("out of memory"); "unknown error" for a code not listed. */
const char *bt_strerror(int err);
/* ERR spelled ("BT_ENOMEM"); "BT_E?" for a code not listed. */
const char *bt_err_name(int err);
/* Formats a message into ERR (ERRLEN bytes, truncated, always terminated;
 * ERR may be NULL) and returns STATUS, so that a failure reads
 * `return bt_errorf(err, errlen, BT_EFORMAT, "tensor %s: ...", name);`. */
int bt_errorf(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

const char *bt_code_name(bt_code code);
bt_code bt_err_to_code(int err);

#endif
