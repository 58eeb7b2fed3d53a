import numpy as np
import pytest

from labkit.base import config


def test_default_profile_is_workshop(monkeypatch):
    monkeypatch.delenv("LABKIT_PROFILE", raising=False)
    assert config.profile() == "workshop"


@pytest.mark.parametrize("name", ["quick", "workshop", "full"])
def test_valid_profiles(monkeypatch, name):
    monkeypatch.setenv("LABKIT_PROFILE", name)
    assert config.profile() == name
    assert config.by_profile(quick=1, workshop=2, full=3) == {"quick": 1, "workshop": 2, "full": 3}[name]


@pytest.mark.parametrize("bad", ["fast", "QUICK", "ful"])
def test_unknown_profile_lists_valid_ones(monkeypatch, bad):
    monkeypatch.setenv("LABKIT_PROFILE", bad)
    with pytest.raises(ValueError) as err:
        config.profile()
    msg = str(err.value)
    assert "LABKIT_PROFILE" in msg and repr(bad) in msg
    assert all(p in msg for p in ("quick", "workshop", "full"))


def test_data_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    assert config.data_dir() == tmp_path
    monkeypatch.delenv("LABKIT_DATA")
    assert config.data_dir().name == "data"


def test_set_seed_repeats_numpy_and_tensorflow():
    import tensorflow as tf

    def draw():
        config.set_seed(7)
        return np.random.rand(3), tf.random.uniform((3,)).numpy()

    (a_np, a_tf), (b_np, b_tf) = draw(), draw()
    np.testing.assert_array_equal(a_np, b_np)
    np.testing.assert_array_equal(a_tf, b_tf)
    config.set_seed(8)
    assert not np.array_equal(np.random.rand(3), a_np)


@pytest.mark.parametrize("bad", [-1, 1.5, "42", True])
def test_set_seed_rejects_bad_seed(bad):
    with pytest.raises(ValueError, match="seed"):
        config.set_seed(bad)


