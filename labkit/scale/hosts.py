"""Where the ranks run: hosts and slots, the launcher and its settings, core binding (04_horovod_scaling).

labkit.scale.launch starts the ranks where these functions say; `launch_problem` spots a launch over the virtual
cluster's nodes (07_scaling_deep_dive) started from outside them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from labkit.base.checks import check_choice, check_int


def slurm_hosts(env=None) -> list[str]:
    """'host:slots' for each node of the current Slurm allocation (empty outside Slurm)."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return []
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        names = [n for n in nodelist.split(",") if n and "[" not in n]
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": take the first node's count
    per_node = (env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
                or env.get("SLURM_CPUS_ON_NODE", "1"))
    slots = int(per_node) if per_node.isdigit() else 1
    return [f"{n}:{slots}" for n in names]


def parse_hosts(hosts) -> list[str]:
    """'name:slots' entries from horovodrun's -H syntax ("node1:2,node2:2") or a list; a bare name is 1 slot.
    Bad entries raise ValueError naming `hosts` and what was expected."""
    entries = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    parsed = []
    for entry in entries:
        name, sep, slots = str(entry).strip().rpartition(":")
        if not sep:
            name, slots = slots, "1"
        if not name or not slots.isdigit() or int(slots) < 1 or any(c.isspace() for c in name):
            raise ValueError(f"hosts must be name:slots entries with slots >= 1 (e.g. node1:2,node2:2); "
                             f"got {entry!r}")
        parsed.append(f"{name}:{int(slots)}")
    if not parsed:
        raise ValueError("hosts must name at least one host, e.g. localhost:2")
    return parsed


def take_slots(hosts, np_: int) -> list[str]:
    """The first np_ slots of 'host:slots' entries.

    horovodrun's Gloo launcher starts a rank in EVERY slot it is given, whatever -np says, so np=1 inside
    a 2-task allocation must be handed 'node:1', not 'node:2'.
    """
    taken, left = [], np_
    for entry in parse_hosts(hosts):
        name, _, slots = entry.rpartition(":")
        n = min(int(slots), left)
        if n > 0:
            taken.append(f"{name}:{n}")
            left -= n
    if left > 0:
        raise ValueError(f"np={np_} needs more slots than the hosts offer ({','.join(parse_hosts(hosts))})")
    return taken


