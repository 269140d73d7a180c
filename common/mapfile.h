/* A whole regular file mapped read-only, for the model readers (GGUF,
 * safetensors, CTranslate2): opened close-on-exec, checked to be a regular
 * file, mapped MAP_PRIVATE and PROT_READ, and the descriptor closed at
 * once, since the mapping holds the file.  A private mapping keeps another
 * process's later writes to the file from showing through (short of a
 * truncation, which raises SIGBUS on access). */
#ifndef BATON_COMMON_MAPFILE_H
#define BATON_COMMON_MAPFILE_H

#include <stddef.h>

#include "common/status.h"

/* Maps PATH: *DATA and *SIZE (bytes) on success, *DATA NULL for an empty
 * file (nothing to unmap).  BT_EIO otherwise, with "NAME: ..." in
 * ERR[ERRLEN] saying which step failed and why; NAME (NULL: PATH) is what
 * the caller calls the file.  Release with bt_mapfile_unmap. */
int bt_mapfile_map(const char *path, const char *name, void **data, size_t *size, char *err,
                   size_t errlen);
void bt_mapfile_unmap(void *data, size_t size);  /* NULL DATA is a no-op */

#endif
