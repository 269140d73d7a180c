#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/.

Run from anywhere; rewrites every seed this script owns and leaves other
files in the corpus folders alone (the regression inputs of crashes that
were found and fixed, named crash-*).  The frames of fuzz_door and
fuzz_worker are protobuf text encoded by protoc (`protoc --encode`).
"""
import os
import struct
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- fuzz_config: deployment files, valid and not ---------------------------

def strip_comments(text):
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def config_seeds():
    for src in ["config/examples/test-loop.yaml", "config/examples/chat-cpu.yaml",
                "config/examples/tp.yaml", "config/examples/omni.yaml",
                "tests/integration/bad/cycle.yaml", "tests/integration/bad/leaves_loop.yaml",
                "tests/integration/bad/unknown_key.yaml", "tests/integration/bad/openai_loop.yaml"]:
        with open(os.path.join(ROOT, src)) as f:
            put("fuzz_config", os.path.basename(src), strip_comments(f.read()))
    # YAML features the loader must survive: anchors, aliases, flow style.
    put("fuzz_config", "anchors.yaml",
        "version: 1\nworkers:\n  - &w {name: w0, device: cpu}\n"
        "models:\n  - {name: m, backend: echo, worker: w0}\n"
        "graphs:\n  - name: g\n    inputs: [x]\n    body:\n      parallel:\n"
        "        - node: {name: a, model: m, inputs: &in [x], outputs: [{name: x, to: client}]}\n"
        "        - node: {name: b, model: m, inputs: *in, outputs: [{name: x, to: client}]}\n")


# ---- fuzz_gguf and fuzz_tokenizer ----------------------------------------------

def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def kv(key, typ, value, elem=None):
    out = gstr(key) + struct.pack("<I", typ)
    if typ == STR:
        return out + gstr(value)
    if typ == ARR:
        out += struct.pack("<IQ", elem, len(value))
        for v in value:
            out += gstr(v) if elem == STR else struct.pack("<" + FMT[elem], v)
        return out
    return out + struct.pack("<" + FMT[typ], value)


FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
       U64: "Q", I64: "q", F64: "d"}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_kvs(pre="smollm"):
    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [3, 3, 3]
    tokens += [b2u[b] for b in range(256)]
    types += [1] * 256
    merges = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "Ġ w", "o r", "Ġw or"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
        types.append(1)
    tokens.append("<user>")
    types.append(4)
    template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                "{{ message['content'] }}<|im_end|>\n{% endfor %}")
    return [kv("tokenizer.ggml.model", STR, "gpt2"),
            kv("tokenizer.ggml.pre", STR, pre),
            kv("tokenizer.ggml.tokens", ARR, tokens, STR),
            kv("tokenizer.ggml.token_type", ARR, types, I32),
            kv("tokenizer.ggml.merges", ARR, merges, STR),
            kv("tokenizer.ggml.bos_token_id", U32, 1),
            kv("tokenizer.ggml.eos_token_id", U32, 2),
            kv("tokenizer.chat_template", STR, template)]


def gguf(kvs, tensors=(), version=3, alignment=32):
    """TENSORS: (name, ggml type, dims, data bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos = b""
    data = b""
    for name, typ, dims, blob in tensors:
        pad = (-len(data)) % alignment
        data += b"\0" * pad
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(
            struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, len(data))
        data += blob
    out = head + infos
    out += b"\0" * ((-len(out)) % alignment)
    return out + data


def gguf_seeds():
    meta = [kv("general.architecture", STR, "llama"), kv("general.name", STR, "tiny"),
            kv("llama.context_length", U32, 64), kv("llama.rope.freq_base", F32, 10000.0),
            kv("general.file_type", U32, 1), kv("x.i8", I8, -3), kv("x.u16", U16, 7),
            kv("x.i64", I64, -1), kv("x.u64", U64, 1 << 40), kv("x.f64", F64, 0.5),
            kv("x.bool", BOOL, True), kv("x.floats", ARR, [1.0, 2.5], F32)]
    f32 = ("w.f32", 0, [2, 2], struct.pack("<4f", 1, 2, 3, 4))
    f16 = ("w.f16", 1, [4], struct.pack("<4e", 1, 2, 3, 4))
    q8 = ("w.q8_0", 8, [32], struct.pack("<e", 0.5) + bytes(range(32)))
    put("fuzz_gguf", "tokenizer.gguf", gguf(tokenizer_kvs()))
    put("fuzz_gguf", "tokenizer-llama3.gguf", gguf(tokenizer_kvs("llama-bpe")))
    put("fuzz_gguf", "metadata-tensors.gguf", gguf(meta, [f32, f16, q8]))
    put("fuzz_gguf", "v2-aligned64.gguf",
        gguf(meta[:3] + [kv("general.alignment", U32, 64)], [f32, q8], version=2, alignment=64))
    put("fuzz_gguf", "everything.gguf", gguf(meta + tokenizer_kvs(), [f32]))
    put("fuzz_gguf", "truncated.gguf", gguf(meta, [f32])[:60])


# ---- fuzz_ct2: CTranslate2 model files ------------------------------------------

def cstr(s):
    b = s.encode() + b"\0"
    return struct.pack("<H", len(b)) + b


def ct2(variables, aliases=(), version=6):
    """A model.bin: VARIABLES are (name, dims, dtype, bytes); ALIASES
    (alias, name)."""
    out = struct.pack("<I", version) + cstr("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, dims, dtype, data in variables:
        out += cstr(name) + struct.pack("<B", len(dims)) + struct.pack("<%dI" % len(dims), *dims)
        out += struct.pack("<BI", dtype, len(data)) + data
    out += struct.pack("<I", len(aliases))
    for alias, name in aliases:
        out += cstr(alias) + cstr(name)
    return out


def ct2_seeds():
    emb = ("decoder/embeddings/weight", [3, 4], 4, struct.pack("<12e", *range(12)))
    gamma = ("encoder/layer_norm/gamma", [4], 0, struct.pack("<4f", 1, 2, 3, 4))
    heads = ("encoder/num_heads", [], 2, struct.pack("<h", 8))
    act = ("decoder/activation", [], 1, struct.pack("<b", 1))
    conv = ("encoder/conv1/weight", [2, 3, 3], 5, bytes(36))
    ids = ("decoder/alignment_heads", [2, 2], 3, struct.pack("<4i", 3, 1, 4, 2))
    every = [emb, gamma, heads, act, conv, ids]
    put("fuzz_ct2", "whisper-like.bin", ct2(every, [("decoder/projection/weight", emb[0])]))
    put("fuzz_ct2", "empty.bin", ct2([]))
    put("fuzz_ct2", "aliases.bin", ct2([gamma, heads], [("a", gamma[0]), ("b", heads[0])]))
    put("fuzz_ct2", "truncated.bin", ct2(every)[:70])


def tokenizer_seeds():
    texts = {
        "ascii.txt": "Hello, world! The quick brown fox jumps over 13 lazy dogs.",
        "chat.txt": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "unicode.txt": "Caf\u00e9 \u00fcber \u4e2d\u6587 \u0645\u0631\u062d\u0628\u0627 \U0001f600\U0001f44d\u200d",
        "spaces.txt": "  a\n\n\n\tb   c\r\n  12345678  x'll 've 're",
        "code.txt": "int main(void) { return printf(\"%d\\n\", 42); }\n",
    }
    for name, t in texts.items():
        put("fuzz_tokenizer", name, t)
    put("fuzz_tokenizer", "bytes.bin", bytes([0x04, 0xff, 0xc3, 0x28, 0xe2, 0x82, 0x41, 0x80]))


# ---- fuzz_door and fuzz_worker: protobuf frames ------------------------------

def encode(message, text):
    return subprocess.run(["protoc", "-I" + os.path.join(ROOT, "proto"),
                           "--encode=" + message, "baton.proto"],
                          input=text.encode(), capture_output=True, check=True).stdout


# fuzz_door's commands (tests/fuzz/fuzz_door.c): CLIENT n (the frames that
# follow come from client n), DIE n (worker n dies), SILENCE (both workers
# fall silent), SETTLE (the conductor and workers settle now), TICK (every
# deadline and stall timeout passes).
COMMANDS = {"CLIENT": 0xfff0, "DIE": 0xfff8, "SILENCE": 0xfffa, "SETTLE": 0xfffb,
            "TICK": 0xfffe}


def frame_seeds():
    """tests/fuzz/frames.txt: "=== TARGET FILE" starts a seed, "--- MESSAGE"
    one frame of it (protobuf text until the next marker), "--- COMMAND" one
    of fuzz_door's commands (COMMANDS).  Each frame is written as a 16-bit
    little-endian length and its bytes, the framing fuzz_door and
    fuzz_worker read; a command as its length."""
    path = os.path.join(ROOT, "tests", "fuzz", "frames.txt")
    seeds = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("=== "):
                target, name = line[4:].split()
                seeds.append((target, name, []))
            elif line.startswith("--- "):
                seeds[-1][2].append((line[4:].strip(), []))
            elif not line.startswith("#") and seeds and seeds[-1][2]:
                seeds[-1][2][-1][1].append(line)
    for target, name, frames in seeds:
        out = b""
        for message, body in frames:
            word = message.split()
            if word[0] in COMMANDS:
                out += struct.pack("<H", COMMANDS[word[0]] + (int(word[1]) if len(word) > 1 else 0))
                continue
            b = encode(message, "\n".join(body))
            out += struct.pack("<H", len(b)) + b
        put(target, name, out)


def main():
    config_seeds()
    gguf_seeds()
    ct2_seeds()
    tokenizer_seeds()
    frame_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
