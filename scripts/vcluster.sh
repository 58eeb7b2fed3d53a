#!/bin/bash
# A virtual multi-node cluster on one Linux machine, for trying Horovod and Slurm across "nodes".
#
#   scripts/vcluster.sh up [--nodes N] [--rate RATE] [--delay DELAY]   # as root; default 2 nodes, 1gbit, no delay
#   scripts/vcluster.sh shape --rate RATE [--delay DELAY]              # change the links of a running cluster
#   scripts/vcluster.sh status                                        # nodes, addresses, link settings
#   scripts/vcluster.sh exec labkit-node1 COMMAND...                  # run a command on a node (launch from there)
#   scripts/vcluster.sh down                                          # remove everything `up` made
#
# Each node is a network namespace labkit-nodeK (with its own hostname) joined by a veth link to one
# bridge, labkit-br0, on a private /24 that exists only on these links. Every node's link is shaped with
# tc to RATE in both directions (tbf), plus a one-way DELAY on the way out of each node when asked (tc netem,
# or on kernels without it scripts/delay_relay.py in each node: a message between two nodes then takes DELAY
# more, a round trip 2 x DELAY).
# Inside each node run an sshd (for `horovodrun -H labkit-node1:1,labkit-node2:1`; its key lives in a
# 0700 directory of the cluster's own) and a slurmd; slurmctld and munged run on the host, munge's
# socket is a file every namespace sees. Names resolve through /etc/hosts lines marked "# labkit-vcluster".
# The files live in $LABKIT_VCLUSTER_DIR (default /run/labkit-vcluster); SLURM_CONF for the clients is
# printed by `up` and `status`. `up` and `down` are idempotent; `down` removes exactly what `up` made.
# Settings: LABKIT_VCLUSTER_SUBNET (first three octets, default 10.251.77), LABKIT_VCLUSTER_CPUS (CPUs
# Slurm gives each node, default: this machine's cores), LABKIT_VCLUSTER_MTU (default 9000). Needs: iproute2 (ip, tc), openssh-server,
# slurmctld, slurmd, slurm-client, munge. Introduced in notebooks/07_scaling_deep_dive.ipynb.
set -euo pipefail

PATH="$PATH:/usr/sbin:/sbin"
DIR="${LABKIT_VCLUSTER_DIR:-/run/labkit-vcluster}"
SUBNET="${LABKIT_VCLUSTER_SUBNET:-10.251.77}"
BRIDGE=labkit-br0
PREFIX=labkit-node
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # scripts/: slurm.conf.in
MARK="# labkit-vcluster"
SSH_CONF=/etc/ssh/ssh_config.d/labkit-vcluster.conf
HOST_IP="$SUBNET.254"
# Jumbo frames, as cluster networks use: at MTU 1500 the per-packet cost of shaping on a busy 2-core
# machine held a 1gbit link to ~0.7 Gbit/s of TCP payload; at 9000 it reaches ~0.99 (measured).
MTU="${LABKIT_VCLUSTER_MTU:-9000}"

die() { echo "vcluster: $*" >&2; exit 2; }
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
say() { echo "vcluster: $*"; }

valid_rate() { echo "$1" | grep -Eq '^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$'; }
valid_delay() { [ "$1" = 0 ] || echo "$1" | grep -Eq '^[0-9]+(\.[0-9]+)?(us|ms|s)$'; }

need_root() {
  [ "$(uname -s)" = Linux ] || die "needs Linux network namespaces; this is $(uname -s)"
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, tc and the daemons need it)"
}

need_commands() {
  local missing="" c
  for c in "$@"; do command -v "$c" > /dev/null 2>&1 || missing="$missing $c"; done
  [ -z "$missing" ] || die "missing:$missing (install: apt-get install iproute2 openssh-server slurmctld slurmd slurm-client munge)"
}

nodes_up() { [ -f "$DIR/nodes" ] && cat "$DIR/nodes" || echo 0; }

