#!/usr/bin/env bash
# Makes .venv: the Python components as editable installs plus the dev group (Makefile, install).
# A fresh clone would spend ~3 minutes unpacking the same wheels (torch alone is GBs) that the last
# clone unpacked, so a finished venv is kept under ~/.cache/embedfleet/venv, keyed by the Python
# and every pyproject.toml, and a later clone with the same key gets a hard-linked copy (seconds),
# its paths rewritten from the clone that made it to this one. No cache, or a copy that does not
# import, falls back to pip.
#
#   hack/venv.sh PYTHON VENV COMPONENT...
set -euo pipefail

py=$1 venv=$2
shift 2
components=("$@")
here="$(pwd -P)"
cache_root="${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/venv"

key="$({ "$py" -VV; uname -m; cat pyproject.toml "${components[@]/%//pyproject.toml}"; } |
  sha256sum | cut -c1-20)"
cached="$cache_root/$key"

# Files that name the checkout a venv was made in: the scripts' #! lines and activate, and the
# editable installs' path hooks.
paths_in() {
  grep -rlI --exclude-dir=__pycache__ -e "$2" "$1/bin" "$1"/lib/python3*/site-packages/*.pth \
    "$1"/lib/python3*/site-packages/__editable__* \
    "$1"/lib/python3*/site-packages/*.dist-info/direct_url.json 2>/dev/null || true
}

from_cache() {
  [[ -x "$venv/bin/python" || ! -f "$cached/.origin" ]] && return 1
  local origin
  origin="$(cat "$cached/.origin")"
  rm -rf "$venv.partial"
  cp -al "$cached" "$venv.partial"
  rm "$venv.partial/.origin"
  # sed -i writes a new file, so the cache's hard-linked originals stay as they were.
  paths_in "$venv.partial" "$origin/" | while read -r f; do sed -i "s#$origin/#$here/#g" "$f"; done
  mv -T "$venv.partial" "$venv"
  if ! "$venv/bin/python" -c "import embedfleet.worker, embedfleet.testing, pytest" 2>/dev/null; then
    echo "venv: the cached copy $key does not import; installing with pip" >&2
    rm -rf "$venv"
    return 1
  fi
  echo "venv: reused $key (hard links)" >&2
}

with_pip() {
  test -x "$venv/bin/python" || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade "pip>=25.1"
  local editable=()
  for c in "${components[@]}"; do editable+=(-e "./$c"); done
  "$venv/bin/python" -m pip install -q "${editable[@]}" --group dev
  [[ -d "$cached" ]] && return 0
  # Into the cache under a temporary name first, so another clone never sees half a venv.
  mkdir -p "$cache_root"
  local partial="$cached.partial.$$"
  cp -al "$venv" "$partial"
  rm -f "$partial/.installed"
  echo "$here" >"$partial/.origin"
  mv -T "$partial" "$cached" 2>/dev/null || rm -rf "$partial"
  echo "venv: kept as $key" >&2
  # Two keys at most (a branch and main); an older one is a full copy once its venv is gone.
  ls -1dt "$cache_root"/????????????????????/ | tail -n +3 | xargs -r rm -rf
}

from_cache || with_pip
