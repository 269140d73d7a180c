/* A reader of the protobuf wire format, field by field, without a schema:
 * for what the generated parsers cannot say (the byte length of a string
 * on the wire, a field number they let through) or cannot be given (a
 * frame they refused, whose request must still be identified). */
#ifndef BATON_COMMON_PBWIRE_H
#define BATON_COMMON_PBWIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
    PBW_VARINT = 0,
    PBW_FIXED64 = 1,
    PBW_BYTES = 2,                /* length-delimited: strings, bytes, messages, packed */
    PBW_FIXED32 = 5
};

typedef struct pbw_reader {
    const uint8_t *p, *end;
} pbw_reader;

typedef struct pbw_field {
    uint64_t number;              /* as on the wire: 0 and numbers past 2^29-1 are possible */
    int wire;                     /* PBW_* */
    uint64_t value;               /* PBW_VARINT, PBW_FIXED64, PBW_FIXED32 */
    const uint8_t *data;          /* PBW_BYTES: the bytes, inside the reader's buffer */
    size_t len;
} pbw_field;

static inline pbw_reader pbw_init(const void *buf, size_t len)
{
    return (pbw_reader){(const uint8_t *)buf, (const uint8_t *)buf + len};
}

/* Reads the next field into F.  Returns 1, 0 at the end of the buffer, or
 * BT_EINVAL when the bytes are not a field (a truncated varint or length,
 * a group or an unknown wire type). */
int pbw_next(pbw_reader *r, pbw_field *f);

/* Reads one varint at *P (before END) into V and advances *P.  0 or
 * BT_EINVAL. */
int pbw_varint(const uint8_t **p, const uint8_t *end, uint64_t *v);

#endif
