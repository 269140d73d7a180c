#!/usr/bin/env python3
"""baton's tokenizer against llama.cpp's on 30,000 valid UTF-8 texts.

Half the texts are slices of real files (this repository, /usr/share/doc
including its gzipped changelogs, /usr/share/common-licenses, Python's
standard library), cut at random character offsets with lengths from one
character to a few thousand.  The other half are made to be hard: runs of
many scripts (CJK, kana, Hangul, Arabic, Hebrew, Devanagari, Bengali,
Tamil, Thai, Cyrillic, Greek, Georgian, Ethiopic), emoji with skin tones,
ZWJ sequences, flags and keycaps, digit runs in several numeral systems,
whitespace runs (Unicode spaces, tabs, CR LF, vertical tabs), contractions
('s 't 're 've 'm 'll 'd in every letter case), punctuation runs, control
characters (among them the six that SmolLM2 has no token for), special
token spellings as plain text, combining marks, and code points drawn from
the whole Unicode range (unassigned ones and planes 4-11 included, whose
lead byte 0xF1/0xF2 has no token either).

Each text is encoded by llama.cpp (llama_tok, linking libllama; vocabulary
only) and by baton (baton_tok, backends/transformer/tokenizer.c), both
without BOS and with control tokens left as text, and the id lists are
compared.  Every mismatch is printed: the text escaped and both id lists.

The texts are the same on every run of one machine (a fixed seed, files
sorted by path); other machines have other files under /usr/share/doc.

Besides SmolLM2's own pre-tokenizer ("smollm"), the same texts go through
the GPT-2 and Llama 3 ones baton also supports, on a copy of the vocabulary
whose tokenizer.ggml.pre says "gpt-2" or "llama-bpe" (--pre chooses).

Usage (tests/llamacpp/run.sh calls it):
  tokenizer_check.py --llama-tok BIN --baton-tok BIN --model GGUF
                     [--count 30000] [--pre smollm,gpt-2,llama-bpe] [--work DIR]
Exit status: 0 when every text matches, 1 otherwise.
"""
import argparse
import gzip
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ggufkv  # noqa: E402

SEED = 20250601
MAX_SHOWN = 25  # mismatches printed in full; the count covers all of them

# ---- real files ----------------------------------------------------------------


