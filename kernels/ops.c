#include "kernels/ops.h"

size_t kdtype_bytes(kdtype t, size_t n)
{
    switch (t) {
    case KD_F32:
    case KD_I32: return n * 4;
    case KD_F16:
    case KD_BF16: return n * 2;
    case KD_I64: return n * 8;
    case KD_U8:
    case KD_BOOL: return n;
    case KD_Q8_0: return n / 32 * 34;
    case KD_Q4_0: return n / 32 * 18;
    case KD_Q4_1: return n / 32 * 20;
    }
    return 0;
}

const char *kdtype_name(kdtype t)
{
    switch (t) {
    case KD_F32: return "f32";
    case KD_F16: return "f16";
    case KD_BF16: return "bf16";
    case KD_I32: return "i32";
    case KD_I64: return "i64";
    case KD_U8: return "u8";
    case KD_BOOL: return "bool";
    case KD_Q8_0: return "q8_0";
    case KD_Q4_0: return "q4_0";
    case KD_Q4_1: return "q4_1";
    }
    return "?";
}

krole kop_role(kop op)
{
    switch (op) {
    case KOP_ALLREDUCE: return KROLE_COMM;
    case KOP_MATMUL_ALLREDUCE: return KROLE_HYBRID;
    default: return KROLE_COMPUTE;
    }
}

const char *kop_name(kop op)
{
    static const char *names[KOP_COUNT] = {
        "embed",   "matmul",    "qmatvec",      "add",         "mul",     "silu",   "gelu",
        "rmsnorm", "layernorm", "rope",         "attn_prefill", "attn_decode", "softmax",
        "argmax",  "sample",    "cast",         "allreduce",   "matmul_allreduce", "im2col",
        "attn",
    };
    return op < KOP_COUNT ? names[op] : "?";
}
