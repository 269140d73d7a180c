/* The kernels' device of a backend's model, from the worker's device name
 * ("cpu" or "cuda:N"), for every built-in backend that compiles graphs. */
#ifndef BATON_BACKENDS_DEVICE_H
#define BATON_BACKENDS_DEVICE_H

#include <stddef.h>

#include "baton/backend.h"
#include "kernels/exec.h"

/* *DEV NULL for "cpu" (or a NULL NAME), else the CUDA device of the
 * ordinal in *ORDINAL (-1 for the CPU).  BATON_STATUS_OK, or
 * INVALID_ARGUMENT (a name that is neither) or FAILED_PRECONDITION (no
 * such GPU here, or a build without CUDA) with ERR naming the device and
 * WHO (the backend). */
baton_status bk_device_open(const char *name, const char *who, const kx_device **dev,
                            int *ordinal, char *err, size_t errlen);

#endif