def _text_files(root, exts=None, limit=4000):
    """Up to LIMIT files under ROOT (sorted, so the choice is stable)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in (".git", "build", "models", "__pycache__"))
        for f in sorted(files):
            if exts is None or f.endswith(exts):
                out.append(os.path.join(d, f))
                if len(out) >= limit:
                    return out
    return out


def _read_text(path):
    """The file as str, or None when it is not UTF-8 text (or is empty)."""
    try:
        with open(path, "rb") as fp:
            data = fp.read(400_000)
        if path.endswith(".gz"):
            data = gzip.decompress(data)[:400_000]
        s = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, ValueError):
        return None
    return s if s.strip() else None


def real_corpus(repo):
    """(path, text) of the real files the slices come from."""
    paths = []
    paths += _text_files(repo, (".c", ".h", ".py", ".sh", ".md", ".yaml", ".proto", ".txt",
                                ".cu", ".cc", "Makefile", ".map", ".service"))
    paths += _text_files("/usr/share/common-licenses")
    paths += _text_files("/usr/share/doc", limit=3000)
    stdlib = sysconfig.get_paths().get("stdlib")
    if stdlib:
        paths += _text_files(stdlib, (".py",), limit=1500)
    corpus = []
    for p in paths:
        s = _read_text(p)
        if s:
            corpus.append((p, s))
    return corpus


def slices(rng, corpus, n):
    out = []
    for _ in range(n):
        _, s = corpus[rng.randrange(len(corpus))]
        # Lengths spread from one character to 3,000 (log-uniform), so
        # short texts (single words, lone spaces) are as common as pages.
        ln = int(round(2 ** rng.uniform(0, 11.55)))
        start = rng.randrange(max(1, len(s) - ln + 1))
        out.append(s[start:start + ln])
    return out

# ---- hard cases ----------------------------------------------------------------


def _chars(lo, hi):
    return [chr(c) for c in range(lo, hi + 1) if not 0xD800 <= c <= 0xDFFF]


SCRIPTS = {
    "cjk": _chars(0x4E00, 0x9FFF), "hiragana": _chars(0x3041, 0x3096),
    "katakana": _chars(0x30A1, 0x30FA), "cjk_punct": _chars(0x3000, 0x303F),
    "hangul": _chars(0xAC00, 0xD7A3), "arabic": _chars(0x0600, 0x06FF),
    "hebrew": _chars(0x0590, 0x05FF), "devanagari": _chars(0x0900, 0x097F),
    "bengali": _chars(0x0980, 0x09FF), "tamil": _chars(0x0B80, 0x0BFF),
    "thai": _chars(0x0E00, 0x0E7F), "cyrillic": _chars(0x0400, 0x052F),
    "greek": _chars(0x0370, 0x03FF), "georgian": _chars(0x10A0, 0x10FF),
    "ethiopic": _chars(0x1200, 0x137F), "latin_ext": _chars(0x00C0, 0x024F),
    "combining": _chars(0x0300, 0x036F), "ascii_letters": list(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
}
WORDS = ("the of and to in is was for that with as on by it he she they we you are be "
         "hello world token model baton llama naïve café résumé Straße Ærøskøbing über "
         "Привет мир Ελληνικά 日本語 中文 한국어 العربية हिन्दी ไทย").split()
EMOJI_BASE = [chr(c) for c in list(range(0x1F300, 0x1F64F)) + list(range(0x1F680, 0x1F6FF)) +
              list(range(0x1F900, 0x1F9FF)) + list(range(0x1FA70, 0x1FAFF))] + list("☀☺♥✂✈❤")
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
ZWJ_SEQS = ["👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🏳\ufe0f\u200d🌈", "👩🏽\u200d🚀",
            "🧑\u200d🤝\u200d🧑", "❤\ufe0f\u200d🔥", "🐕\u200d🦺", "👁\ufe0f\u200d🗨\ufe0f"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯",
          "０１２３４５６７８９", "⁰¹²³⁴⁵⁶⁷⁸⁹", "₀₁₂₃₄₅₆₇₈₉", "½⅓¼⅕⅙⅛", "ⅠⅡⅢⅣⅤⅫⅬⅭ",
          "①②③④⑤⑳", "๐๑๒๓๔๕๖๗๘๙", "𝟎𝟏𝟐𝟑𝟒", "𝋀𝋁𝋂𝋃𝋄"]
SPACES = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\u00a0", "\u3000",
          "\u2028", "\u2029", "\u0085", "\u2003", "\u1680", "\u202f", "\u200b", "\u180e",
          "\ufeff"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'x", "''s", "’s", "'"]
PUNCT = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + list("—–…«»“”‘’¿¡、。，・《》【】†‡•§¶")
CONTROL = [chr(c) for c in list(range(0x00, 0x20)) + [0x7F]]
NO_TOKEN = ["\x04", "\x06", "\x13", "\x14", "\x16", "\x1d"]  # SmolLM2 lacks these bytes
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<jupyter_code>",
           "<|im_start", "|>"]


def _random_cp(rng):
    """Any code point but a surrogate; a third of them from the BMP."""
    while True:
        c = rng.randrange(0x10000) if rng.random() < 0.34 else rng.randrange(0x110000)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def _case(rng, s):
    return "".join(ch.upper() if rng.random() < 0.5 else ch.lower() for ch in s)


def _piece(rng):
    """One fragment of a hard text."""
    k = rng.randrange(15)
    if k == 0:
        pool = SCRIPTS[rng.choice(sorted(SCRIPTS))]
        return "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
    if k == 1:
        return rng.choice(WORDS)
    if k == 2:
        e = rng.choice(EMOJI_BASE)
        r = rng.random()
        if r < 0.3:
            e += rng.choice(SKIN)
        elif r < 0.5:
            e = rng.choice(ZWJ_SEQS)
        elif r < 0.6:
            e = chr(0x1F1E6 + rng.randrange(26)) + chr(0x1F1E6 + rng.randrange(26))  # a flag
        elif r < 0.7:
            e = rng.choice("0123456789#*") + "\ufe0f\u20e3"  # a keycap
        elif r < 0.8:
            e += rng.choice("\ufe0e\ufe0f")
        return e
    if k == 3:
        d = rng.choice(DIGITS)
        s = "".join(rng.choice(d) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.3:
            s = rng.choice(["", "-", "+", "$", "#"]) + s + rng.choice([".5", ",000", "e-9", "%", ""])
        return s
    if k == 4:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 30)))
    if k == 5:
        w = rng.choice(["I", "you", "we", "they", "it", "don", "can", "he", "O", ""])
        return w + _case(rng, rng.choice(CONTRACTIONS))
    if k == 6:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 15)))
    if k == 7:
        return "".join(rng.choice(CONTROL) for _ in range(rng.randint(1, 4)))
    if k == 8:
        return rng.choice(NO_TOKEN)
    if k == 9:
        return rng.choice(SPECIAL)
    if k == 10:
        return "".join(_random_cp(rng) for _ in range(rng.randint(1, 6)))
    if k == 11:
        return " " * rng.randint(1, 3) + rng.choice(WORDS)
    if k == 12:
        return rng.choice(WORDS) + rng.choice(SCRIPTS["combining"])
    if k == 13:
        return "\n" * rng.randint(1, 5) + " " * rng.randint(0, 8)
    return rng.choice(["a", "A", "x", "1", " ", "'", ".", "é"]) * rng.randint(1, 200)


def hard_cases(rng, n):
    out = []
    for i in range(n):
        if i % 10 == 0:
            # Bytes without a token between two things that would merge:
            # the case llama.cpp and Hugging Face disagree on.
            a, b = rng.choice(["!", ".", ":", "}", "a", "the", " ", "\n", "1", "é"]), \
                rng.choice([",", "!", ".", ":", "b", "s", " ", "x", "2"])
            out.append(a + "".join(rng.choice(NO_TOKEN) for _ in range(rng.randint(1, 3))) + b)
        else:
            out.append("".join(_piece(rng) for _ in range(rng.randint(1, 40))))
    return out

# ---- comparison ----------------------------------------------------------------


def run_tool(binary, model, hexfile):
    t0 = time.monotonic()
    with open(hexfile, "rb") as fin:
        p = subprocess.run([binary, model], stdin=fin, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, check=False)
    if p.returncode != 0:
        sys.exit("%s failed (%d): %s" % (binary, p.returncode, p.stderr.decode(errors="replace")))
    return p.stdout.decode().split("\n")[:-1], time.monotonic() - t0


def escape(s):
    """S with everything outside printable ASCII escaped, quoted."""
    out = []
    for ch in s:
        c = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif 0x20 <= c < 0x7F:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x100:
            out.append("\\x%02x" % c)
        elif c < 0x10000:
            out.append("\\u%04x" % c)
        else:
            out.append("\\U%08x" % c)
    return '"' + "".join(out) + '"'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-tok", required=True)
    ap.add_argument("--baton-tok", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=30000)
    ap.add_argument("--pre", default="smollm,gpt-2,llama-bpe")
    ap.add_argument("--work", default=None, help="folder for the text and id files")
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    a = ap.parse_args()

    rng = random.Random(SEED)
    corpus = real_corpus(a.repo)
    n_real = a.count // 2
    texts = slices(rng, corpus, n_real) + hard_cases(rng, a.count - n_real)
    total_bytes = sum(len(t.encode()) for t in texts)
    print("tokenizer: %d texts (%d slices of %d real files, %d hard cases), %.1f MB"
          % (len(texts), n_real, len(corpus), len(texts) - n_real, total_bytes / 1e6))

    work = a.work or tempfile.mkdtemp(prefix="baton-tokcheck-")
    os.makedirs(work, exist_ok=True)
    hexfile = os.path.join(work, "texts.hex")
    with open(hexfile, "w") as f:
        for t in texts:
            f.write(t.encode().hex() + "\n")

    failed = False
    for pre in a.pre.split(","):
        model = a.model
        if pre != "smollm":
            model = os.path.join(work, "vocab-%s.gguf" % pre)
            ggufkv.copy_with_string(a.model, model, "tokenizer.ggml.pre", pre)
        want, t_llama = run_tool(a.llama_tok, model, hexfile)
        got, t_baton = run_tool(a.baton_tok, model, hexfile)
        if len(want) != len(texts) or len(got) != len(texts):
            sys.exit("%s: %d texts, llama.cpp gave %d lines and baton %d"
                     % (pre, len(texts), len(want), len(got)))
        bad = [i for i in range(len(texts)) if want[i] != got[i]]
        for i in bad[:MAX_SHOWN]:
            w, g = want[i].split(), got[i].split()
            k = next((j for j in range(min(len(w), len(g))) if w[j] != g[j]), min(len(w), len(g)))
            print("MISMATCH %s text %d (%s), first difference at id %d:\n  text     %s\n"
                  "  llama.cpp %s\n  baton     %s"
                  % (pre, i, "slice" if i < n_real else "hard", k, escape(texts[i]),
                     " ".join(w), " ".join(g)))
        if len(bad) > MAX_SHOWN:
            print("... and %d more mismatches" % (len(bad) - MAX_SHOWN))
        print("tokenizer %s: %d/%d texts match (llama.cpp %.1f s, baton %.1f s)"
              % (pre, len(texts) - len(bad), len(texts), t_llama, t_baton))
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
