#!/usr/bin/env bash
# Debian's Chromium for the viewer's browser tests (tests/viewer/test_browser.py), which drive
# it with Playwright through executable_path: no browser build is ever downloaded.
#
#   .ci/chromium.sh     install the `chromium` package with apt-get when /usr/bin/chromium is
#                       missing (after apt-get update); a no-op when it is there.
#
# Needs root (or sudo) to install. Diagnostics go to stderr; stdout gets one line: the version.
set -euo pipefail

CHROMIUM="${POLYLOOP_CHROMIUM:-/usr/bin/chromium}"

if [ ! -x "$CHROMIUM" ]; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "chromium.sh: not root and no sudo" >&2; exit 1; }
        sudo="sudo"
    fi
    echo "chromium.sh: installing Debian's chromium package" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi
[ -x "$CHROMIUM" ] || { echo "chromium.sh: no executable at $CHROMIUM after install" >&2; exit 1; }
"$CHROMIUM" --version 2>/dev/null
