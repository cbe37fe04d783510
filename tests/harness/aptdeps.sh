#!/usr/bin/env bash
# Install the Debian packages the tests need (every .ci/apt/*.txt), missing ones only; given
# list names (`aptdeps.sh venv`), only those lists' (.ci/apt/venv.txt): what `make demo` needs.
#
# `make test` and `make demo` promise to work on a fresh machine, and some of what the suite
# drives only comes from Debian (umockdev's test bed, mmdebstrap and umoci for the images,
# iproute2 for network namespaces, a C compiler, python3-venv for the venv itself). The
# Makefile's install step runs this before anything else. Each .ci/apt/<topic>.txt lists
# packages, one or more a line, `#` starting a comment; this reads them all when it runs, so a
# handler that adds a file is covered without touching this script.
#
# When every package is installed it only asks dpkg (no apt-get update) and prints nothing.
# Otherwise it installs them as root, or through `sudo -n` when that works without a password;
# where neither is possible it stops with one message naming the packages and the command to
# run, before any test starts.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
shopt -s nullglob
if [ "$#" -gt 0 ]; then
  lists=()
  for name in "$@"; do lists+=("$REPO/.ci/apt/$name.txt"); done
else
  lists=("$REPO"/.ci/apt/*.txt)
fi
[ "${#lists[@]}" -gt 0 ] || exit 0

mapfile -t wanted < <(sed 's/#.*//' "${lists[@]}" | tr -s ' \t' '\n' | grep -v '^$' | sort -u)
[ "${#wanted[@]}" -gt 0 ] || exit 0

if ! command -v dpkg-query >/dev/null; then
  echo "The tests need these Debian packages, and this machine has no dpkg:" \
    "${wanted[*]} (listed in .ci/apt/*.txt); install their equivalents by hand." >&2
  exit 1
fi

# One dpkg-query for all: it prints the installed ones (and complains on stderr about unknown).
declare -A installed=()
while read -r name status; do
  [ "$status" = "ii" ] && installed[$name]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${wanted[@]}" 2>/dev/null || true)
missing=()
for pkg in "${wanted[@]}"; do
  [ -n "${installed[$pkg]:-}" ] || missing+=("$pkg")
done
[ "${#missing[@]}" -gt 0 ] || exit 0

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    {
      echo "The tests need Debian packages that are not installed: ${missing[*]}"
      echo "(listed in .ci/apt/*.txt). Install them as root, then run make again:"
      echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
    } >&2
    exit 1
  fi
fi

echo "installing Debian packages the tests need: ${missing[*]}" >&2
# Wait for another apt or dpkg run (an unattended upgrade, a second make) rather than fail.
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600)
"${apt[@]}" update
"${apt[@]}" install -y --no-install-recommends "${missing[@]}"