# Open MPI settings that made Horovod's exchange fastest where the workers share one machine's cores
# (labkit.scale.localscale.controller_cost, notebooks/results/controllers.json): a waiting MPI call gives its core
# away between polls instead of spinning on it, and Horovod's background thread looks for ready gradients
# every 0.1 ms instead of every 1 ms.
FAST_MPI_SETTINGS = {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.1"}


def _on_this_machine(hosts, env) -> bool:
    """True when every rank runs here: no hosts (and no Slurm allocation), or only this machine's names."""
    if hosts is None:
        return not slurm_hosts(env)
    import socket
    here = {"localhost", "127.0.0.1", socket.gethostname(), socket.gethostname().split(".")[0]}
    return all(entry.rpartition(":")[0] in here for entry in parse_hosts(hosts))


LAUNCHERS = ("auto", "gloo", "mpi", "srun")  # auto: choose_launcher's choice


def check_launcher(value, name: str = "launcher") -> str:
    """value, when it is one of LAUNCHERS; else ValueError naming `name`."""
    return check_choice(value, name, LAUNCHERS)


class LauncherChoice(NamedTuple):
    """choose_launcher's answer: the launcher a launch uses, the settings it adds to the ranks' environment,
    and one line saying which controller, with which settings, and how to choose another."""
    launcher: str
    settings: dict
    note: str


def choose_launcher(launcher="auto", hosts=None, env=None, env_extra=None) -> LauncherChoice:
    """(launcher, settings, note) of a launch: the one place that turns "auto" into a launcher. "auto" becomes
    "mpi" (mpirun) with FAST_MPI_SETTINGS, less any the caller set in env (default os.environ) or env_extra,
    where Horovod was built with MPI and every rank runs on this machine; else "gloo" (horovodrun), over the
    hosts or the Slurm allocation. An explicit launcher stays as given, with no settings; a LauncherChoice
    (made once for several launches) is returned as it is."""
    if isinstance(launcher, LauncherChoice):
        return launcher
    from labkit.scale import mpi
    check_launcher(launcher, "launcher")
    env = os.environ if env is None else env
    theirs = {**{k: env[k] for k in FAST_MPI_SETTINGS if k in env}, **(env_extra or {})}
    if launcher == "mpi":
        return LauncherChoice("mpi", {}, f"controller: MPI via mpirun ({mpi.describe()}), as chosen, with the "
                                         "settings you gave")
    if launcher in ("gloo", "srun"):
        how = "horovodrun --gloo" if launcher == "gloo" else "srun"
        return LauncherChoice(launcher, {}, f"controller: {'Gloo' if launcher == 'gloo' else 'MPI'} ({how}), as chosen")
    if not _on_this_machine(hosts, env):
        return LauncherChoice("gloo", {}, "controller: Gloo (horovodrun --gloo) over the hosts (the default "
                                          "across machines); for mpirun over the same hosts: --launcher mpi "
                                          "(launcher='mpi')")
    if not mpi.horovod_has_mpi():
        return LauncherChoice("gloo", {}, "controller: Gloo (horovodrun --gloo): Horovod here was built without "
                                          "MPI; `make setup` builds it with Open MPI from PyPI, whose tuned "
                                          "exchange is faster")
    settings = {k: v for k, v in FAST_MPI_SETTINGS.items() if k not in theirs}
    shown = " ".join(f"{k}={theirs.get(k, v)}{' (yours)' if k in theirs else ''}" for k, v in FAST_MPI_SETTINGS.items())
    return LauncherChoice("mpi", settings, f"controller: MPI via mpirun ({mpi.describe()}) with {shown}, the "
                                           "fastest measured on one machine, each of two or more workers on its "
                                           "own cores; for Gloo: --launcher gloo (launcher='gloo')")


def core_binding(np_: int, threads=None, hosts=None, env=None) -> list[str]:
    """mpirun's placement of np_ ranks of `threads` compute threads each on this machine.

    Two or more ranks that fit this Linux machine's cores (np_ x threads <= them) are each bound to their own
    `threads` cores (`--map-by slot:PE=threads --bind-to core`): Horovod's background thread then shares a
    core only with its own rank's compute, not with the other rank's (measured on 2 cores, small_cnn, one
    thread per rank, ratio of efficiencies with / without exchange: 0.81-1.24 bound in 6 rounds, 0.72-0.88
    unbound in 3; two workers ~13,000 images/s bound, ~11,000 unbound). One rank, more ranks than
    cores, other hosts, other systems, or threads not given: no binding (`--bind-to none --map-by slot`), so a
    lone rank's helper threads can use the free cores."""
    if threads is not None:
        check_int(threads, "threads", minimum=1)
    from labkit.base import machine
    env = os.environ if env is None else env
    if (threads and np_ >= 2 and np_ * threads <= machine.physical_cores() and sys.platform == "linux"
            and _on_this_machine(hosts, env)):
        return ["--map-by", f"slot:PE={threads}", "--bind-to", "core"]
    return ["--bind-to", "none", "--map-by", "slot"]


def local_transports(hosts=None, env=None) -> list[str]:
    """mpirun's transport options for a launch whose ranks all run on this machine: Open MPI's libfabric
    transport left out (`--mca btl ^ofi`). Its set-up sleeps 1 s in every rank's MPI_Init (Open MPI 5.0.11 from
    PyPI: MPI_Init 1.02 s with it, 0.02 s without) and carries nothing between ranks of one machine, which talk
    through shared memory. Ranks on other hosts (a cluster's fabric may be libfabric's), or transports the user
    chose (OMPI_MCA_btl), get no option."""
    env = os.environ if env is None else env
    if "OMPI_MCA_btl" in env or not _on_this_machine(hosts, env):
        return []
    return ["--mca", "btl", "^ofi"]


# the virtual cluster of scripts/vcluster.sh (07_scaling_deep_dive): its nodes are network namespaces
NODE_PREFIX = "labkit-node"


def launch_problem(hosts, netns_dir: Path = Path("/run/netns"), own_netns: str = "/proc/self/ns/net") -> str | None:
    """Why a launch over hosts cannot work from here, or None: hosts naming nodes of the virtual cluster
    (labkit-nodeK, up as network namespaces) reached from outside them. The nodes' names resolve on the host
    too, but Gloo's rendezvous server would listen where the nodes cannot reach it, so horovodrun would end
    in "HTTP request failed"; a launch must start on a node. Detected by comparing this process's network
    namespace with the nodes' (their files in netns_dir are bind mounts of the namespaces)."""
    names = [entry.rpartition(":")[0] for entry in parse_hosts(hosts)]
    nodes = [n for n in names if re.fullmatch(rf"{NODE_PREFIX}\d+", n) and (netns_dir / n).exists()]
    if not nodes:
        return None
    try:
        here = os.stat(own_netns)
        node_ns = {(st.st_dev, st.st_ino) for st in (os.stat(p) for p in netns_dir.glob(f"{NODE_PREFIX}*"))}
    except OSError:
        return None  # cannot tell: let the launch speak for itself
    if (here.st_dev, here.st_ino) in node_ns:
        return None
    return (f"{', '.join(nodes)} are nodes of the virtual cluster and this process runs on the host, outside "
            "them: Gloo's rendezvous would be unreachable from the nodes. Launch from a node: "
            f"scripts/vcluster.sh exec {nodes[0]} {sys.executable} -m labkit scale ...")
