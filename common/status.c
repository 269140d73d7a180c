/* Status codes (common/status.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "baton/backend.h"
#include "baton/client.h"
#include "common/status.h"

/* The three names of the client-facing codes must agree number by number. */
#define SAME_CODE(x)                                                                           \
    _Static_assert((int)BT_CODE_##x == (int)BATON_STATUS_##x &&                               \
                       (int)BT_CODE_##x == (int)BATON_CLIENT_CODE_##x,                        \
                   "status code " #x " differs between common/status.h and include/baton/")
SAME_CODE(OK);
SAME_CODE(CANCELLED);
SAME_CODE(UNKNOWN);
SAME_CODE(INVALID_ARGUMENT);
SAME_CODE(DEADLINE_EXCEEDED);
SAME_CODE(NOT_FOUND);
SAME_CODE(ALREADY_EXISTS);
SAME_CODE(RESOURCE_EXHAUSTED);
SAME_CODE(FAILED_PRECONDITION);
SAME_CODE(INTERNAL);
SAME_CODE(UNAVAILABLE);

/* Baton's own codes must not meet an errno.  The largest errno values of
 * Linux are checked where the C library defines them. */
_Static_assert(BT_ERR_OWN_LAST < BT_ERR_OWN_BASE && BT_ERR_OWN_BASE < -1000,
               "baton's own codes must sit below every errno");
#ifdef EHWPOISON
_Static_assert(-EHWPOISON > BT_ERR_OWN_BASE, "an errno reaches baton's own codes");
#endif

/* One row per named code: the two functions below read the same table, so
 * a code cannot have a message without a name.  The errno codes keep
 * baton's wording ("not found" rather than "No such file or directory"),
 * which reads right for a key or a slot as well as a file. */
#define BT_ERRORS(X)                                                                           \
    X(BT_OK, "success")                                                                        \
    X(BT_ENOMEM, "out of memory")                                                              \
    X(BT_EINVAL, "invalid argument")                                                           \
    X(BT_ENOENT, "not found")                                                                  \
    X(BT_EEXIST, "already exists")                                                             \
    X(BT_EIO, "input/output error")                                                            \
    X(BT_ERANGE, "out of range")                                                               \
    X(BT_EBUSY, "busy: a limit is reached or work is pending")                                 \
    X(BT_ECONFIG, "configuration has errors")                                                  \
    X(BT_ESTATE, "not legal in the current state")                                             \
    X(BT_EINTERNAL, "internal error")                                                          \
    X(BT_EFORMAT, "malformed or unsupported data")                                             \
    X(BT_ETYPE, "type, dtype or size mismatch")                                                \
    X(BT_EUNSUPPORTED, "not supported by this build")                                          \
    X(BT_ENOTEMPLATE, "no chat template this build can render")                                \
    X(BT_EORDER, "op reads a value no earlier op produced")                                    \
    X(BT_EREDEF, "op writes a value it may not write")                                         \
    X(BT_ENOOP, "no op function for an op of the graph")                                       \
    X(BT_EUNBOUND, "an input or parameter is not set")                                         \
    X(BT_ETHREAD, "cannot start a thread")                                                     \
    X(BT_EOP, "an op failed")                                                                  \
    X(BT_EDEVICE, "the device failed (memory, stream, event or graph)")

/* Another negative errno is described by the C library.  glibc 2.32 and
 * later have strerrordesc_np and strerrorname_np, which return static
 * strings (NULL for a number that is no errno) and so, unlike strerror,
 * are safe from any thread without a buffer.  Elsewhere such a code reads
 * "unknown error". */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#define ERRNO_TEXT(e) strerrordesc_np(e)
#define ERRNO_NAME(e) strerrorname_np(e)
#else
#define ERRNO_TEXT(e) ((void)(e), (const char *)NULL)
#define ERRNO_NAME(e) ((void)(e), (const char *)NULL)
#endif

/* Whether ERR can be a negated errno rather than one of baton's codes. */
static int is_errno(int err)
{
    return err < 0 && err > BT_ERR_OWN_BASE;
}

const char *bt_strerror(int err)
{
    switch (err) {
#define MESSAGE(code, text) case code: return text;
        BT_ERRORS(MESSAGE)
#undef MESSAGE
    }
    const char *text = is_errno(err) ? ERRNO_TEXT(-err) : NULL;
    return text ? text : "unknown error";
}

const char *bt_err_name(int err)
{
    switch (err) {
#define NAME(code, text) case code: return #code;
        BT_ERRORS(NAME)
#undef NAME
    }
    const char *name = is_errno(err) ? ERRNO_NAME(-err) : NULL;
    return name ? name : "BT_E?";
}

int bt_errorf(char *err, size_t errlen, int status, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *bt_code_name(bt_code code)
{
    switch (code) {
    case BT_CODE_OK: return "OK";
    case BT_CODE_CANCELLED: return "CANCELLED";
    case BT_CODE_UNKNOWN: return "UNKNOWN";
    case BT_CODE_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case BT_CODE_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case BT_CODE_NOT_FOUND: return "NOT_FOUND";
    case BT_CODE_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case BT_CODE_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case BT_CODE_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case BT_CODE_INTERNAL: return "INTERNAL";
    case BT_CODE_UNAVAILABLE: return "UNAVAILABLE";
    }
    return "UNKNOWN";
}

bt_code bt_err_to_code(int err)
{
    switch (err) {
    case BT_OK: return BT_CODE_OK;
    case BT_EINVAL:
    case BT_EFORMAT:
    case BT_ETYPE: return BT_CODE_INVALID_ARGUMENT;
    case BT_ENOENT: return BT_CODE_NOT_FOUND;
    case BT_EEXIST: return BT_CODE_ALREADY_EXISTS;
    case BT_EBUSY: return BT_CODE_RESOURCE_EXHAUSTED;
    case BT_ESTATE: return BT_CODE_FAILED_PRECONDITION;
    case BT_EUNSUPPORTED:
    case BT_ENOTEMPLATE: return BT_CODE_FAILED_PRECONDITION;
    case BT_ENOMEM:
    case BT_ERANGE: return BT_CODE_RESOURCE_EXHAUSTED;
    default: return BT_CODE_INTERNAL;
    }
}
