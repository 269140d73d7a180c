#!/usr/bin/python3
"""Installs baton's documents for `make install`: README.md, docs/*.md,
config/README.md (the YAML reference) and proto/baton.proto (the protocol
the documents describe) under DEST (PREFIX/share/baton), in the same
folders as in the source tree, so that their relative links keep working.

A link to a file that is not installed (the tests' README, say) would be
dead in the installed copy: it becomes its text followed by the path in
baton's source tree: "[tests](tests/README.md)" becomes "tests
(`tests/README.md` in baton's source tree)", and a link whose text is its
path, "[tests/README.md](tests/README.md)", becomes "`tests/README.md` in
baton's source tree".

    scripts/install-docs.py DEST

Run from the repository's root (the Makefile does)."""
import glob
import os
import re
import sys

FILES = ["README.md", "config/README.md", "proto/baton.proto"] + sorted(glob.glob("docs/*.md"))
# [text](target) where target is relative: no scheme, not only an anchor.
LINK = re.compile(r"\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")


def fix_links(text, src_dir, dest):
    def repl(m):
        label, target = m.group(1), m.group(2)
        path = target.split("#", 1)[0]
        if os.path.exists(os.path.join(dest, src_dir, path)):
            return m.group(0)
        in_tree = os.path.normpath(os.path.join(src_dir, path))
        if label.strip("`") == in_tree or label.strip("`") == path:
            return "`%s` in baton's source tree" % in_tree
        return "%s (`%s` in baton's source tree)" % (label, in_tree)
    return LINK.sub(repl, text)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: install-docs.py DEST")
    dest = sys.argv[1]
    for f in FILES:
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
    # Every file is in place before any link is checked.
    for f in FILES:
        with open(f, "rb") as src, open(os.path.join(dest, f), "wb") as out:
            out.write(src.read())
    for f in FILES:
        if not f.endswith(".md"):
            continue
        out = os.path.join(dest, f)
        with open(out, encoding="utf-8") as fh:
            text = fh.read()
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(fix_links(text, os.path.dirname(f), dest))
    for f in FILES:
        os.chmod(os.path.join(dest, f), 0o644)


if __name__ == "__main__":
    main()
