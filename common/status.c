#include "common/status.h"

const char *bt_strerror(int err)
{
    switch (err) {
    case BT_OK: return "success";
    case BT_ENOMEM: return "out of memory";
    case BT_EINVAL: return "invalid argument";
    case BT_ENOENT: return "not found";
    case BT_EEXIST: return "already exists";
    case BT_EIO: return "input/output error";
    case BT_ECONFIG: return "configuration has errors";
    case BT_ESTATE: return "not legal in the current state";
    case BT_ERANGE: return "out of range";
    case BT_EBUSY: return "limit reached";
    case BT_EINTERNAL: return "internal error";
    }
    return "unknown error";
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
    case BT_EINVAL: return BT_CODE_INVALID_ARGUMENT;
    case BT_ENOENT: return BT_CODE_NOT_FOUND;
    case BT_EEXIST: return BT_CODE_ALREADY_EXISTS;
    case BT_EBUSY: return BT_CODE_RESOURCE_EXHAUSTED;
    case BT_ESTATE: return BT_CODE_FAILED_PRECONDITION;
    case BT_ENOMEM:
    case BT_ERANGE: return BT_CODE_RESOURCE_EXHAUSTED;
    default: return BT_CODE_INTERNAL;
    }
}
