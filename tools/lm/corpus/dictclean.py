#!/usr/bin/python3
"""Clean a dictd .dict (already zcat'ed) into paragraph-per-line text.
usage: dictclean.py gcide|devil|jargon|foldoc < raw > out"""
import sys, re
kind = sys.argv[1]
data = sys.stdin.read()
# drop dictd header entries (00-database-*)
data = re.sub(r'(?ms)^00-?database.*?(?=^\S)', '', data)
out = []
for para in re.split(r'\n\s*\n', data):
    s = ' '.join(l.strip() for l in para.split('\n'))
    if kind == 'gcide':
        s = re.sub(r'\[(1913 Webster|WordNet 1\.5|PJC|Century Dict\.|Webster 1913 Suppl\.)[^\]]*\]', '', s)
        s = re.sub(r'\\[^\\]*\\', '', s)           # pronunciation \He*red"i*ty\
        s = re.sub(r"\['(.)\]", r'\1', s)          # h['e]r  -> her (accent markup)
        s = re.sub(r'\[[`"^~,]?(.)[`"^~,]?\]', r'\1', s)
    s = s.replace('{', '').replace('}', '')
    s = re.sub(r'\s+', ' ', s).strip()
    if len(s) > 3:
        out.append(s)
sys.stdout.write('\n'.join(out) + '\n')
