#!/usr/bin/python3
"""Rough HTML -> plain text.  Usage: html2txt.py [--nopre] [--main] FILE... > out.txt
--nopre : drop <pre>/<code> blocks (code listings, shell sessions)
Skips <script>, <style>, <head>, <nav> and elements whose class looks like navigation.
Reports to stderr the bytes of text kept and the bytes dropped as <pre>.
Files ending in .gz are decompressed.
"""
import sys, re, gzip, html
from html.parser import HTMLParser

BLOCK = {'p', 'div', 'br', 'li', 'ul', 'ol', 'dl', 'dt', 'dd', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6',
         'table', 'tr', 'td', 'th', 'blockquote', 'pre', 'section', 'article', 'hr', 'title',
         'figure', 'figcaption', 'caption', 'body', 'header', 'footer', 'main', 'aside'}
SKIP = {'script', 'style', 'head', 'nav', 'noscript', 'svg', 'math', 'button', 'select'}
NAVCLASS = re.compile(r'\b(navheader|navfooter|navigation|related|sphinxsidebar|footer|'
                      r'breadcrumb|toc|headerlink|sphinxsidebarwrapper|menu)\b', re.I)
VOID = {'br', 'hr', 'img', 'meta', 'link', 'input', 'area', 'base', 'col', 'embed', 'source',
        'wbr', 'param', 'track'}


class P(HTMLParser):
    def __init__(self, nopre):
        super().__init__(convert_charrefs=True)
        self.nopre = nopre
        self.out = []
        self.stack = []          # (tag, skipping?) for non-void tags
        self.skip = 0
        self.pre = 0
        self.dropped = 0

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            if tag in BLOCK and not self.skip:
                self.out.append('\n')
            return
        cls = ' '.join(v or '' for k, v in attrs if k in ('class', 'role', 'id'))
        s = tag in SKIP or bool(NAVCLASS.search(cls))
        isp = tag == 'pre'
        self.stack.append((tag, s, isp))
        if s:
            self.skip += 1
        if isp:
            self.pre += 1
        if tag in BLOCK and not self.skip:
            self.out.append('\n\n' if tag in ('p', 'pre', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'blockquote') else '\n')

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        # pop to matching tag (tolerate bad nesting)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for t, s, isp in self.stack[i:]:
                    if s:
                        self.skip -= 1
                    if isp:
                        self.pre -= 1
                del self.stack[i:]
                break
        if tag in BLOCK and not self.skip:
            self.out.append('\n')

    def handle_data(self, d):
        if self.skip:
            return
        if self.pre:
            if self.nopre:
                self.dropped += len(d)
                return
            self.out.append(d)
        else:
            self.out.append(re.sub(r'\s+', ' ', d))


def convert(data, nopre):
    p = P(nopre)
    p.feed(data)
    p.close()
    t = ''.join(p.out)
    t = re.sub(r'[ \t]+\n', '\n', t)
    t = re.sub(r'\n[ \t]+(?=\S)', '\n', t) if nopre else t
    t = re.sub(r'\n{3,}', '\n\n', t)
    return t.strip() + '\n', p.dropped


def main():
    args = sys.argv[1:]
    nopre = '--nopre' in args
    files = [a for a in args if not a.startswith('--')]
    if files == ['-']:
        files = [l.rstrip('\n') for l in sys.stdin]
    kept = dropped = 0
    w = sys.stdout
    for f in files:
        op = gzip.open if f.endswith('.gz') else open
        with op(f, 'rb') as fh:
            raw = fh.read()
        data = raw.decode('utf-8', 'replace')
        t, d = convert(data, nopre)
        kept += len(t.encode())
        dropped += d
        w.write(t)
        w.write('\n')
    print(f'html2txt: {len(files)} files, kept {kept/1e6:.2f} MB, dropped-pre {dropped/1e6:.2f} MB',
          file=sys.stderr)


if __name__ == '__main__':
    main()
