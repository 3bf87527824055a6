#!/usr/bin/env bash
# Installs Chromium for tests/integration/test_report_browser.py, which renders the HTML run
# report headless (screenshot + DOM dump). Idempotent; never fails the caller's setup: without
# Chromium that one test skips with a message, everything else runs.
set -u

if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium.sh: apt-get not available; install Chromium with your package manager" \
       "(the report browser test will skip without /usr/bin/chromium)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_chromium.sh: not root and no sudo; skipping Chromium install" >&2
    exit 0
  fi
fi
if $SUDO apt-get update && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; then
  echo "installed: $(/usr/bin/chromium --version 2>/dev/null)"
else
  echo "install_chromium.sh: apt-get install chromium failed (offline?); the report browser" \
       "test will skip" >&2
fi
exit 0