# shape NODE_INDEX RATE DELAY: both ends of the node's link at RATE (tbf); DELAY on the node's way out, by
# tc netem where the kernel has it, else by scripts/delay_relay.py: the node routes its own packets for the
# other nodes through a TUN device (lkd0) that the relay holds each packet in for DELAY, then forwards them
# out of eth0 (policy routing: table 101 for locally made packets to the cluster's /24, the host excepted)
shape_node() {
  local i="$1" rate="$2" delay="$3"
  stop_relay "$i"
  if [ "$delay" != 0 ] && have_netem; then
    ip netns exec "$PREFIX$i" tc qdisc replace dev eth0 root netem delay "$delay" rate "$rate" limit 10000
  else
    ip netns exec "$PREFIX$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst 16kb latency 100ms
    [ "$delay" = 0 ] || start_relay "$i" "$delay"
  fi
  tc qdisc replace dev "lkv$i" root tbf rate "$rate" burst 16kb latency 100ms
}

have_netem() {  # some kernels leave tc netem out (CONFIG_NET_SCH_NETEM)
  unshare --net tc qdisc add dev lo root netem delay 1ms 2> /dev/null
}

start_relay() {  # start_relay NODE_INDEX DELAY
  local i="$1" delay="$2" ns="$PREFIX$1"
  start_daemon "delay-$i" "$ns" "$(command -v python3)" "$HERE/delay_relay.py" --dev lkd0 --delay "$delay" \
    --mtu "$MTU" --node "$ns"
  wait_for 10 "the delay relay on $ns" ip netns exec "$ns" ip link show lkd0
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
    net.ipv4.conf.lkd0.rp_filter=0 net.ipv4.conf.lkd0.accept_local=1 net.ipv4.conf.all.send_redirects=0 \
    net.ipv4.conf.eth0.send_redirects=0 net.ipv4.conf.all.accept_redirects=0
  ip netns exec "$ns" ip link set lkd0 mtu "$MTU" up
  ip netns exec "$ns" ip route replace "$SUBNET.0/24" dev lkd0 src "$SUBNET.$i" table 101
  ip netns exec "$ns" ip route replace throw "$HOST_IP" table 101
  ip netns exec "$ns" ip rule add pref 100 iif lo to "$SUBNET.0/24" lookup 101
}

stop_relay() {  # stop_relay NODE_INDEX: the node's relay, its device and routes, if any
  local i="$1" ns="$PREFIX$1" pid name
  [ -f "$DIR/pids" ] || return 0
  while read -r pid name; do
    if [ "$name" = "delay-$i" ] && ours "$pid"; then kill "$pid" 2> /dev/null || true; fi
  done < "$DIR/pids"
  grep -v " delay-$i\$" "$DIR/pids" > "$DIR/pids.tmp" || true
  mv "$DIR/pids.tmp" "$DIR/pids"
  ip netns exec "$ns" ip rule del pref 100 2> /dev/null || true
  ip netns exec "$ns" ip route flush table 101 2> /dev/null || true
  local t=0
  while ip netns exec "$ns" ip link show lkd0 > /dev/null 2>&1 && [ "$t" -lt 25 ]; do sleep 0.2; t=$((t + 1)); done
}

check_delay() {  # without netem, a delay needs python3 for scripts/delay_relay.py and a TUN device
  valid_delay "$1" || die "--delay must be a tc time such as 0.2ms or 50us (or 0 for none); got '$1'"
  [ "$1" = 0 ] && return 0
  have_netem && return 0
  command -v python3 > /dev/null 2>&1 || die "--delay needs tc netem (absent from this kernel) or python3 for scripts/delay_relay.py"
  [ -c /dev/net/tun ] || die "--delay needs tc netem (absent from this kernel) or a TUN device (/dev/net/tun) for scripts/delay_relay.py"
}

