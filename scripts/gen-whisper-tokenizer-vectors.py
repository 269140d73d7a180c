#!/usr/bin/env python3
"""
gen-whisper-tokenizer-vectors.py -- writes tests/unit/data/whisper-decode-vectors.tsv,
id sequences and the text that faster-whisper's Tokenizer.decode gives for
them, which tests/unit/test_whisper_tok.c compares backends/whisper/wtok.c
against.

INDEPENDENCE: the text comes from Hugging Face's `tokenizers` (the library
faster-whisper decodes with) over Whisper base's own tokenizer.json, and
follows faster-whisper's Tokenizer.decode: the ids below <|endoftext|>
only, then tokenizer.decode.  No code of baton is used.

How to run (from the repository root, after scripts/fetch-model.sh
whisper-base):

    /usr/bin/python3 -m venv /tmp/tokvenv
    /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python scripts/gen-whisper-tokenizer-vectors.py

Versions used for the checked-in file: Python 3.11.2, tokenizers 0.23.3.

Each line: a name, a TAB, the ids separated by spaces, a TAB, the text's
UTF-8 bytes in hex (so that any byte survives the file).
"""
import random
import sys

from tokenizers import Tokenizer

TOKENIZER = "models/whisper-base/tokenizer.json"
OUT = "tests/unit/data/whisper-decode-vectors.tsv"

TEXTS = [
    ("english", " And so my fellow Americans, ask not what your country can do for you."),
    ("numbers", " It cost $1,234.56 on 2024-03-07, at 9:30 a.m. (about 15%)."),
    ("german", " Über den Wolken muss die Freiheit wohl grenzenlos sein."),
    ("french", " Où est la bibliothèque ? C'était là, près de l'église."),
    ("japanese", "東京は日本の首都です。今日はいい天気ですね。"),
    ("chinese", "我们今天去公园散步吧。"),
    ("russian", " Привет, как дела? Всё хорошо."),
    ("emoji", " Thanks! 🎉👍🏽 See you soon 😀"),
    ("spaces", "  two  spaces\tand a tab\nand a newline  "),
    ("punctuation", " «quotes», “curly”, — dashes – and … ellipses"),
]


def main():
    tok = Tokenizer.from_file(TOKENIZER)
    eot = tok.token_to_id("<|endoftext|>")
    sot = tok.token_to_id("<|startoftranscript|>")
    en = tok.token_to_id("<|en|>")
    transcribe = tok.token_to_id("<|transcribe|>")
    notimestamps = tok.token_to_id("<|notimestamps|>")

    def decode(ids):  # faster-whisper's Tokenizer.decode
        return tok.decode([t for t in ids if t < eot])

    cases = []
    for name, text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert decode(ids) == text, (name, decode(ids))
        cases.append((name, ids))
    # A decoder's whole output: the prompt's special tokens, timestamps
    # (ids past <|notimestamps|>, not in tokenizer.json), then <|endoftext|>.
    ids = tok.encode(" Hello there.", add_special_tokens=False).ids
    cases.append(("with-specials", [sot, en, transcribe, notimestamps + 1] + ids +
                  [notimestamps + 51, eot]))
    cases.append(("no-timestamps", [sot, en, transcribe, notimestamps] + ids + [eot]))
    # Every other token of multibyte text: characters cut, replaced.
    for name in ("japanese", "emoji", "german"):
        full = dict(cases)[name]
        cases.append((name + "-cut", full[::2]))
        cases.append((name + "-tail-cut", full[:-1]))
    # Random byte-level tokens, among them lone continuation and lead bytes.
    rng = random.Random(20261127)
    byte_tokens = []
    for i in range(eot):
        piece = tok.id_to_token(i)
        if len(piece) == 1:
            byte_tokens.append(i)
    for k in range(12):
        cases.append(("random-%d" % k, [rng.choice(byte_tokens if rng.random() < 0.6
                                                   else range(eot))
                                        for _ in range(rng.randint(1, 24))]))
    cases.append(("empty", []))
    cases.append(("only-specials", [sot, en, transcribe, notimestamps, eot]))
    with open(OUT, "w") as f:
        for name, ids in cases:
            f.write("%s\t%s\t%s\n" % (name, " ".join(map(str, ids)),
                                      decode(ids).encode("utf-8").hex()))
    print("wrote %s (%d cases)" % (OUT, len(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
