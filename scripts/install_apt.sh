#!/usr/bin/env bash
# Installs the Debian packages that some tests need, each named like the program it provides:
#   bash scripts/install_apt.sh chromium shellcheck
# The chromium package renders the HTML run report headless (test_report_browser.py), the
# package "shellcheck" lints scripts/ (test_launchers.py). Idempotent; never fails the caller's
# setup: without apt-get, root/sudo or network it says so and exits 0, and the tests that need a
# missing program skip and name it.
set -u

MISSING=()
for pkg in "$@"; do
  if command -v "$pkg" >/dev/null 2>&1; then echo "$pkg already installed"; else MISSING+=("$pkg"); fi
done
[ ${#MISSING[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_apt.sh: apt-get not available; install ${MISSING[*]} with your package manager" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install_apt.sh: not root and no passwordless sudo; not installing ${MISSING[*]}" >&2
    exit 0
  fi
fi
if $SUDO apt-get update -q &&
   $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${MISSING[@]}"; then
  echo "installed: ${MISSING[*]}"
else
  echo "install_apt.sh: apt-get install ${MISSING[*]} failed (offline?); tests needing them skip" >&2
fi
exit 0