start_daemon() {  # start_daemon NAME NETNS|- COMMAND...: background, pid recorded in $DIR/pids
  local name="$1" ns="$2"; shift 2
  if [ "$ns" = - ]; then
    setsid "$@" > "$DIR/log/$name.out" 2>&1 < /dev/null &
  else
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup file systems slurmd needs.
    # A new UTS namespace too, so that `hostname` inside the node says its name.
    # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
    setsid nsenter --net="/run/netns/$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@" \
      > "$DIR/log/$name.out" 2>&1 < /dev/null &
  fi
  echo "$! $name" >> "$DIR/pids"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local t="$1" what="$2" i=0; shift 2
  while ! "$@" > /dev/null 2>&1; do
    i=$((i + 1))
    local pid name
    while read -r pid name; do
      kill -0 "$pid" 2> /dev/null || { tail -n 5 "$DIR/log/$name.out" >&2 || true; die "$name exited while waiting for $what"; }
    done < "$DIR/pids"
    [ "$i" -le $((t * 5)) ] || { tail -n 5 "$DIR"/log/* >&2 2>/dev/null || true; die "timed out waiting for $what"; }
    sleep 0.2
  done
}

free_port() {  # a TCP port nobody listens on in the host's namespace
  local p
  for p in $(seq 16817 16917); do
    if ! ss -Htln "sport = :$p" | grep -q .; then echo "$p"; return; fi
  done
  die "no free TCP port in 16817-16917"
}

write_slurm_conf() {
  # scripts/slurm.conf.in (shared with tests/course/test_slurm.py) filled in, plus one NodeName line per node
  local n="$1" cpus="$2" ctld_port="$3" host i
  host="$(hostname -s)"
  sed -e "s|@CLUSTER@|labkit-vcluster|" -e "s|@CTLD_HOST@|$host($HOST_IP)|" -e "s|@CTLD_PORT@|$ctld_port|" \
      -e "s|@SLURMD_PORT@|6818|" -e "s|@USER@|root|g" -e "s|@DIR@|$DIR|g" \
      "$HERE/slurm.conf.in" > "$DIR/etc/slurm.conf"
  echo "NodeName=DEFAULT CPUs=$cpus State=UNKNOWN" >> "$DIR/etc/slurm.conf"
  for i in $(seq 1 "$n"); do echo "NodeName=$PREFIX$i NodeAddr=$SUBNET.$i" >> "$DIR/etc/slurm.conf"; done
  echo "PartitionName=debug Nodes=${PREFIX}[1-$n] Default=YES MaxTime=INFINITE State=UP" >> "$DIR/etc/slurm.conf"
}

write_sshd_conf() {
  local i="$1"
  cat > "$DIR/etc/sshd-$i.conf" <<EOF
ListenAddress $SUBNET.$i:22
HostKey $DIR/ssh/host_ed25519
PidFile $DIR/run/sshd-$i.pid
AuthorizedKeysFile $DIR/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
EOF
}

print_status() {
  local n i
  n="$(nodes_up)"
  [ "$n" -gt 0 ] || { say "no virtual cluster is up"; return; }
  say "$n nodes, links $(cat "$DIR/shape") (rate, one-way delay), bridge $BRIDGE at $HOST_IP"
  for i in $(seq 1 "$n"); do
    echo "  $PREFIX$i  $SUBNET.$i  link lkv$i"
  done
  echo "  Slurm: export SLURM_CONF=$DIR/etc/slurm.conf"
  echo "  Horovod (launched from a node, as a job does): $0 exec ${PREFIX}1 \\"
  echo "    horovodrun --gloo -np 2 -H ${PREFIX}1:1,${PREFIX}2:1 --network-interface eth0 python -m labkit.scale.hvd_train --threads 1"
}

ours() {  # ours PID: a live process this cluster started (its command line or environment names it)
  { tr '\0' ' ' < "/proc/$1/cmdline" | grep -Eq "$DIR|$PREFIX"; } 2> /dev/null && return 0
  { tr '\0' '\n' < "/proc/$1/environ" | grep -q "^SLURM_CONF=$DIR/"; } 2> /dev/null
}

cmd_down() {
  need_root
  local pid name i ns left
  if [ -f "$DIR/pids" ]; then  # daemons, newest first; only while the PID is still ours
    while read -r pid name; do
      if ours "$pid"; then kill "$pid" 2> /dev/null || true; fi
    done < <(tac "$DIR/pids")
    for i in 1 2 3 4 5 6 7 8 9 10; do
      left=0
      while read -r pid name; do if ours "$pid"; then left=1; fi; done < "$DIR/pids"
      [ "$left" = 1 ] || break
      sleep 0.3
    done
    while read -r pid name; do
      if ours "$pid"; then kill -9 "$pid" 2> /dev/null || true; fi
    done < "$DIR/pids"
  fi
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9][0-9]*\$" || true); do
    for pid in $(ip netns pids "$ns" 2> /dev/null || true); do kill -9 "$pid" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
  for i in $(ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^lkv[0-9][0-9]*$' || true); do
    ip link del "$i" 2> /dev/null || true
  done
  ip link del "$BRIDGE" 2> /dev/null || true
  if grep -q "$MARK\$" /etc/hosts 2> /dev/null; then
    grep -v "$MARK\$" /etc/hosts > "$DIR.hosts.tmp" || true
    cat "$DIR.hosts.tmp" > /etc/hosts  # in place: /etc/hosts may be a bind mount
    rm -f "$DIR.hosts.tmp"
  fi
  if [ -f "$SSH_CONF" ] && grep -q "$MARK" "$SSH_CONF"; then rm -f "$SSH_CONF"; fi
  if [ -f "$DIR/made-run-sshd" ]; then rmdir /run/sshd 2> /dev/null || true; fi
  rm -rf "$DIR"
  say "down: nothing left"
}

cmd_up() {
  local n=2 rate=1gbit delay=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) [ $# -ge 2 ] || die "--nodes needs a value"; n="$2"; shift 2 ;;
      --rate) [ $# -ge 2 ] || die "--rate needs a value"; rate="$2"; shift 2 ;;
      --delay) [ $# -ge 2 ] || die "--delay needs a value"; delay="$2"; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die "up: unknown option '$1' (expected --nodes N, --rate RATE, --delay DELAY)" ;;
    esac
  done
  if ! echo "$n" | grep -Eq '^[0-9]+$' || [ "$n" -lt 1 ] || [ "$n" -gt 32 ]; then die "--nodes must be an integer 1..32; got '$n'"; fi
  valid_rate "$rate" || die "--rate must be a tc rate such as 1gbit or 100mbit; got '$rate'"
  valid_delay "$delay" || die "--delay must be a tc time such as 0.2ms or 50us (or 0 for none); got '$delay'"
  need_root
  check_delay "$delay"
  need_commands ip tc ss setsid unshare nsenter sshd ssh-keygen munged mungekey slurmctld slurmd scontrol sinfo
  if [ "$(nodes_up)" = "$n" ] && [ "$(cat "$DIR/shape" 2> /dev/null)" = "$rate $delay" ] \
     && ip netns list | grep -q "^$PREFIX$n " && SLURM_CONF="$DIR/etc/slurm.conf" scontrol ping 2> /dev/null | grep -q UP; then
    say "already up"; print_status; return
  fi
  [ -e "$DIR" ] && cmd_down > /dev/null
  local ip_used
  ip_used="$(ip -o addr show | grep -F " $SUBNET." || true)"
  [ -z "$ip_used" ] || die "addresses in $SUBNET.0/24 are in use here; set LABKIT_VCLUSTER_SUBNET (e.g. 10.252.88)"
  local cpus="${LABKIT_VCLUSTER_CPUS:-$(nproc)}" i
  mkdir -p "$DIR"
  chmod 0755 "$DIR"  # munged wants every directory on its socket's path executable by all
  mkdir -p "$DIR/etc" "$DIR/log" "$DIR/run" "$DIR/state" "$DIR/spool" "$DIR/munge" "$DIR/ssh"
  chmod 0755 "$DIR/munge"
  chmod 0700 "$DIR/ssh" "$DIR/state"
  : > "$DIR/pids"
  echo "$rate $delay" > "$DIR/shape"
  trap 'echo "vcluster: up failed; removing what it made" >&2; cmd_down > /dev/null 2>&1 || true' EXIT

  # network: bridge on the host, one shaped veth per node
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" mtu "$MTU"
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 1 "$n"); do
    ip netns add "$PREFIX$i"
    ip link add "lkv$i" mtu "$MTU" type veth peer name "lkv${i}n" mtu "$MTU"
    ip link set "lkv${i}n" netns "$PREFIX$i"
    ip netns exec "$PREFIX$i" ip link set "lkv${i}n" name eth0
    ip netns exec "$PREFIX$i" ip addr add "$SUBNET.$i/24" dev eth0
    ip netns exec "$PREFIX$i" ip link set eth0 up
    ip netns exec "$PREFIX$i" ip link set lo up
    ip link set "lkv$i" master "$BRIDGE"
    ip link set "lkv$i" up
    shape_node "$i" "$rate" "$delay"
  done
  echo "$n" > "$DIR/nodes"

  # names
  local hosts_tmp="$DIR/hosts.tmp"
  grep -v "$MARK\$" /etc/hosts > "$hosts_tmp" || true
  for i in $(seq 1 "$n"); do echo "$SUBNET.$i $PREFIX$i $MARK" >> "$hosts_tmp"; done
  cat "$hosts_tmp" > /etc/hosts
  rm -f "$hosts_tmp"

  # ssh: a key pair and a host key of the cluster's own; one sshd per node
  ssh-keygen -q -t ed25519 -N '' -C labkit-vcluster -f "$DIR/ssh/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C labkit-vcluster-host -f "$DIR/ssh/host_ed25519"
  cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
  chmod 0600 "$DIR/ssh/authorized_keys"
  : > "$DIR/ssh/known_hosts"
  for i in $(seq 1 "$n"); do
    echo "$PREFIX$i,$SUBNET.$i $(cut -d' ' -f1,2 "$DIR/ssh/host_ed25519.pub")" >> "$DIR/ssh/known_hosts"
  done
  cat > "$SSH_CONF" <<EOF
$MARK: made by scripts/vcluster.sh up, removed by scripts/vcluster.sh down
Host $PREFIX* $SUBNET.*
  User root
  IdentityFile $DIR/ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/ssh/known_hosts
  StrictHostKeyChecking yes
  LogLevel ERROR
EOF
  if [ ! -d /run/sshd ]; then mkdir -p /run/sshd && chmod 0755 /run/sshd && touch "$DIR/made-run-sshd"; fi
  for i in $(seq 1 "$n"); do
    write_sshd_conf "$i"
    start_daemon "sshd-$i" "$PREFIX$i" "$(command -v sshd)" -D -e -f "$DIR/etc/sshd-$i.conf"
  done

  # munge + Slurm
  mungekey --create --keyfile="$DIR/munge/munge.key"
  start_daemon munged - munged --foreground --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.sock" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
  wait_for 10 "munged's socket" test -S "$DIR/munge/munge.sock"
  write_slurm_conf "$n" "$cpus" "$(free_port)"
  export SLURM_CONF="$DIR/etc/slurm.conf"
  start_daemon slurmctld - slurmctld -D
  wait_for 30 "slurmctld (scontrol ping)" sh -c 'scontrol ping | grep -q UP'
  for i in $(seq 1 "$n"); do
    start_daemon "slurmd-$i" "$PREFIX$i" slurmd -D -N "$PREFIX$i"
  done
  wait_for 60 "all $n nodes idle" sh -c "[ \"\$(sinfo -h -N -t idle -o %N | sort -u | wc -l)\" -eq $n ]"
  for i in $(seq 1 "$n"); do
    wait_for 20 "sshd on $PREFIX$i" ssh -o BatchMode=yes -o ConnectTimeout=2 "$PREFIX$i" true
  done
  trap - EXIT
  print_status
}

cmd_shape() {
  local rate="" delay=0 n i
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) [ $# -ge 2 ] || die "--rate needs a value"; rate="$2"; shift 2 ;;
      --delay) [ $# -ge 2 ] || die "--delay needs a value"; delay="$2"; shift 2 ;;
      *) die "shape: unknown option '$1' (expected --rate RATE [--delay DELAY])" ;;
    esac
  done
  valid_rate "$rate" || die "--rate must be a tc rate such as 1gbit or 100mbit; got '$rate'"
  valid_delay "$delay" || die "--delay must be a tc time such as 0.2ms or 50us (or 0 for none); got '$delay'"
  need_root
  check_delay "$delay"
  n="$(nodes_up)"
  [ "$n" -gt 0 ] || die "no virtual cluster is up (scripts/vcluster.sh up)"
  for i in $(seq 1 "$n"); do shape_node "$i" "$rate" "$delay"; done
  echo "$rate $delay" > "$DIR/shape"
  say "links now $rate, one-way delay $delay"
}

cmd_exec() {  # exec NODE COMMAND...: in the node's network and a UTS namespace named after it
  [ $# -ge 2 ] || die "exec needs a node and a command, e.g. exec ${PREFIX}1 hostname"
  need_root
  local node="$1"; shift
  [ -e "/run/netns/$node" ] || die "exec: no node '$node' (up: $(ip netns list | awk '{print $1}' | grep "^$PREFIX" | paste -sd' ' -))"
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  exec nsenter --net="/run/netns/$node" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; [ $# -eq 0 ] || die "down takes no options; got '$1'"; cmd_down ;;
  shape) shift; cmd_shape "$@" ;;
  status) print_status ;;
  exec) shift; cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  "") usage >&2; exit 2 ;;
  *) die "unknown command '$1' (expected up, down, shape, status or exec)" ;;
esac
