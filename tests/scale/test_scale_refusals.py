"""`labkit scale` and localscale: outputs checked before the launch, impossible launches refused up front."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import ENV, fake_rank, labkit_cli, one_line, refused_on_a_full_disk, sha  # noqa: E402


def test_localscale_out_on_a_full_disk_is_refused_before_the_runs(tmp_path, monkeypatch, capsys):
    from labkit.scale import localscale
    monkeypatch.setattr(localscale, "controller_cost", lambda *a, **k: pytest.fail("ran before checking --out"))
    refused_on_a_full_disk(tmp_path, capsys, "controllers.json", "--out",
                           lambda target: localscale.main(["--out", str(target)]))


@pytest.fixture
def fake_ranks(monkeypatch):
    """scaling.run answers at once with two launches' summaries; the memory estimate is not asked for."""
    from labkit.scale import scaling

    def ranks(n):
        return [fake_rank(r, n, [10.0, 11.0], "abc", final_loss=2.0) for r in range(n)]

    def run(nps, **kw):
        import pandas as pd
        return scaling.efficiency(pd.DataFrame([scaling.summarize(ranks(n)) for n in nps]))

    monkeypatch.setattr(scaling, "run", run)
    monkeypatch.setattr(scaling, "check_memory", lambda *a, **k: None)


def test_scale_json_on_a_full_disk_is_refused_before_the_launch(tmp_path, capsys, monkeypatch):
    from labkit.scale import scaling
    monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("launched before checking --json"))
    monkeypatch.setattr(scaling, "check_memory", lambda *a, **k: None)

    def cli(target):  # scale's CLI refuses by SystemExit
        with pytest.raises(SystemExit) as e:
            scaling.cli_main(["--np", "1", "--json", str(target)])
        return e.value.code

    refused_on_a_full_disk(tmp_path, capsys, "scale.json", "--json", cli)


def test_scale_json_through_a_symlink_and_a_hard_link(tmp_path, fake_ranks):
    from labkit.scale import scaling
    shared = tmp_path / "share" / "scale.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps({"runs": []}) + "\n")  # an earlier labkit scale document (its own kind)
    link = tmp_path / "scale.json"
    link.symlink_to(shared)
    assert scaling.cli_main(["--np", "1,2", "--json", str(link), "--quiet"]) == 0
    assert link.is_symlink() and [r["np"] for r in json.loads(shared.read_text())["runs"]] == [1, 2]
    keep = tmp_path / "keep.json"
    os.link(shared, keep)
    before = sha(keep)
    assert scaling.cli_main(["--np", "1", "--json", str(shared), "--quiet"]) == 0
    assert sha(keep) == before and [r["np"] for r in json.loads(shared.read_text())["runs"]] == [1]

# ================================================================ scale: refused before any launch
# fake_launchers (tests/conftest.py): horovodrun and mpirun stand-ins that leave a marker when a launch reaches them


def test_more_ranks_than_cores_needs_oversubscribe(fake_launchers):
    from labkit.base import machine
    env, marker = fake_launchers
    many = str(max(64, machine.cores() + 1))
    t0 = time.perf_counter()
    line = one_line(labkit_cli("scale", "--np", many, env_extra=env), f"--np {many}", "--oversubscribe")
    assert str(machine.cores()) in line
    assert not marker.exists(), marker.read_text()
    assert time.perf_counter() - t0 < 60  # said at once, not after the 600 s timeout


def test_oversubscribe_lets_the_launch_go(monkeypatch, fake_ranks):
    from labkit.base import machine
    from labkit.scale import scaling
    monkeypatch.setattr(machine, "cores", lambda: 1)
    with pytest.raises(SystemExit):
        scaling.cli_main(["--np", "2", "--quiet"])
    assert scaling.cli_main(["--np", "2", "--quiet", "--oversubscribe"]) == 0