def test_scratch_dir_is_private_and_removed_when_the_process_exits(tmp_path):
    import subprocess
    import sys
    code = ("from labkit.base import config; p = config.scratch_dir('labkit-test-'); (p / 'x').write_text('1'); "
            "import os, stat; print(p, oct(stat.S_IMODE(os.stat(p).st_mode)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "TMPDIR": str(tmp_path)}).stdout.split()
    path, mode = out[-2], out[-1]
    assert path.startswith(str(tmp_path)) and mode == "0o700"
    assert not __import__("os").path.exists(path), "the folder outlived its process"


def test_a_killed_kernels_scratch_dir_is_removed_by_the_next_one(tmp_path):
    """A kernel killed outright (nbval stops kernels with SIGKILL) runs no exit handler; the next scratch_dir
    with that prefix removes the orphan, and leaves a live process's folder and folders it did not make."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", "import os; from labkit.base import config; "
                             "p = config.scratch_dir('labkit-test-'); print(p); os._exit(9)"],
                            capture_output=True, text=True, env=env).stdout.split()[-1]
    assert os.path.isdir(killed)
    foreign = tmp_path / "labkit-test-foreign"  # no owner file: not made by scratch_dir
    foreign.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import sys, time; from labkit.base import config; "
                              "print(config.scratch_dir('labkit-test-'), flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        alive_dir = alive.stdout.readline().strip()
        assert not os.path.exists(killed), "the killed kernel's folder was left behind"
        subprocess.run([sys.executable, "-c", "from labkit.base import config; config.scratch_dir('labkit-test-')"],
                       check=True, env=env)
        assert os.path.isdir(alive_dir) and foreign.is_dir()
    finally:
        alive.kill()
        alive.wait()


def _holder(env, prefix="labkit-test-", before=""):
    """A process that makes a scratch folder with a results file in it, prints the folder and waits."""
    import subprocess
    import sys
    code = (f"import time; {before}from labkit.base import config; p = config.scratch_dir({prefix!r}); "
            "(p / 'sweep.jsonl').write_text('{}'); print(p, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    return proc, proc.stdout.readline().strip()


def test_a_kernel_stopped_by_sigterm_leaves_no_scratch_folder(tmp_path):
    """jupyter_client stops a kernel with SIGTERM, which skips exit handlers: the folder (05's sweep.jsonl in it)
    goes at once, and the process still ends by the signal, as it did."""
    import os
    import signal
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc, path = _holder(env)
    assert os.path.isfile(os.path.join(path, "sweep.jsonl"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert not os.path.exists(path), "a SIGTERM'd kernel's scratch folder was left behind"


def test_scratch_dir_on_sigterm_keeps_a_handler_that_was_there(tmp_path):
    """A process with its own SIGTERM handler keeps it: the folder goes, then that handler runs (exit 3 here)."""
    import os
    import signal
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    before = "import os, signal; signal.signal(signal.SIGTERM, lambda s, f: os._exit(3)); "
    proc, path = _holder(env, before=before)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 3 and not os.path.exists(path)


def test_any_notebooks_next_scratch_dir_sweeps_a_killed_kernels_folder(tmp_path):
    """A kernel killed outright (SIGKILL: no handler runs) leaves its folder; the next scratch_dir call of another
    notebook (another labkit- prefix) removes it, so it is not left until that notebook runs again."""
    import os
    import signal
    import subprocess
    import sys
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc, path = _holder(env, prefix="labkit-05-")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.isdir(path)
    subprocess.run([sys.executable, "-c", "from labkit.base import config; config.scratch_dir('labkit-01-')"],
                   check=True, env=env)
    assert not os.path.exists(path), "another notebook's scratch_dir left the killed kernel's folder"


def test_scratch_dir_refuses_a_path_as_prefix():
    import pytest

    from labkit.base import config
    with pytest.raises(ValueError, match="prefix"):
        config.scratch_dir("../x")


@pytest.mark.slow
def test_set_seed_gives_the_same_initial_weights_in_every_process():
    """Keras 2 seeds an unseeded initializer from Python's random: tf.random.set_seed alone gives new weights
    in every process (04's learning-rate runs started from different weights each time before this)."""
    import subprocess
    import sys
    prog = ("import labkit, sys\nfrom labkit import models\nfrom labkit.base import config, rankstats\n"
            "config.set_seed(3) if sys.argv[1] == 'all' else __import__('tensorflow').random.set_seed(3)\n"
            "m = models.get('small_cnn', input_shape=(32, 32, 3), classes=10)\n"
            "print(rankstats.weights_checksum([v.numpy() for v in m.trainable_weights]))")
    def weights(how):
        return subprocess.run([sys.executable, "-c", prog, how], capture_output=True, text=True, timeout=120,
                              check=True).stdout.split()[-1]
    assert weights("all") == weights("all")
    assert weights("tf_only") != weights("tf_only")  # the trap itself, so the test notices if Keras changes


def test_describe_shows_the_load_average_and_the_cores():
    import os
    import re
    before = os.getloadavg()[0]
    text = config.describe()
    after = os.getloadavg()[0]
    found = re.search(r"^load average (\d+\.\d\d) \(1 min\) on (\d+) cores$", text, re.M)
    assert found, text
    assert min(before, after) - 0.005 <= float(found[1]) <= max(before, after) + 0.005
    assert 1 <= int(found[2]) <= len(os.sched_getaffinity(0))


def test_describe_shows_the_data_folder_under_home_as_tilde(monkeypatch, tmp_path):
    from pathlib import Path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    assert "data_dir=~/.labkit/data (LABKIT_DATA)" in config.describe() and str(tmp_path) not in config.describe()
    assert config.shown_path(tmp_path / "x" / "y") == str(Path("~", "x", "y"))
    assert config.shown_path("/srv/shared/data") == "/srv/shared/data"  # a site folder outside home stays as it is
