#!/usr/bin/python3
"""Keep only prose-like paragraphs; print one paragraph per line.
usage: prose_filter.py [--lines|--blank] FILE > out   (stats to stderr)
Paragraphs: by default blank-line separated and re-flowed if the file looks hard-wrapped
(median non-empty line length < 100), else one per line.
A paragraph is kept if it has >= 8 words, >= 80% of tokens are ordinary words
(letters with optional trailing punctuation) and it contains a sentence end (. ! ? ...)."""
import sys, re, statistics
args = sys.argv[1:]
mode = None
if args[0] in ('--lines', '--blank'):
    mode = args.pop(0)
f = args[0]
t = open(f, encoding='utf-8', errors='replace').read()
lines = [l for l in t.split('\n') if l.strip()]
med = statistics.median(len(l) for l in lines) if lines else 0
if mode is None:
    long = sum(1 for l in lines if len(l) > 100)
    mode = '--lines' if long > 0.05 * len(lines) else '--blank'
paras = re.split(r'\n\s*\n', t) if mode == '--blank' else t.split('\n')
WORD = re.compile(r'''^[("'“‘]?[A-Za-z][A-Za-z'’-]*[.,;:!?)"'”’]*$''')
kept = []
for p in paras:
    if len(p) > 20000:      # runaway paragraph: fall back to lines
        for l in p.split('\n'):
            paras.append(l) if len(l) <= 20000 else None
        continue
    s = re.sub(r'\s+', ' ', p).strip()
    w = s.split(' ')
    if len(w) < 8:
        continue
    good = sum(1 for x in w if WORD.match(x))
    if good / len(w) < 0.8 or not re.search(r'[.!?]["”’)]?( |$)', s):
        continue
    kept.append(s)
o = '\n'.join(kept) + '\n'
sys.stdout.write(o)
print(f'{f}: mode={mode} in={len(t.encode())/1e6:.2f}MB prose={len(o.encode())/1e6:.2f}MB', file=sys.stderr)
