#!/usr/bin/env bash
# Start JupyterLab on the course, bound to 127.0.0.1 with a token (never an open server).
#
#   scripts/lab.sh [--port N] [--no-browser]    (make lab runs setup first, then this)
#
# The token is $JUPYTER_TOKEN if set, else a fresh random one; the URL with it is printed.
# On an HPC compute node, reach it through an SSH tunnel (docs/instructors.md); do not bind 0.0.0.0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LABKIT_VENV:-$here/.venv}"
[ -x "$venv/bin/jupyter" ] || { echo "lab: $venv has no JupyterLab; run: make lab" >&2; exit 2; }
port=8888; browser=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --no-browser) browser=(--no-browser); shift ;;
    *) echo "lab: unknown option $1 (expected --port N, --no-browser)" >&2; exit 2 ;;
  esac
done
[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = Darwin ] || browser=(--no-browser)
export JUPYTER_TOKEN="${JUPYTER_TOKEN:-$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))')}"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-root)   # JupyterLab refuses root without it (containers, CI)
cd "$here"
exec "$venv/bin/jupyter" lab notebooks/00_welcome.ipynb \
  --ServerApp.ip=127.0.0.1 --ServerApp.port="$port" --ServerApp.port_retries=0 \
  --ServerApp.root_dir="$here" --ServerApp.allow_remote_access=False \
  --IdentityProvider.token="$JUPYTER_TOKEN" "${browser[@]}" "${root[@]}"
