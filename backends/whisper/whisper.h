/* The `whisper` backend: speech to text with Whisper, from a CTranslate2
 * folder (model.bin, config.json, tokenizer.json), as three node modes
 * (backend.c explains them). */
#ifndef BATON_BACKENDS_WHISPER_H
#define BATON_BACKENDS_WHISPER_H

#include "baton/backend.h"

const baton_backend *bk_whisper_backend(void);

#endif
