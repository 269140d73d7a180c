#!/usr/bin/env python3
"""Generates tests/unit/data/tokenizer-vectors.tsv, the reference ids that
tests/unit/test_tokenizer.c compares backends/transformer/tokenizer.c against.

Every case is encoded by two references, and the file says where they
disagree:

  - Hugging Face `tokenizers` built from the vocabulary and merges stored
    in the GGUF file (so the ids are those of the very file the C code
    reads), with SmolLM2's tokenizer.json configuration: no normalizer,
    pre-tokenizer Sequence[Digits(individual_digits=True),
    ByteLevel(add_prefix_space=False, use_regex=True)], BPE without
    unk_token, byte_fallback or ignore_merges, ByteLevel decoder, and the
    control tokens added as special AddedTokens.  (Checked against
    SmolLM2-135M-Instruct's own tokenizer.json: same configuration, same
    ids.)
  - llama.cpp, through tests/llamacpp/llama_tok (its llama_tokenize on the
    same GGUF, vocabulary only).

Where the two give different ids, the case holds llama.cpp's, and a
comment line just before it says so and gives Hugging Face's: llama.cpp
is the reference baton follows, since it reads the same GGUF files and is
what baton is compared with (tests/llamacpp/).  The one disagreement
known: a byte the vocabulary has no token for (SmolLM2 lacks
21, 0x04 among them) is dropped by Hugging Face before merging, so its
neighbours merge across it ("!\\x04!" is 10095 "!!"), and by llama.cpp
after merging, so it is a barrier (17 17).

Two other pre-tokenizers run over the same vocabulary to check the C
code's GPT-2 and Llama 3 regexes: ByteLevel alone ("gpt2"; llama.cpp calls
it "gpt-2") and Split(Llama 3 regex) + ByteLevel without its regex, with
ignore_merges as Llama 3's tokenizer.json has it ("llama-bpe").  llama.cpp
reads them from copies of the GGUF whose tokenizer.ggml.pre is rewritten
(tests/llamacpp/ggufkv.py).  Chat prompts are rendered from the GGUF's
tokenizer.chat_template with jinja2, as transformers does.

Needs: pip install gguf tokenizers jinja2 (a venv under /tmp will do), and
llama_tok: `bash tests/llamacpp/run.sh build` (or `make llamacpp-check`)
builds it in build/llamacpp/, against llama.cpp from
scripts/build-llamacpp.sh.
Usage: python3 scripts/gen-tokenizer-vectors.py --llama-tok build/llamacpp/llama_tok \\
           [model.gguf] > tests/unit/data/tokenizer-vectors.tsv

Format, tab-separated, one case a line ('#' starts a comment):
  enc  PRE  SPECIAL  HEX(text)  ids separated by spaces  [HEX(decoded)]
  chat HEX(system) or '-'  HEX(user)  HEX(expected prompt)
PRE is the tokenizer.ggml.pre the case is for; SPECIAL is 1 when control
tokens written in the text are parsed (the C parse_special).  The decoded
text is given only where it is not the text: bytes the vocabulary has no
token for are dropped.  A case whose references disagree comes after
  # reference llama.cpp; Hugging Face gives: IDS
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

import jinja2
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "llamacpp"))
import ggufkv  # noqa: E402

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def field_strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_ints(r, key):
    f = r.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def build(tokens, merges, specials, pre):
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                              ignore_merges=(pre == "llama-bpe")))
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre == "llama-bpe":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tk


def cases(chat_prompts):
    c = [
        "", " ", "  ", "\n", "\t", "a", "Hello", "Hello world", " Hello world", "Hello world ",
        "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "I'm sure it's fine, they're here, we've been, you'll see, he'd go.",
        "I'M SURE IT'S FINE, THEY'RE HERE, WE'VE BEEN, YOU'LL SEE, HE'D GO.",
        "'s 't 're 've 'm 'll 'd 'x ''s", "don't", "rock 'n' roll",
        "12345", "3.14", "3.14159265358979", "1,000,000", "-42", "+7", "1e-9", "0x1F",
        "2024-06-01 12:34:56", "version 1.2.3", "a1b2c3", "abc123def", "x 1", "x  1", "1 2 3",
        "100%", "$5.99", "#1", "a 12", "٣", "x٣y", "½²", "Ⅻ century", "①②③", "１２３", "߀",
        "multiple   spaces", "trailing spaces   ", "   leading spaces", "tab\tseparated\tvalues",
        "\t\tindented", "line1\nline2", "line1\n\nline2", "line1\r\nline2", "\n\n\n", "   \n   ",
        " \n \n ", "a \nb", "end\n", "x\x0b\x0cy", "a\u00a0b", "a\u2028b\u2029c", "a\u3000b",
        "\u0085x", "!\x1c!", "a\u200bb", "\ufeffBOM",
        "def foo(x):\n    return x * 2\n",
        "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
        "SELECT * FROM users WHERE id = 7;", "<div class=\"x\">Hi</div>", "{\"key\": [1, 2, 3]}",
        "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Windows\\System32",
        "a+b=c", "x==y!=z", "-->", "...", "?!?!", "(parenthetical)", "[bracket]", "@decorator",
        "café", "naïve résumé", "Straße", "Ærøskøbing", "e\u0301", "foo\u0301bar", "n\u0303o",
        "日本語のテキスト", "中文字符", "한국어", "Привет, мир!", "Ελληνικά", "עברית", "العربية",
        "हिन्दी", "ไทย", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "emoji 😀 in text 🎉!", "∑∫√∞",
        "→ ← ↑ ↓", "™©®", "¡Hola!", "¿Qué?", "«quotes»", "“smart quotes”", "‘single’",
        "em—dash", "en–dash", "…", "°C", "µs", "ﬁ ligature", "Ａｂｃ fullwidth",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>",
        "text<|im_end|>more", "<|im_start|><|im_start|>", "<|im_start", "|im_start|>",
        "< |im_start|>", "<repo_name>foo<file_sep>bar", "<jupyter_code>print(1)",
        "a<|endoftext|>b", " <|im_end|> ", "<|im_end|>\n", "<<|im_end|>>",
        " " * 50, "\n" * 20, "-" * 40, "=" * 33, "a" * 100, "ab" * 50, "1" * 30,
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
        "It was the best of times, it was the worst of times, it was the age of wisdom.",
        "ThisIsCamelCase and snake_case_name and kebab-case-name",
        "HTTPServerError XMLHttpRequest", "O'Reilly's", "'quoted'", "\"double\"",
        "a\x04b", "\x04\x06\x13\x14\x16\x1d", "a\x00b", "\x7f", "bell\x07",
        "!\x04!", "..\x04..", "::\x06::", "a\x04\x06b",
        # A byte without a token inside one pre-token: a merge barrier in
        # llama.cpp, skipped over by Hugging Face (the module's docstring).
        "V\x1b}\x04,Q", "}\x04,", "!!\x04!", "\x04!!\x04", "'\x04s", "  \x04  ",
        "x\U00050000y", "\U00090000\U00090001",
        "mixed 123abc 4.5e6 ok", "£100 €200 ¥300", "x² + y² = z²", "H₂O", "½ cup",
    ]
    c += chat_prompts
    rng = random.Random(20240601)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", "    \n\t", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "éèêëàâäôöûüçñßøåæœ", "日本語中文한국어", "абвгдежзийклмнопрст", "😀🎉👍🏽🚀",
        "\u0301\u0308\u200d", "٣½²Ⅻ", "'s'll're",
    ]
    for i in range(110):
        n = rng.randint(1, 60)
        s = []
        for _ in range(n):
            pool = pools[rng.randrange(len(pools))]
            s.append(pool[rng.randrange(len(pool))] if pool != "'s'll're" else rng.choice(["'s", "'ll", "'re"]))
        if i % 10 == 0:
            s.insert(rng.randrange(len(s) + 1), rng.choice(["<|im_start|>", "<|im_end|>", "<|endoftext|>"]))
        c.append("".join(s))
    c.append(" " * 3000)
    c.append("a" + " " * 3000 + "b")
    c.append(("The quick brown fox jumps over the lazy dog 1234 times; "
              "naïve café owners say 'it's fine'.\n") * 120)
    return c


def byte_decoder():
    """GPT-2's byte alphabet backwards: the character that spells each byte
    in token text -> the byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
          list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def decode_bytes(tokens, types, ids, dec):
    """The bytes IDS stand for, as the C tok_piece gives them: control and
    user-defined tokens as their text, the others through the byte
    alphabet.  (tokenizers' decode would turn a piece that ends inside a
    UTF-8 character into U+FFFD.)"""
    out = bytearray()
    for i in ids:
        if types[i] in (3, 4):
            out += tokens[i].encode()
        else:
            out += bytes(dec[ch] for ch in tokens[i])
    return bytes(out)


