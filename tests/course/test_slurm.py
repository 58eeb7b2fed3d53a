"""hpc/ templates on a real single-node Slurm: munged, slurmctld and slurmd started here on loopback.

No systemd and nothing outside a temporary directory: the daemons get their own key, socket, ports,
state and logs, and are stopped by PID at the end. Skips, naming what is missing, where Slurm is not installed;
fails, naming the daemon and the tail of its log, where it is installed but does not start.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import failure, fake_executable, free_port, log_tail

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

VENV = str(Path(sys.executable).parent.parent)  # the jobs use the environment running the tests
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
COMMANDS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel"]

SLURM_TEMPLATE = ROOT / "scripts" / "slurm.conf.in"  # shared with scripts/vcluster.sh


def slurm_conf(d: Path, user: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    """scripts/slurm.conf.in filled in for one node, localhost, on loopback."""
    fields = {"CLUSTER": "labkit", "CTLD_HOST": "localhost", "CTLD_PORT": ctld_port, "SLURMD_PORT": slurmd_port,
              "USER": user, "DIR": d}
    text = re.sub(r"@([A-Z_]+)@", lambda m: str(fields[m[1]]), SLURM_TEMPLATE.read_text())
    return text + (f"NodeName=localhost CPUs={cpus} State=UNKNOWN\n"
                   "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n")


class LoopbackSlurm:
    """A one-node Slurm cluster in directory d; .env is the environment its clients need."""

    def __init__(self, d: Path, path: str = SBIN_PATH):
        self.d, self.procs = d, []
        self.env = dict(os.environ, PATH=path, SLURM_CONF=str(d / "etc/slurm.conf"))

    def log_tail(self, lines=15) -> str:
        out = []
        # *.stdout: what a daemon printed before its log file opened (a configuration it cannot parse)
        for log in sorted((self.d / "log").glob("*.log")) + sorted((self.d / "log").glob("*.stdout")) + [
                self.d / "munge/munged.log"]:
            if log.exists():
                out.append(f"--- {log.name}\n" + log_tail(log, lines))
        return "\n".join(out)

    def run(self, *cmd, check=True, timeout=30, env=None):
        res = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {res.returncode}: {res.stderr.strip()}")
        return res.stdout.strip()

    def _daemon(self, *cmd):
        log = open(self.d / "log" / f"{Path(cmd[0]).name}.stdout", "w")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait(self, what, ready, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {what}")
            try:
                if ready():
                    return
            except (subprocess.SubprocessError, RuntimeError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}")

    def start(self):
        d = self.d
        for sub in ("munge", "state", "spool", "run", "log", "etc"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)  # munged refuses group/world-writable directories on its paths
        os.chmod(d / "munge", 0o755)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        (d / "etc/slurm.conf").write_text(slurm_conf(d, user, os.cpu_count() or 1, free_port(), free_port()))
        key = d / "munge/munge.key"
        self.run("mungekey", "--create", f"--keyfile={key}")
        self._daemon("munged", "--foreground", f"--key-file={key}", f"--socket={d}/munge/munge.sock",
                     f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                     f"--seed-file={d}/munge/munged.seed")
        self._wait("munged's socket", lambda: (d / "munge/munge.sock").exists(), 10)
        self._daemon("slurmctld", "-D")
        self._wait("slurmctld (scontrol ping)", lambda: "UP" in self.run("scontrol", "ping", check=False), 20)
        self._daemon("slurmd", "-D", "-N", "localhost")
        self._wait("the node to be idle", lambda: self.run("sinfo", "-h", "-N", "-o", "%T") == "idle", 30)

    def submit(self, script: str, *options, log: Path, **env) -> tuple[str, Path]:
        """sbatch an hpc/ template from the repository root with extra environment; (job id, its log file)."""
        job_id = self.run("sbatch", "--parsable", f"--output={log}", f"--chdir={ROOT}", *options,
                          str(ROOT / script), env=dict(self.env, **env))
        return job_id, Path(str(log).replace("%j", job_id))

    def job_fields(self, job_id: str) -> dict:
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o", job_id, check=False)))

    def job_state(self, job_id: str) -> str:
        return self.job_fields(job_id).get("JobState", "")

    def wait_job(self, job_id: str, timeout: float) -> dict:
        """Poll until the job ends; returns scontrol's fields (JobState, ExitCode, ...)."""
        deadline = time.time() + timeout
        while True:
            fields = self.job_fields(job_id)
            state = fields.get("JobState", "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "REQUEUED"):
                return fields
            if time.time() > deadline:
                self.run("scancel", job_id, check=False)
                raise AssertionError(f"job {job_id} still {state or '?'} after {timeout} s\n{self.log_tail()}")
            time.sleep(0.3)

    def wait_for_lab(self, job_id: str, log: Path, token: str, line: str, timeout: float = 90):
        """Poll a jupyter.sbatch job's output until `line` (a regex whose group 1 is the tunnel's port) appears
        and JupyterLab answers /api/status there with the token, or the job ends; (status, output, match)."""
        deadline, status, text, match = time.time() + timeout, None, "", None
        while time.time() < deadline and status != 200:
            text = log.read_text(errors="replace") if log.exists() else ""
            match = re.search(line, text)
            if match:
                req = urllib.request.Request(f"http://127.0.0.1:{match[1]}/api/status",
                                             headers={"Authorization": f"token {token}"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as resp:
                        status = resp.status
                except (urllib.error.URLError, OSError):
                    pass
            if status != 200 and self.job_state(job_id) not in ("PENDING", "CONFIGURING", "RUNNING"):
                break
            time.sleep(0.5)
        return status, text, match

    def stop(self):
        for proc in reversed(self.procs):  # slurmd, slurmctld, munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start_slurm(d: Path, path: str = SBIN_PATH) -> LoopbackSlurm:
    """A started LoopbackSlurm in d. Skips where a Slurm or MUNGE command is not installed on path; where all
    are, a daemon that does not start is a failure (a broken slurm.conf.in must not read as a skip)."""
    missing = [c for c in COMMANDS if shutil.which(c, path=path) is None]
    if missing:
        pytest.skip(f"Slurm is not installed: {', '.join(missing)} not found "
                    "(scripts/system-deps.sh installs slurmctld slurmd slurm-client munge as root)")
    cluster = LoopbackSlurm(d, path)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        cluster.stop()
        pytest.fail(f"Slurm is installed but did not start: {err}\n{cluster.log_tail()}", pytrace=False)
    return cluster


@pytest.fixture(scope="module")
def slurm():
    # a short path: munged's socket path must fit a sockaddr_un (108 bytes)
    d = Path(tempfile.mkdtemp(prefix="labkit-slurm-"))
    cluster = None
    try:
        cluster = start_slurm(d)
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(d, ignore_errors=True)


# --- starting: absent is a skip, installed but broken is a failure -----------------------------------------


def fake_commands(folder: Path, failing: str = "", message: str = "") -> str:
    """folder holding a stand-in for every Slurm and MUNGE command (each exits 0, silent), except `failing`,
    which prints message and exits 1; returns folder as a PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        if name == failing:
            fake_executable(folder / name, message)
        else:
            (folder / name).write_text("#!/bin/sh\nexit 0\n")
            (folder / name).chmod(0o755)
    return str(folder)


def test_absent_slurm_is_a_skip_that_names_what_is_missing(tmp_path):
    path = fake_commands(tmp_path / "bin")
    os.remove(tmp_path / "bin" / "slurmd")
    with pytest.raises(pytest.skip.Exception, match="not installed: slurmd not found"):
        start_slurm(tmp_path / "cluster", path)


def test_a_daemon_that_exits_is_a_failure_with_its_log(tmp_path):
    path = fake_commands(tmp_path / "bin", failing="munged", message="munged: Error: Failed to check keyfile here")
    text = failure(start_slurm, tmp_path / "cluster", path)
    assert text.startswith("Slurm is installed but did not start: munged exited with 1"), text
    assert "Failed to check keyfile here" in text, f"the daemon's own words are missing:\n{text}"


def test_a_broken_slurm_conf_is_a_failure_not_a_skip(monkeypatch, tmp_path):
    """The real daemons on a template with a key Slurm does not know: slurmctld refuses it, and that fails."""
    if any(shutil.which(c, path=SBIN_PATH) is None for c in COMMANDS):
        pytest.skip("Slurm is not installed")
    template = tmp_path / "slurm.conf.in"
    template.write_text(SLURM_TEMPLATE.read_text() + "NoSuchSlurmKey=1\n")
    monkeypatch.setattr(sys.modules[__name__], "SLURM_TEMPLATE", template)
    broken = Path(tempfile.mkdtemp(prefix="labkit-slurm-"))  # short: munged's socket path
    try:
        text = failure(start_slurm, broken)
        assert "did not start: slurmctld" in text, text
        assert "NoSuchSlurmKey" in text, f"the log's tail does not show the bad line:\n{text}"
    finally:
        shutil.rmtree(broken, ignore_errors=True)


def test_single_node_template_runs_labkit_scale_with_two_tasks(slurm, tmp_path):
    """Template (a) on CPU with 2 tasks: labkit scale at 1 and 2 ranks, ranks in sync."""
    results = tmp_path / "scale.json"
    job_id, log = slurm.submit("hpc/single_node.sbatch", "--ntasks=2", "--gres=none", log=tmp_path / "job-%j.out",
                               LABKIT_VENV=VENV, LABKIT_RESULTS=str(results), LABKIT_PROFILE="quick",
                               LABKIT_STEPS="5", LABKIT_SCALE_ARGS="--repeats 2 --warmup-steps 2")
    fields = slurm.wait_job(job_id, timeout=240)
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", \
        f"job {job_id}: {fields.get('JobState')} exit {fields.get('ExitCode')}\n{text}\n{slurm.log_tail()}"
    assert fields["NumTasks"] == "2", fields
    data = json.loads(results.read_text())
    runs = {run["np"]: run for run in data["runs"]}
    assert sorted(runs) == [1, 2], f"expected np 1 and 2 from 2 Slurm tasks, got {sorted(runs)}"
    assert runs[1]["efficiency"] == pytest.approx(1.0)
    for np_, run in runs.items():
        assert len(run["checksums"]) == np_
        assert run["images_per_sec"] > 0
    # data parallelism keeps the two ranks' weights identical
    assert runs[2]["checksums"][0] == runs[2]["checksums"][1]
    assert "results in " + str(results) in text


def test_jupyter_template_serves_lab_and_prints_the_tunnel(slurm, tmp_path, isolated_home):
    """Template (c): JupyterLab answers on the port named in the printed `ssh -L` line, with the token."""
    token = "labkit-slurm-" + os.urandom(8).hex()
    home = {k: v for k, v in os.environ.items() if k.startswith(("JUPYTER_", "IPYTHON")) or k == "HOME"}
    job_id, log = slurm.submit("hpc/jupyter.sbatch", "--gres=none", "--cpus-per-task=1", log=tmp_path / "lab-%j.out",
                               JUPYTER_TOKEN=token, LABKIT_VENV=VENV, LABKIT_LOGIN_HOST="login.example.org",
                               USER="student", **home)
    try:
        status, text, match = slurm.wait_for_lab(
            job_id, log, token, r"ssh -N -L (\d+):127\.0\.0\.1:(\d+) -J student@login\.example\.org student@(\S+)")
        assert match, f"no ssh -L line in the job output:\n{text}\n{slurm.log_tail()}"
        assert match[1] == match[2]
        assert match[3] == socket.gethostname().split(".")[0]
        assert f"http://127.0.0.1:{match[1]}/lab?token={token}" in text
        assert status == 200, f"JupyterLab did not answer on port {match[1]}:\n{text}"
    finally:
        slurm.run("scancel", job_id, check=False)
    fields = slurm.wait_job(job_id, timeout=30)
    assert fields["JobState"] == "CANCELLED", fields


def test_multi_node_template_launches_horovod_over_the_allocation(slurm, tmp_path):
    """Template (b) on one node x 2 tasks: horovodrun gets its hosts from Slurm; ranks end in sync."""
    out = tmp_path / "hvd"
    job_id, log = slurm.submit("hpc/multi_node.sbatch", "--nodes=1", "--ntasks-per-node=2", "--gres=none",
                               log=tmp_path / "job-%j.out", LABKIT_VENV=VENV, LABKIT_RESULTS=str(out),
                               LABKIT_STEPS="3", LABKIT_PROFILE="quick")
    fields = slurm.wait_job(job_id, timeout=180)
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED", f"{fields.get('JobState')} {fields.get('ExitCode')}\n{text}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    total = ranks[0]["images_per_sec"] + ranks[1]["images_per_sec"]
    assert f"{total:.1f} images/s in total" in text
    assert "2 ranks on 1 node(s)" in text and "all ranks hold the same weights" in text


def test_resumable_template_finishes_one_run_over_two_allocations(slurm, tmp_path):
    """hpc/resumable.sbatch: SIGUSR1 to the batch script (what --signal=B:USR1@N sends N s before the limit; sent
    here with scancel once the first checkpoint is on disk, so a loaded machine cannot starve the first
    allocation), the workers checkpoint, the job requeues itself and resumes; the run ends over 2+ allocations
    with the checksum of the same run never stopped."""
    from labkit.scale import checkpoint, scaling
    ckpt, results = tmp_path / "ckpt", tmp_path / "resumable.json"
    run = dict(batch_size=8, steps=500, repeats=1, warmup_steps=2, threads=1)
    job_id, log = slurm.submit("hpc/resumable.sbatch", "--ntasks=2", "--gres=none", "--time=10",
                               log=tmp_path / "job-%j.out", LABKIT_VENV=VENV,
                               LABKIT_CHECKPOINT=str(ckpt), LABKIT_RESULTS=str(results), LABKIT_PROFILE="quick",
                               LABKIT_CHECKPOINT_EVERY="100", LABKIT_SCALE_ARGS=" ".join(
                                   f"--{k.replace('_', '-')} {v}" for k, v in run.items()) + " --launcher gloo")
    deadline = time.time() + 300
    while (checkpoint.read_meta(ckpt) or {}).get("step", 0) < 100:
        assert time.time() < deadline and slurm.job_state(job_id) in ("PENDING", "CONFIGURING", "RUNNING"), \
            f"no checkpoint from the first allocation\n{log.read_text(errors='replace') if log.exists() else ''}"
        time.sleep(0.3)
    slurm.run("scancel", "--batch", "--signal=USR1", job_id)
    fields = slurm.wait_job(job_id, timeout=600)
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert fields["JobState"] == "COMPLETED", f"{fields.get('JobState')} {fields.get('ExitCode')}\n{text}"
    allocations = re.findall(r"allocation (\d+), checkpoint: (\w+)", text)
    assert len(allocations) >= 2 and allocations[0] == ("1", "none"), f"one allocation only:\n{text}"
    assert allocations[1] == ("2", "stopped") and "requeueing job" in text and checkpoint.status(ckpt) == "done"
    resumed = json.loads(results.read_text())
    whole = scaling.run(2, progress=False, timeout=600, checkpoint=str(tmp_path / "whole"), launcher="gloo", **run)
    assert resumed["runs"][0]["checksums"] == list(whole["checksums"].iloc[0]), text
