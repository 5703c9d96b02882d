#!/usr/bin/python3
"""Rough POD -> prose; drops verbatim (indented) paragraphs. usage: pod2txt.py FILE..."""
import sys, re, gzip
E = {'gt': '>', 'lt': '<', 'verbar': '|', 'sol': '/', 'quot': '"', 'amp': '&'}
def codes(s):
    for _ in range(4):
        s = re.sub(r'[A-Z]<<+\s+(.*?)\s+>>+', lambda m: m.group(1), s)
        s = re.sub(r'E<([^<>]*)>', lambda m: E.get(m.group(1), ''), s)
        s = re.sub(r'L<([^<>|]*)\|[^<>]*>', r'\1', s)
        s = re.sub(r'L<"?([^<>"]*)"?>', r'\1', s)
        s = re.sub(r'[XZ]<[^<>]*>', '', s)
        s = re.sub(r'[A-Z]<([^<>]*)>', r'\1', s)
    return s
kept = drop = 0
for f in sys.argv[1:]:
    t = (gzip.open if f.endswith('.gz') else open)(f, 'rb').read().decode('utf-8', 'replace')
    inpod, skipblock = True, False
    out = []
    for p in re.split(r'\n[ \t]*\n', t):
        if not p.strip(): continue
        if p.startswith('=cut'): inpod = False; continue
        if p.startswith('='): inpod = True
        if not inpod: continue
        if p.startswith('=begin') or p.startswith('=for'): skipblock = p.startswith('=begin'); continue
        if p.startswith('=end'): skipblock = False; continue
        if skipblock: continue
        if p[0] in ' \t': drop += len(p); continue
        m = re.match(r'=(head\d|item)\s*(.*)', p, re.S)
        if m: p = m.group(2)
        elif p.startswith('='): continue
        s = codes(re.sub(r'\s+', ' ', p)).strip()
        if s and s != '*': out.append(s)
    o = '\n'.join(out) + '\n\n'; kept += len(o.encode()); sys.stdout.write(o)
print(f'pod2txt: kept {kept/1e6:.2f} MB dropped-verbatim {drop/1e6:.2f} MB', file=sys.stderr)
