#!/usr/bin/python3
"""Dump a SWORD zText/zCom(4) module (CompressType=ZIP) to plain text, one verse/entry per line.
usage: sword2txt.py MODULE_DIR [bzs|czs]   (e.g. .../ztext/engWEB2015eb/)"""
import sys, os, struct, zlib, re, html
d = sys.argv[1]
out = []
for t in ('ot', 'nt'):
    for ext in ('b', 'c'):
        s = os.path.join(d, f'{t}.{ext}zs')
        if os.path.exists(s) and os.path.getsize(s):
            break
    else:
        continue
    idx = open(s, 'rb').read()
    comp = open(os.path.join(d, f'{t}.{ext}zz'), 'rb').read()
    blocks = []
    for i in range(0, len(idx), 12):
        off, size, usize = struct.unpack('<III', idx[i:i+12])
        blocks.append(zlib.decompress(comp[off:off+size]) if size else b'')
    vi = open(os.path.join(d, f'{t}.{ext}zv'), 'rb').read()
    es = 12 if ext == 'c' else 10   # zVerse4 (.c?? files) uses 32-bit sizes
    prev = None
    for i in range(0, len(vi) - es + 1, es):
        if es == 10:
            b, o, n = struct.unpack('<IIH', vi[i:i+10])
        else:
            b, o, n = struct.unpack('<III', vi[i:i+12])
        if n == 0 or b >= len(blocks) or (b, o) == prev:
            continue
        prev = (b, o)
        txt = blocks[b][o:o+n].decode('utf-8', 'replace')
        txt = re.sub(r'<note\b[^>]*type="crossReference".*?</note>', '', txt, flags=re.S)
        txt = re.sub(r'<(title|div type="x-milestone")[^>]*/>', '', txt)
        txt = re.sub(r'<(lb|p|/p|br|l|/l|title|/title|lg|/lg|div|/div)\b[^>]*>', '\n', txt)
        txt = re.sub(r'<[^>]+>', '', txt)
        txt = html.unescape(txt)
        txt = re.sub(r'[ \t]+', ' ', txt)
        txt = re.sub(r'\s*\n\s*', '\n', txt).strip()
        if txt:
            out.append(txt)
sys.stdout.write('\n'.join(out) + '\n')