def test_a_batch_that_cannot_fit_in_memory_is_refused_with_the_estimate(fake_launchers):
    env, marker = fake_launchers
    line = one_line(labkit_cli("scale", "--np", "1", "--batch-size", "10000000", env_extra=env),
                    "--batch-size 10000000", "GiB available", "MB of activations per image")
    assert not marker.exists(), marker.read_text()
    fits = int(re.search(r"Use --batch-size (\d+) or less", line).group(1))
    assert 0 < fits < 10_000_000


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident set from /proc (Linux)")
def test_the_memory_estimate_is_below_what_training_really_takes():
    """Oracle: the resident memory a real training step of small_cnn adds, sampled while it runs, grows from batch 32
    to batch 1024 by at least labkit.flops' activation estimate for the extra images (the estimate is a floor, so
    no batch that could run is refused). Each batch in a fresh process, after two warm-up steps at batch 32: a
    process's high-water mark (ru_maxrss) would hide a step under TensorFlow's import peak."""
    from labkit.scale import scaling
    per_image, _ = scaling._child_bytes("small_cnn")
    code = textwrap.dedent("""
        import os, sys, threading, time
        import tensorflow as tf
        from labkit import models
        m = models.get("small_cnn", input_shape=(32, 32, 3), classes=10)
        opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
        loss = tf.keras.losses.SparseCategoricalCrossentropy()
        def step(n):
            x, y = tf.random.uniform((n, 32, 32, 3)), tf.zeros((n,), tf.int32)
            with tf.GradientTape() as tape:
                l = loss(y, m(x, training=True))
            opt.apply_gradients(zip(tape.gradient(l, m.trainable_variables), m.trainable_variables))
        rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        step(32); step(32)
        base, peak, done = rss(), [0], threading.Event()
        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.0005)
        sampler = threading.Thread(target=sample)
        sampler.start()
        step(int(sys.argv[1]))
        done.set()
        sampler.join()
        print(max(peak[0], rss()) - base)
    """)
    added = {}
    for batch in (32, 1024):
        out = subprocess.run([sys.executable, "-c", code, str(batch)], capture_output=True, text=True, env=ENV,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        added[batch] = int(out.stdout.split()[-1])
    grew = added[1024] - added[32]
    assert grew >= (1024 - 32) * per_image, (added, per_image)


def test_a_rank_killed_by_sigkill_is_said_to_be_out_of_memory(tmp_path, monkeypatch):
    """A launcher whose rank dies of SIGKILL (as the OOM killer does) the way Horovod's Gloo runner reports it."""
    from labkit.scale import launch
    exe = tmp_path / "horovodrun"
    exe.write_text("#!/bin/sh\nsh -c 'kill -9 $$'\necho 'Process 0 exit with status code 137.'\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("LABKIT_HOROVODRUN", str(exe))
    with pytest.raises(launch.HorovodRunError) as err:
        launch.launch(1, [], progress=False, timeout=60, launcher="gloo")  # the fake is horovodrun
    text = str(err.value)
    assert "out-of-memory" in text and "SIGKILL" in text and "--batch-size" in text
    assert "(no stderr)" not in text


def _netns(path: Path):
    """A persistent network namespace bind-mounted at path (as `ip netns add` makes /run/netns/NAME)."""
    path.touch()
    done = subprocess.run(["unshare", f"--net={path}", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {done.stderr.strip()}")


def test_vcluster_hosts_from_the_host_are_refused_and_allowed_from_a_node(tmp_path, monkeypatch, capsys):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    from labkit.scale import launch, scaling
    netns = tmp_path / "netns"
    netns.mkdir()
    node = netns / "labkit-node1"
    _netns(node)
    try:
        problem = launch.launch_problem("labkit-node1:1,labkit-node2:1", netns_dir=netns)
        assert problem and "scripts/vcluster.sh exec labkit-node1" in problem
        inside = subprocess.run(
            ["nsenter", f"--net={node}", sys.executable, "-c",
             ("import sys; from pathlib import Path; from labkit.scale import launch; "
              "print(launch.launch_problem('labkit-node1:1', netns_dir=Path(sys.argv[1])))"), str(netns)],
            capture_output=True, text=True, env=ENV, timeout=120)
        assert inside.returncode == 0 and inside.stdout.strip() == "None", inside.stderr
        assert launch.launch_problem("otherhost:1", netns_dir=netns) is None
        real = launch.launch_problem
        monkeypatch.setattr(scaling, "launch_problem", lambda hosts: real(hosts, netns_dir=netns))
        monkeypatch.setattr(scaling, "run", lambda *a, **k: pytest.fail("launched from the host"))
        with pytest.raises(SystemExit) as e:
            scaling.cli_main(["--np", "2", "--hosts", "labkit-node1:1,labkit-node2:1"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "vcluster.sh exec labkit-node1" in err
    finally:
        subprocess.run(["umount", str(node)], check=False)


def test_the_memory_check_reads_labkit_memory(monkeypatch):
    """LABKIT_MEMORY (machine.memory_available) decides, not psutil's view of this machine."""
    from labkit.scale import scaling
    monkeypatch.setattr(scaling, "_child_bytes", lambda model: (10**6, 10**8))  # 1 MB per image, 100 MB state
    monkeypatch.setenv("LABKIT_MEMORY", "1G")
    with pytest.raises(ValueError, match=r"--batch-size 4096 cannot fit.*1\.00 GiB available\. Use --batch-size 973"):
        scaling.check_memory("small_cnn", 4096, 1)
    monkeypatch.setenv("LABKIT_MEMORY", "64G")
    scaling.check_memory("small_cnn", 4096, 2)
