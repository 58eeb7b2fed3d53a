"""The suite's fork server (tests/bin/forkserver.py): a rank forked from it is the process Python would have started,
its end is the client's end, and it starts as Python would wherever a fork could not give the same process."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT

BIN = ROOT / "tests" / "bin"
SCRIPT = """\
import json, os, sys, tempfile
facts = {"preloaded": "tensorflow" in sys.modules, "argv": sys.argv, "cwd": os.getcwd(), "name": __name__,
         "foo": os.environ.get("LK_FOO"), "cpus": sorted(os.sched_getaffinity(0)), "umask": os.umask(0),
         "tmp": tempfile.gettempdir(), "path0": sys.path[0]}
print(json.dumps(facts))
print("to stderr", file=sys.stderr)
if os.environ.get("LK_SLEEP"):
    import time
    print(os.getpid(), flush=True)
    time.sleep(float(os.environ["LK_SLEEP"]))
sys.exit(int(os.environ.get("LK_CODE", "0")))
"""

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs where the suite runs: Linux")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The suite's server when it runs one, else one of this module's own."""
    path = os.environ.get("LABKIT_SUITE_FORKSERVER")
    own = None
    if not path:
        path = str(tmp_path_factory.mktemp("fs") / "socket")
        own = subprocess.Popen([sys.executable, str(BIN / "forkserver.py"), "serve", path], start_new_session=True,
                               stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})  # as conftest's
    deadline = time.monotonic() + 120
    while not os.path.exists(path + ".id"):
        assert time.monotonic() < deadline, "the fork server did not start within 120 s"
        time.sleep(0.2)
    yield path
    if own is not None:
        own.terminate()
        own.wait()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(SCRIPT)
    return path


