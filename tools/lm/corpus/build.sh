#!/usr/bin/env bash
# Builds the default model's English corpus from Debian 12 (main) packages whose licences let the
# text and what is trained on it be redistributed: public domain and permissive licences only (no
# GPL, GFDL or CC-BY-SA text, since whether a model's weights derive from its training text is
# unsettled). Packages are downloaded (apt-get download) and unpacked with dpkg-deb -x under WORK:
# nothing is installed. Converters beside this script turn each format into plain text;
# prose_filter.py keeps prose paragraphs (>= 8 words, mostly ordinary words, a sentence end), one a
# line. Writes WORK/prose/<source>.txt and WORK/SOURCES.tsv (source, packages, versions, licence,
# MB). tools/lm/corpus.py then makes documents and the held-out split.
#   WORK=/tmp/lm-corpus bash tools/lm/corpus/build.sh     (after apt-get update; ~2 minutes)
set -euo pipefail
WORK=${WORK:-/tmp/lm-corpus}
T=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
mkdir -p "$WORK"/{debs,x,txt,prose}
cd "$WORK"
get() {  # download (if missing) and unpack each package into x/PKG
  local need=()
  for p in "$@"; do ls debs/"${p}"_*.deb > /dev/null 2>&1 || need+=("$p"); done
  [ ${#need[@]} -eq 0 ] || (cd debs && apt-get download -q "${need[@]}" 2>&1 | grep -v unsandboxed || true)
  for p in "$@"; do [ -d "x/$p" ] || dpkg-deb -x "$(ls debs/"${p}"_*.deb | head -1)" "x/$p"; done
}
H="$PY $T/html2txt.py --nopre"
declare -A PKG LIC
src() { PKG[$1]=$2; LIC[$1]=$3; }

get sword-text-web sword-comm-mhcc sword-comm-tdavid dict-devil jargon-text fortunes fortunes-min miscfiles \
  cfi-en wordnet-base python3.11-doc perl-doc postgresql-doc-15 sqlite3-doc python-django-doc rust-doc \
  nodejs-doc abs-guide
S=usr/share/sword/modules
$PY "$T/sword2txt.py" "x/sword-text-web/$S/texts/ztext/engWEB2015eb" > txt/bible-web.txt
src bible-web sword-text-web public-domain
$PY "$T/sword2txt.py" "x/sword-comm-mhcc/$S/comments/zcom/mhcc" > txt/comm-mhcc.txt
src comm-mhcc sword-comm-mhcc public-domain
$PY "$T/sword2txt.py" "x/sword-comm-tdavid/$S/comments/zcom/tdavid" > txt/comm-tdavid.txt
src comm-tdavid sword-comm-tdavid public-domain
zcat x/dict-devil/usr/share/dictd/devil.dict.dz | $PY "$T/dictclean.py" devil > txt/devil.txt
src devil dict-devil public-domain
zcat x/jargon-text/usr/share/doc/jargon-text/jargon.txt.gz | sed "s/[{}]//g" > txt/jargon.txt
src jargon jargon-text public-domain
F=x/fortunes/usr/share/games/fortunes
for f in $(ls $F | grep -v -e '\.dat$' -e '\.u8$' -e '^off$' -e art -e ethnic -e men-women); do cat "$F/$f"; echo; done \
  | sed 's/^%$//; s/.\x08//g' > txt/fortunes.txt
F=x/fortunes-min/usr/share/games/fortunes
cat $F/fortunes $F/literature $F/riddles | sed 's/^%$//; s/.\x08//g' >> txt/fortunes.txt
src fortunes "fortunes fortunes-min" "BSD-3-clause (fortune-mod's collection; quotes by many authors)"
zcat x/miscfiles/usr/share/state/us-declaration.gz x/miscfiles/usr/share/state/us-constitution.gz > txt/us-docs.txt
src us-docs miscfiles public-domain
find x/cfi-en -name '*.htm*' | sort -V | $H - > txt/cfi.txt
src cfi cfi-en public-domain
grep -hv '^  ' x/wordnet-base/usr/share/wordnet/data.{noun,verb,adj,adv} | sed 's/^[^|]*| //' > txt/wordnet.txt
src wordnet wordnet-base "WordNet 3.0 licence (Princeton, permissive)"
find x/python3.11-doc/usr/share/doc/python3.11/html/_sources -name '*.txt' | sort | $PY "$T/rst2txt.py" - > txt/python-doc.txt
src python-doc python3.11-doc PSF-2.0
$PY "$T/pod2txt.py" $(find x/perl-doc -name '*.pod' | grep -v delta | sort) > txt/perl-doc.txt
src perl-doc perl-doc "Artistic-1 (or GPL-1+; taken under the Artistic licence)"
find x/postgresql-doc-15 -name '*.html' | sort | $H - > txt/postgresql-doc.txt
src postgresql-doc postgresql-doc-15 PostgreSQL
find x/sqlite3-doc -name '*.html' | sort | $H - > txt/sqlite-doc.txt
src sqlite-doc sqlite3-doc public-domain
find x/python-django-doc -name '*.html' | grep -v -e genindex -e py-modindex -e search.html | sort | $H - > txt/django-doc.txt
src django-doc python-django-doc BSD-3-clause
$H x/rust-doc/usr/share/doc/rust-doc/html/*/print.html > txt/rust-books.txt
src rust-books rust-doc "MIT or Apache-2.0"
find x/nodejs-doc -name '*.html' ! -name all.html | sort | $H - > txt/nodejs-doc.txt
src nodejs-doc nodejs-doc Expat
find x/abs-guide -name '*.html' | sort | $H - > txt/abs-guide.txt
src abs-guide abs-guide public-domain

: > SOURCES.rows
for s in "${!PKG[@]}"; do
  case $s in
    bible-web | wordnet) awk '!seen[$0]++' "txt/$s.txt" > "prose/$s.txt" ;;  # short lines: all kept
    *) $PY "$T/prose_filter.py" "txt/$s.txt" 2> /dev/null | awk '!seen[$0]++' > "prose/$s.txt" ;;
  esac
  vers=""
  for p in ${PKG[$s]}; do vers+="$(dpkg-deb -f "$(ls debs/"${p}"_*.deb | head -1)" Version) "; done
  printf '%s\t%s\t%s\t%s\t%.2f\n' "$s" "${PKG[$s]}" "${vers% }" "${LIC[$s]}" \
    "$(echo "$(stat -c %s "prose/$s.txt")/1000000" | bc -l)" >> SOURCES.rows
done
{ printf 'source\tpackages\tversions\tlicence\tprose_MB\n'; sort -t$'\t' -k5,5nr SOURCES.rows; } > SOURCES.tsv
rm -f SOURCES.rows
column -t -s$'\t' SOURCES.tsv
