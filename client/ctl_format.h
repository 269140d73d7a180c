/* batonctl's output formats (client/ctl_format.c): tensors and answers as
 * readable text or as one JSON object per line, and float conversions to
 * the half-precision dtypes. */
#ifndef BATON_CLIENT_CTL_FORMAT_H
#define BATON_CLIENT_CTL_FORMAT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "baton/client.h"

/* F as IEEE binary16, rounded to nearest even (subnormals, inf, NaN kept). */
uint16_t ctl_f32_to_f16(float f);

/* F as bfloat16, rounded to nearest even (NaN kept a NaN). */
uint16_t ctl_f32_to_bf16(float f);

/* True for a U8 tensor whose modality is "text" (UTF-8 bytes). */
bool ctl_is_text(const baton_client_tensor *t);

/* One line: "NAME (text): TEXT" for text; "NAME: DTYPE[DIMS] = [[...]]" with
 * every value when the tensor is small; shape, count and the first values
 * when it is large. */
void ctl_print_tensor(FILE *out, const baton_client_tensor *t);

/* SECONDS as MM:SS.mmm, or H:MM:SS.mmm from an hour on, into OUT. */
void ctl_clock(double seconds, char *out, size_t len);

/* The per-node timings of a response as a table on stderr. */
void ctl_print_timings(const baton_client_event *ev);

/* EV as one JSON object and a newline, flushed (batonctl --help shows the
 * shape of each kind). */
void ctl_print_json(FILE *out, const baton_client_event *ev);

#endif
