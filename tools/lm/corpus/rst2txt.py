#!/usr/bin/python3
"""Rough reStructuredText / asciidoc-ish source -> prose text.
usage: rst2txt.py FILE...  (or '-' and a list of files on stdin); .gz files are decompressed.
Drops: literal blocks (indented text after a line ending in '::'), code/directive bodies
(.. code-block::, .. highlight, .. literalinclude, .. toctree, .. kernel-doc, .. c:function ...),
comments, grid/simple tables, heading underlines, SPDX lines, substitutions.
Keeps: paragraphs (re-flowed to one line each), list items, notes/warnings bodies.
Prints kept/dropped byte counts to stderr."""
import sys, re, gzip

KEEP_DIRECTIVES = {'note', 'warning', 'tip', 'important', 'caution', 'attention', 'hint',
                   'danger', 'error', 'admonition', 'seealso', 'versionadded', 'versionchanged',
                   'deprecated', 'topic', 'sidebar', 'rubric', 'epigraph', 'glossary',
                   'function', 'method', 'class', 'attribute', 'data', 'exception', 'module',
                   'describe', 'option', 'envvar', 'index'}
ROLE = re.compile(r':[\w:+.-]+:`([^`<]*?)(?:\s*<[^>]*>)?`')
LINKREF = re.compile(r'`([^`<]+?)\s*<[^>]+>`_{1,2}')


def inline(s):
    s = ROLE.sub(r'\1', s)
    s = LINKREF.sub(r'\1', s)
    s = re.sub(r'``([^`]+)``', r'\1', s)
    s = re.sub(r'`([^`]+)`_{0,2}', r'\1', s)
    s = re.sub(r'(?<!\w)\*\*([^*]+)\*\*', r'\1', s)
    s = re.sub(r'(?<![\w*])\*([^*\s][^*]*)\*', r'\1', s)
    s = re.sub(r'\|([\w -]+)\|', r'\1', s)
    s = re.sub(r'\[#?\w*\]_', '', s)
    return s


def indent(l):
    return len(l) - len(l.lstrip(' '))


def convert(text):
    lines = text.expandtabs(8).split('\n')
    out, para = [], []
    dropped = 0
    skip_indent = None   # when set, drop lines indented more than this (or blank)
    def flush():
        if para:
            s = ' '.join(x.strip() for x in para)
            s = inline(re.sub(r'\s+', ' ', s)).strip()
            if s:
                out.append(s)
            para.clear()
    i = 0
    while i < len(lines):
        l = lines[i].rstrip()
        i += 1
        if skip_indent is not None:
            if not l.strip() or indent(l) > skip_indent:
                dropped += len(l) + 1
                continue
            skip_indent = None
        st = l.strip()
        if not st:
            flush()
            continue
        # heading underline / overline / transitions
        if re.fullmatch(r'([=\-~^"\'`#*+:.,_])\1{2,}', st):
            continue
        # tables
        if re.match(r'^[+|]', st) and (st.endswith('+') or st.endswith('|')):
            dropped += len(l) + 1
            flush()
            continue
        if re.fullmatch(r'[= ]{3,}', st) or re.fullmatch(r'[- ]{3,}', st):
            dropped += len(l) + 1
            continue
        if st.startswith('SPDX-License-Identifier') or st.startswith('.. SPDX'):
            continue
        m = re.match(r'\.\.\s+([\w:-]+)::\s*(.*)', st)
        if m:
            flush()
            name = m.group(1).split(':')[-1]
            if name in KEEP_DIRECTIVES:
                if m.group(2) and name not in ('index', 'module'):
                    para.append(m.group(2))
                    if name in ('function', 'method', 'class', 'attribute', 'data', 'exception',
                                'describe', 'option', 'envvar'):
                        flush()
                        # drop directive options (:noindex: etc.) but keep body
                while i < len(lines) and re.match(r'\s+:[\w-]+:', lines[i]):
                    i += 1
                continue
            skip_indent = indent(l)
            dropped += len(l) + 1
            continue
        if st.startswith('..'):           # comment, target, substitution def, footnote
            flush()
            skip_indent = indent(l)
            continue
        if st.startswith('>>>') or st.startswith('$ ') or st.startswith('# '):
            dropped += len(l) + 1
            continue
        # start of a literal block
        if st.endswith('::'):
            t = st[:-2].rstrip()
            if t:
                para.append(t + (':' if not st.endswith(' ::') else ''))
            flush()
            skip_indent = indent(l)
            continue
        # list item bullets / enumerators start a new paragraph
        if re.match(r'([-*+•]|\d+[.)]|#\.|\(?[a-z][.)])\s', st):
            flush()
        # indented block that is not a list continuation and follows a blank line: keep
        para.append(st)
    flush()
    return '\n'.join(out) + '\n', dropped


def main():
    files = [a for a in sys.argv[1:]]
    if files == ['-']:
        files = [l.rstrip('\n') for l in sys.stdin if l.strip()]
    kept = dropped = 0
    for f in files:
        op = gzip.open if f.endswith('.gz') else open
        with op(f, 'rb') as fh:
            t = fh.read().decode('utf-8', 'replace')
        s, d = convert(t)
        kept += len(s.encode())
        dropped += d
        sys.stdout.write(s)
        sys.stdout.write('\n')
    print(f'rst2txt: {len(files)} files, kept {kept/1e6:.2f} MB, dropped {dropped/1e6:.2f} MB',
          file=sys.stderr)


if __name__ == '__main__':
    main()