def _start(server, args, env_extra=None, cwd=None, through=True, **kw):
    env = {**os.environ, "LABKIT_SUITE_FORKSERVER": server}
    env.pop("PYTHONHASHSEED", None)  # a test of this process may have set one (labkit.base.config.set_seed)
    env.update(env_extra or {})
    if not through:
        env.pop("LABKIT_SUITE_FORKSERVER")
    cmd = [sys.executable, "-I", "-S", str(BIN / "forkserver.py"), "run", sys.executable, *args]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _facts(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return json.loads(out.splitlines()[0]), err, proc.returncode


def test_a_forked_rank_is_the_process_python_would_start(server, script, tmp_path):
    """Same arguments, directory, environment, CPUs, umask, temporary folder, streams and exit code; only the
    server's child has TensorFlow imported when its script begins."""
    runs = {}
    for through in (True, False):
        proc = _start(server, [str(script), "a", "b c"], {"LK_FOO": "bar", "LK_CODE": "3", "TMPDIR": str(tmp_path)},
                      cwd=tmp_path, through=through, preexec_fn=lambda: (os.sched_setaffinity(0, {0}), os.umask(0o27)))
        runs[through] = _facts(proc)
    (forked, err, code), (direct, err2, code2) = runs[True], runs[False]
    assert forked.pop("preloaded") and not direct.pop("preloaded")
    assert forked == direct and forked["foo"] == "bar" and forked["cpus"] == [0] and forked["umask"] == 0o27
    assert forked["tmp"] == str(tmp_path) and forked["argv"] == [str(script), "a", "b c"]
    assert err == err2 == "to stderr\n" and code == code2 == 3


def test_a_module_runs_as_python_m_does(server, tmp_path):
    (tmp_path / "lkmod.py").write_text(SCRIPT)
    forked, _, _ = _facts(_start(server, ["-m", "lkmod", "x"], cwd=tmp_path))
    direct, _, _ = _facts(_start(server, ["-m", "lkmod", "x"], cwd=tmp_path, through=False))
    assert forked.pop("preloaded") and not direct.pop("preloaded")
    assert forked == direct and forked["name"] == "__main__" and forked["path0"] == str(tmp_path)


def test_a_forked_rank_collects_its_own_cycles_and_not_the_servers_objects(server, tmp_path):
    """The server froze what its preloads made (gc.freeze): the child's collector skips those and still frees the
    reference cycles the child makes, as Python's would."""
    (tmp_path / "cycles.py").write_text(
        "import gc, json, weakref\n"
        "class Node:\n    pass\n"
        "a, b = Node(), Node()\na.other, b.other = b, a\ngone = weakref.ref(a)\ndel a, b\n"
        "found = gc.collect()\n"
        "print(json.dumps({'frozen': gc.get_freeze_count(), 'found': found, 'freed': gone() is None}))\n")
    forked, _, code = _facts(_start(server, [str(tmp_path / "cycles.py")], cwd=tmp_path))
    direct, _, _ = _facts(_start(server, [str(tmp_path / "cycles.py")], cwd=tmp_path, through=False))
    assert code == 0 and forked["freed"] and direct["freed"] and forked["found"] >= 2
    assert forked["frozen"] > 100_000 and direct["frozen"] == 0  # TensorFlow's objects, frozen in the server


def _child_pid(proc) -> int:
    """The pid of the process that runs the script, once it runs, which must be the server's child."""
    assert json.loads(proc.stdout.readline())["preloaded"], "the script did not start from the server"
    return int(proc.stdout.readline())


def test_signals_reach_the_child_and_its_end_is_the_clients(server, script):
    """SIGTERM to the client ends the child by SIGTERM; a child killed (the out-of-memory killer's SIGKILL) is
    a client killed; Ctrl-C ends both as Python ends on an uncaught KeyboardInterrupt."""
    for sig, expected in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)):
        proc = _start(server, [str(script)], {"LK_SLEEP": "60"})
        child = _child_pid(proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == expected and not os.path.exists(f"/proc/{child}")
        assert (sig != signal.SIGINT) or "KeyboardInterrupt" in err
    proc = _start(server, [str(script)], {"LK_SLEEP": "60"})
    os.kill(_child_pid(proc), signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_client_killed_takes_its_child_with_it(server, script):
    proc = _start(server, [str(script)], {"LK_SLEEP": "60"})
    child = _child_pid(proc)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")


def test_a_setting_read_at_import_starts_the_rank_as_python_does(server, script):
    facts, _, code = _facts(_start(server, [str(script)], {"TF_ENABLE_ONEDNN_OPTS": "1"}))
    assert not facts["preloaded"] and code == 0


@pytest.mark.parametrize("seed,forked", [("0", True), ("random", True), ("7", False)])
def test_a_hash_seed_of_its_own_starts_the_rank_as_python_does(server, script, seed, forked):
    """The server's hash seed is set_seed(0)'s, which the notebooks' kernels hand their ranks; a rank without one
    may draw any, so it has the server's; another seed cannot be had after start-up."""
    facts, _, _ = _facts(_start(server, [str(script)], {"PYTHONHASHSEED": seed}))
    assert facts["preloaded"] is forked


def test_a_pythonpath_is_the_childs_unless_it_offers_a_module_the_server_holds(server, script, tmp_path):
    """Its folders go where Python puts them and its sitecustomize runs, as at a start-up; a folder with its own
    numpy (imported by the server already) makes the rank start as Python does."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['LK_FOO'] = 'from sitecustomize'\n")
    for through in (True, False):
        facts, err, code = _facts(_start(server, [str(script)], {"PYTHONPATH": str(site)}, through=through))
        assert facts.pop("preloaded") is through and facts["foo"] == "from sitecustomize" and code == 0
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "numpy.py").write_text("")
    facts, _, _ = _facts(_start(server, [str(script)], {"PYTHONPATH": f"{site}{os.pathsep}{shadow}"}))
    assert not facts["preloaded"]
    beside = shadow / "rank.py"  # a script whose own folder (sys.path[0]) offers numpy
    beside.write_text(SCRIPT)
    facts, _, _ = _facts(_start(server, [str(beside)]))
    assert not facts["preloaded"]


def test_python_options_and_a_missing_server_start_the_rank_as_python_does(server, script, tmp_path):
    facts, _, _ = _facts(_start(server, ["-u", str(script)]))
    assert not facts["preloaded"]
    facts, _, _ = _facts(_start(str(tmp_path / "no-server"), [str(script)]))
    assert not facts["preloaded"]


def test_a_launch_starts_its_ranks_with_labkit_rank_python(monkeypatch):
    """labkit.scale.launch.rank_python: $LABKIT_RANK_PYTHON split as a shell splits it (how the suite's ranks reach
    the server), this Python without it, one line naming the variable for a command that cannot start."""
    from labkit.scale import launch
    monkeypatch.setenv("LABKIT_RANK_PYTHON", f"{sys.executable} -I -S '{BIN / 'forkserver.py'}' run {sys.executable}")
    cmd = launch.build_command(2, ["--steps", "2"], launcher="gloo")
    assert cmd[-10:] == [sys.executable, "-I", "-S", str(BIN / "forkserver.py"), "run", sys.executable,
                         "-m", "labkit.scale.hvd_train", "--steps", "2"]
    monkeypatch.setenv("LABKIT_RANK_PYTHON", "no-such-python3 -u")
    with pytest.raises(ValueError, match=r"^LABKIT_RANK_PYTHON: expected a command that starts Python.*"
                                         r"'no-such-python3' not found"):
        launch.build_command(2, launcher="gloo")
    monkeypatch.delenv("LABKIT_RANK_PYTHON")
    assert launch.build_command(2, ["--steps", "2"], launcher="gloo")[-5:] == [
        sys.executable, "-m", "labkit.scale.hvd_train", "--steps", "2"]


def test_the_suites_notebook_kernel_starts_from_it_and_is_interrupted_as_a_kernel_is(server):
    """Where the suite runs the server, its labkit kernel (JUPYTER_PATH) has TensorFlow before its first cell, and a
    Ctrl-C from Jupyter (the kernel's interrupt) stops a running cell, as in a kernel started by Python."""
    if not os.environ.get("LABKIT_SUITE_FORKSERVER"):
        pytest.skip("the suite runs no fork server here (LABKIT_SUITE_FORKSERVER=0, or no suite horovodrun)")
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name="labkit")
    try:
        assert str(BIN / "forkserver.py") in km.kernel_spec.argv
        outputs = []
        kc.execute_interactive("import sys; print('tensorflow' in sys.modules)", timeout=60,
                               output_hook=lambda msg: outputs.append(msg["content"].get("text", "")))
        assert "".join(outputs).strip() == "True"
        msg_id = kc.execute("import time; time.sleep(60)")
        time.sleep(1)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
