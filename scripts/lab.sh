#!/usr/bin/env bash
# Start JupyterLab on the course, bound to 127.0.0.1 with a token (never an open server).
#
#   scripts/lab.sh [--port N] [--no-browser] [--where]   (make lab runs setup first, then this; --port 0: any
#                                                          free port; --where: print the folder served, and stop)
#
# A course installed read-only (one shared copy on an HPC file system): the notebooks are copied into the
# learner's own folder first ($LABKIT_WORKDIR, else the current folder, else ~/labkit-work; never over a copy
# already there) and JupyterLab serves that folder (labkit.base.workdir.lab_folder holds the rule).
# The token is $JUPYTER_TOKEN if set, else a fresh random one. It reaches the server through its
# environment only (a command line is visible to every user in `ps`), and scripts/jupyter/
# jupyter_server_config.py removes it from the server's environment so kernels never inherit it.
# Without a display, the URL with the token is printed to your terminal only; the server's own log
# shows it masked (token=...). `jupyter server list` also shows it, to you alone.
# On an HPC compute node, reach it through an SSH tunnel (docs/instructors.md); do not bind 0.0.0.0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LABKIT_VENV:-$here/.venv}"
[ -x "$venv/bin/jupyter" ] || { echo "lab: $venv has no JupyterLab; run: make lab" >&2; exit 2; }
port=8888; browser=(); where=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port)
      case "${2:-}" in
        ''|*[!0-9]*) echo "lab: --port expects a port number 1-65535 (0: any free port), got '${2:-}'" >&2; exit 2 ;;
      esac
      [ "${#2}" -le 5 ] && [ "$((10#$2))" -le 65535 ] \
        || { echo "lab: --port must be 1-65535 (0: any free port), got $2" >&2; exit 2; }
      port="$((10#$2))"; shift 2 ;;
    --no-browser) browser=(--no-browser); shift ;;
    --where) where=1; shift ;;
    *) echo "lab: unknown option $1 (expected --port N, --no-browser, --where)" >&2; exit 2 ;;
  esac
done
# the folder served: the course, or (read-only course) the learner's folder with the notebooks copied into it
serve="$("$venv/bin/python" -m labkit.base.workdir --lab)" || exit 2
if [ "$where" = 1 ]; then printf '%s\n' "$serve"; exit 0; fi
# The port is claimed here, before the server starts, so the URL printed is the one it listens on:
# 0 becomes a free port the system picks; a busy one is refused with the way out.
port="$("$venv/bin/python" - "$port" <<'PY'
import errno, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: a closing socket is no obstacle
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as err:
    why = "is busy (another JupyterLab?)" if err.errno == errno.EADDRINUSE else f"cannot be used ({err.strerror})"
    sys.exit(f"lab: port {sys.argv[1]} on 127.0.0.1 {why}; pick another with --port N, or --port 0 for any free one")
print(s.getsockname()[1])
PY
)" || exit 2
[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = Darwin ] || browser=(--no-browser)
export JUPYTER_TOKEN="${JUPYTER_TOKEN:-$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))')}"
export JUPYTER_CONFIG_PATH="$here/scripts/jupyter${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-root)   # JupyterLab refuses root without it (containers, CI)

if [ ${#browser[@]} -gt 0 ]; then
  url="http://127.0.0.1:$port/lab?token=$JUPYTER_TOKEN"
  if [ -t 1 ]; then
    printf 'lab: open %s\n' "$url"
  elif { printf 'lab: open %s\n' "$url" >/dev/tty; } 2>/dev/null; then
    :
  else
    echo "lab: serving http://127.0.0.1:$port/lab ; the URL with its token: $venv/bin/jupyter server list"
  fi
fi
cd "$serve"
exec "$venv/bin/jupyter" lab notebooks/00_welcome.ipynb \
  --ServerApp.ip=127.0.0.1 --ServerApp.port="$port" --ServerApp.port_retries=0 \
  --ServerApp.root_dir="$serve" --ServerApp.allow_remote_access=False \
  ${browser[@]+"${browser[@]}"} ${root[@]+"${root[@]}"}
