/* The `transformer` backend: a Llama-family decoder read from a GGUF file,
 * run as executable graphs (backend.c explains the design). */
#ifndef BATON_BACKENDS_TRANSFORMER_H
#define BATON_BACKENDS_TRANSFORMER_H

#include "baton/backend.h"

const baton_backend *bk_transformer_backend(void);

#endif
