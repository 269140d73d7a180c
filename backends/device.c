#include "backends/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

baton_status bk_device_open(const char *name, const char *who, const kx_device **dev,
                            int *ordinal, char *err, size_t errlen)
{
    *dev = NULL;
    *ordinal = -1;
    if (!name || strcmp(name, "cpu") == 0)
        return BATON_STATUS_OK;
    char *end = NULL;
    long ord = strncmp(name, "cuda:", 5) == 0 ? strtol(name + 5, &end, 10) : -1;
    if (ord < 0 || ord > 1024 || !end || *end || end == name + 5) {
        snprintf(err, errlen, "device %s: %s runs on cpu or cuda:N", name, who);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
#ifdef BATON_CUDA
    *dev = kx_device_cuda((int)ord);
#endif
    if (!*dev) {
        snprintf(err, errlen, "device %s: %s", name,
#ifdef BATON_CUDA
                 "no such GPU on this machine"
#else
                 "this build of baton has no CUDA"
#endif
        );
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    *ordinal = (int)ord;
    return BATON_STATUS_OK;
}
