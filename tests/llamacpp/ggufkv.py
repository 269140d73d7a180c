"""A GGUF copy with one metadata string changed, for the tokenizer checks.

tests/llamacpp/tokenizer_check.py and scripts/gen-tokenizer-vectors.py
run baton and llama.cpp on SmolLM2's vocabulary under the other
pre-tokenizers baton supports (GPT-2, Llama 3), which takes a file whose
tokenizer.ggml.pre says so.  The copy keeps every key-value pair (with the
one string replaced) and no tensor: both tokenizers read only metadata
(llama.cpp with vocab_only), so a 4 MB file stands in for the model.

Standard library only, so the checks need nothing installed.
"""
import struct

# GGUF value types (ggml's gguf.h): their fixed sizes, strings and arrays aside.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _skip_value(buf, pos, vtype):
    """The position just past a value of VTYPE that starts at POS."""
    if vtype in _FIXED:
        return pos + _FIXED[vtype]
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _FIXED:
            return pos + count * _FIXED[etype]
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError("GGUF value type %d unknown" % vtype)


def copy_with_string(src, dst, key, value):
    """Writes DST: the metadata of GGUF file SRC with string KEY set to
    VALUE (added when absent), and no tensors."""
    with open(src, "rb") as f:
        buf = f.read()
    magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError("%s: not a GGUF v2+ file" % src)
    pos = 24
    kvs = []  # raw bytes of each pair, in order
    found = False
    new_pair = (struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", _STRING) +
                struct.pack("<Q", len(value.encode())) + value.encode())
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        name = buf[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
        if name == key:
            kvs.append(new_pair)
            found = True
        else:
            kvs.append(buf[start:pos])
    if not found:
        kvs.append(new_pair)
    with open(dst, "wb") as f:
        f.write(struct.pack("<4sIQQ", b"GGUF", version, 0, len(kvs)))
        for kv in kvs:
            f.write(kv)