# The name llama.cpp knows each pre-tokenizer by (it has no "gpt2").
LLAMACPP_PRE = {"smollm": "smollm", "gpt2": "gpt-2", "llama-bpe": "llama-bpe"}


def llamacpp_ids(llama_tok, path, pre, special, texts, work):
    """llama.cpp's ids of every text, for the GGUF at PATH read with
    pre-tokenizer PRE."""
    model = os.path.join(work, "vocab-%s.gguf" % pre)
    ggufkv.copy_with_string(path, model, "tokenizer.ggml.pre", LLAMACPP_PRE[pre])
    hexfile = os.path.join(work, "texts.hex")
    with open(hexfile, "w") as f:
        for t in texts:
            f.write(t.encode().hex() + "\n")
    with open(hexfile, "rb") as fin:
        out = subprocess.run([llama_tok, model] + (["--special"] if special else []), stdin=fin,
                             stdout=subprocess.PIPE, check=True).stdout.decode()
    lines = out.split("\n")[:-1]
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [[int(x) for x in ln.split()] for ln in lines]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tok", required=True,
                    help="tests/llamacpp/llama_tok as built by `make llamacpp-check`")
    ap.add_argument("model", nargs="?", default="models/smollm2-135m-instruct-q4_1.gguf")
    a = ap.parse_args()
    path = a.model
    work = tempfile.mkdtemp(prefix="gen-tokenizer-vectors-")
    r = GGUFReader(path)
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    merges = field_strings(r, "tokenizer.ggml.merges")
    types = field_ints(r, "tokenizer.ggml.token_type")
    template = field_strings(r, "tokenizer.chat_template")[0]
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(template)
    chats = [(None, "Hello!"), ("You are terse.", "What is 2+2?"), (None, ""),
             ("", "x"), (None, "multi\nline\n\nuser text with 'quotes' and {braces}"),
             ("Sys é 😀", "用户 text")]
    rendered = []
    out = sys.stdout
    out.write("# Generated by scripts/gen-tokenizer-vectors.py from %s\n" % path)
    out.write("# tokenizers %s, jinja2 %s; llama.cpp through tests/llamacpp/llama_tok\n"
              % (__import__("tokenizers").__version__, jinja2.__version__))
    for system, user in chats:
        msgs = ([{"role": "system", "content": system}] if system is not None else [])
        msgs.append({"role": "user", "content": user})
        text = tmpl.render(messages=msgs, add_generation_prompt=True)
        rendered.append(text)
        out.write("chat\t%s\t%s\t%s\n" % ("-" if system is None else system.encode().hex(),
                                         user.encode().hex(), text.encode().hex()))
    texts = cases(rendered)
    n = ndiff = 0
    dec = byte_decoder()
    for pre in ("smollm", "gpt2", "llama-bpe"):
        tk = build(tokens, merges, specials, pre)
        for special in (1, 0):
            if pre != "smollm" and special == 0:
                continue
            tk.encode_special_tokens = not special
            mine = [t for t in texts if special or any(s in t for s in specials)]
            theirs = llamacpp_ids(a.llama_tok, path, pre, special, mine, work)
            for t, ids in zip(mine, theirs):
                hf = tk.encode(t, add_special_tokens=False).ids
                if hf != ids:
                    out.write("# reference llama.cpp; Hugging Face gives: %s\n"
                              % " ".join(map(str, hf)))
                    ndiff += 1
                back = decode_bytes(tokens, types, ids, dec)
                out.write("enc\t%s\t%d\t%s\t%s" % (pre, special, t.encode().hex(),
                                                   " ".join(map(str, ids))))
                # Bytes without a token are dropped; the decoded text then
                # differs from the input and is given.
                out.write("\t%s\n" % back.hex() if back != t.encode() else "\n")
                n += 1
    print("%d encode cases (%d where llama.cpp and Hugging Face differ), %d chat cases"
          % (n, ndiff, len(chats)), file=sys.stderr)


if __name__ == "__main__":
    main()
