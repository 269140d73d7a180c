#!/usr/bin/env python3
"""Rewrites a .cu file into C++ for the CUDA emulator (cudaemu).

The emulated build compiles each kernels/cuda/*.cu with the host C++
compiler against cudaemu/include/.  Two CUDA constructs are not C++ and are
rewritten here; everything else (kernel bodies, host code, templates) is
left exactly as written, and line numbers are kept, with a #line directive
naming the original file, so compiler errors and the emulator's reports
point at the real source:

  kernel<<<grid, block[, smem[, stream]]>>>(args...);
      -> cudaemu::launch("kernel", __FILE__, __LINE__, kernel,
                         cudaemu::launch_cfg(grid, block, ...), args...);
         (NULL among the arguments becomes nullptr)
  extern __shared__ T name[];
      -> T *name = (T *)cudaemu::dyn_smem();
  __shared__ T name[A][B];      (or a scalar: __shared__ T name;)
      -> a reference to per-block storage from cudaemu::static_smem, keyed
         by a static local, so every thread of a block sees one copy.

usage: rewrite.py IN.cu OUT.cc [NAME]   (NAME: the path in #line, default IN)
Exit status 1 with a message naming the line on anything it cannot parse.
"""
import re
import sys


def fail(src, pos, msg):
    line = src.count('\n', 0, pos) + 1
    sys.exit('rewrite.py: %s:%d: %s' % (NAME, line, msg))


def code_mask(src):
    """For each character, whether it is code (not a comment, string or
    character literal)."""
    mask = [True] * len(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == '\\' else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            mask[k] = False
        i = j
    return mask


def find_code(src, mask, needle, start):
    i = src.find(needle, start)
    while i >= 0 and not mask[i]:
        i = src.find(needle, i + 1)
    return i


def close_of(src, mask, i, open_c, close_c):
    """Index just past the bracket matching the one at I."""
    depth = 0
    for k in range(i, len(src)):
        if not mask[k]:
            continue
        if src[k] == open_c:
            depth += 1
        elif src[k] == close_c:
            depth -= 1
            if depth == 0:
                return k + 1
    fail(src, i, 'unbalanced %s' % open_c)


def kernel_start(src, i):
    """Start of the kernel expression that ends before index I (an
    identifier, possibly qualified, possibly with template arguments)."""
    j = i
    while j > 0 and src[j - 1].isspace():
        j -= 1
    if src[j - 1] == '>':
        depth, k = 0, j - 1
        while k >= 0:
            if src[k] == '>':
                depth += 1
            elif src[k] == '<':
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        j = k
    while j > 0 and (src[j - 1].isalnum() or src[j - 1] in '_:'):
        j -= 1
    return j


def rewrite_launches(src):
    mask = code_mask(src)
    out, pos = [], 0
    while True:
        i = find_code(src, mask, '<<<', pos)
        if i < 0:
            out.append(src[pos:])
            return ''.join(out)
        ks = kernel_start(src, i)
        kernel = src[ks:i].strip()
        if not kernel:
            fail(src, i, 'a launch without a kernel name')
        ce = find_code(src, mask, '>>>', i)
        if ce < 0:
            fail(src, i, '<<< without >>>')
        config = src[i + 3:ce]
        k = ce + 3
        while k < len(src) and src[k].isspace():
            k += 1
        if k >= len(src) or src[k] != '(':
            fail(src, k, 'a launch without its argument list')
        ae = close_of(src, mask, k, '(', ')')
        # NULL is an integer constant in C++ (g++'s __null): once forwarded
        # through the launch template it is a long, which no pointer
        # parameter takes.  nullptr keeps its meaning.
        args = re.sub(r'\bNULL\b', 'nullptr', src[k + 1:ae - 1])
        dropped = src[ks:i].count('\n') + src[ce + 3:k].count('\n')
        out.append(src[pos:ks])
        out.append('cudaemu::launch("%s", __FILE__, __LINE__, %s, cudaemu::launch_cfg(%s)%s)'
                   % (re.sub(r'\s+', '', kernel), kernel, config,
                      ', ' + args if args.strip() else ''))
        out.append('\n' * dropped)
        pos = ae


EXTERN = re.compile(r'extern\s+__shared__\s+(?P<type>[\w:\s\*]+?)\s*(?P<name>\w+)\s*\[\s*\]\s*;')
STATIC = re.compile(r'__shared__\s+(?P<type>[\w:<>\s]+?)\s+(?P<name>\w+)\s*'
                    r'(?P<dims>(?:\[[^\];]+\])*)\s*;')


def rewrite_shared(src):
    mask = code_mask(src)
    out, pos = [], 0
    while True:
        i = find_code(src, mask, '__shared__', pos)
        if i < 0:
            out.append(src[pos:])
            return ''.join(out)
        start = i
        m = None
        if src[max(0, i - 7):i].rstrip().endswith('extern') or \
                re.search(r'extern\s+$', src[max(0, i - 16):i]):
            start = src.rfind('extern', 0, i)
            m = EXTERN.match(src, start)
            if m:
                t, n = m['type'].strip(), m['name']
                rep = '%s *%s = (%s *)cudaemu::dyn_smem();' % (t, n, t)
        else:
            m = STATIC.match(src, i)
            if m:
                t, n, dims = m['type'].strip(), m['name'], m['dims'].strip()
                key = 'cudaemu_smem_key_' + n
                if dims:
                    rep = ('static const char %s = 0; %s (&%s)%s = *(%s (*)%s)cudaemu::static_smem('
                           '&%s, sizeof(%s%s), alignof(%s), "%s");'
                           % (key, t, n, dims, t, dims, key, t, dims, t, n))
                else:
                    rep = ('static const char %s = 0; %s &%s = *(%s *)cudaemu::static_smem('
                           '&%s, sizeof(%s), alignof(%s), "%s");' % (key, t, n, t, key, t, t, n))
        if not m:
            fail(src, i, 'a __shared__ declaration this rewriter does not understand '
                 '(one declarator per line: "__shared__ T name[N];")')
        out.append(src[pos:start])
        out.append(rep + '\n' * src[start:m.end()].count('\n'))
        pos = m.end()


def main():
    global NAME
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    inp, outp = sys.argv[1], sys.argv[2]
    NAME = sys.argv[3] if len(sys.argv) == 4 else inp
    src = open(inp).read()
    res = rewrite_shared(rewrite_launches(src))
    if res.count('\n') != src.count('\n'):
        sys.exit('rewrite.py: %s: the line count changed (a bug in rewrite.py)' % NAME)
    with open(outp, 'w') as f:
        f.write('#line 1 "%s"\n' % NAME)
        f.write(res)


NAME = ''
if __name__ == '__main__':
    main()
