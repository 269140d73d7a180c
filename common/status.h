/* Status codes shared by every module.
 *
 * Functions return 0 on success or a negative bt_err.  The client-facing
 * codes of proto/baton.proto (enum Code) are a separate, positive space:
 * bt_code.  bt_err_to_code maps an internal failure onto the code a client
 * sees. */
#ifndef BATON_COMMON_STATUS_H
#define BATON_COMMON_STATUS_H

typedef enum bt_err {
    BT_OK = 0,
    BT_ENOMEM = -1,    /* an allocation failed */
    BT_EINVAL = -2,    /* an argument or input is malformed */
    BT_ENOENT = -3,    /* a named thing does not exist */
    BT_EEXIST = -4,    /* a named thing exists already */
    BT_EIO = -5,       /* a read or write failed; errno says more */
    BT_ECONFIG = -6,   /* the configuration has errors (see the diagnostics) */
    BT_ESTATE = -7,    /* the call is not legal in the current state */
    BT_ERANGE = -8,    /* a size or index is out of bounds */
    BT_EBUSY = -9,     /* a limit is reached; try later */
    BT_EINTERNAL = -10 /* a bug: an invariant that should hold did not */
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

const char *bt_strerror(int err);
const char *bt_code_name(bt_code code);
bt_code bt_err_to_code(int err);

#endif
