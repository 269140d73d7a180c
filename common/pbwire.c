/* The protobuf wire reader (common/pbwire.h). */
#include "common/pbwire.h"

#include "common/status.h"

int pbw_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return BT_EINVAL;
}

int pbw_next(pbw_reader *r, pbw_field *f)
{
    if (r->p >= r->end)
        return 0;
    uint64_t tag;
    if (pbw_varint(&r->p, r->end, &tag) < 0)
        return BT_EINVAL;
    f->number = tag >> 3;
    f->wire = (int)(tag & 7);
    f->value = 0;
    f->data = NULL;
    f->len = 0;
    size_t left;
    switch (f->wire) {
    case PBW_VARINT:
        return pbw_varint(&r->p, r->end, &f->value) < 0 ? BT_EINVAL : 1;
    case PBW_FIXED64:
    case PBW_FIXED32:
        left = f->wire == PBW_FIXED64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < left)
            return BT_EINVAL;
        for (size_t i = 0; i < left; i++)
            f->value |= (uint64_t)r->p[i] << (8 * i);
        r->p += left;
        return 1;
    case PBW_BYTES:
        if (pbw_varint(&r->p, r->end, &f->value) < 0 ||
            f->value > (uint64_t)(r->end - r->p))
            return BT_EINVAL;
        f->data = r->p;
        f->len = (size_t)f->value;
        f->value = 0;
        r->p += f->len;
        return 1;
    default:
        /* Groups (3, 4) are not part of proto3; 6 and 7 do not exist. */
        return BT_EINVAL;
    }
}
