#!/usr/bin/env bash
# The npm MCP servers the tests of polyloop.tools.mcp talk to (tests/mcp), installed only when
# missing: @modelcontextprotocol/server-everything and @modelcontextprotocol/server-filesystem,
# into a cache folder (default ~/.cache/polyloop/npm, or $POLYLOOP_MCP_NPM_DIR). Node and npm
# come from Debian's packages (apt-get, as root) when `npm` is not on PATH. The Python servers
# (mcp-server-time, mcp-server-git) come with `pip install -e '.[dev]'`.
#
#   .ci/mcp_servers.sh     install what is missing; stdout gets one line: the folder holding
#                          the servers' executables (node_modules/.bin). A no-op when present.
#
# Diagnostics go to stderr.
set -euo pipefail

DIR="${POLYLOOP_MCP_NPM_DIR:-$HOME/.cache/polyloop/npm}"
BIN="$DIR/node_modules/.bin"
PACKAGES=(@modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem)

if [ -x "$BIN/mcp-server-everything" ] && [ -x "$BIN/mcp-server-filesystem" ] \
    && command -v node >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "mcp_servers.sh: no npm, not root, no sudo" >&2; exit 1; }
        sudo="sudo"
    fi
    echo "mcp_servers.sh: installing Debian's nodejs and npm" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi

mkdir -p "$DIR"
echo "mcp_servers.sh: npm install ${PACKAGES[*]} into $DIR" >&2
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "${PACKAGES[@]}" >&2
[ -x "$BIN/mcp-server-everything" ] && [ -x "$BIN/mcp-server-filesystem" ] \
    || { echo "mcp_servers.sh: the servers are not in $BIN after npm install" >&2; exit 1; }
echo "$BIN"
