"""labkit.base.machine: usable cores (affinity and cgroup quota), thread limits, BLAS, TensorFlow's oneDNN switch."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import labkit  # noqa: F401
from labkit.base import machine


def _run(code: str, **env) -> str:
    full = dict(os.environ)
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_cores_is_the_affinity_mask_capped_by_the_cgroup_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    assert 1 <= machine.cores() <= affinity
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda root=None: 0.5)
    assert machine.cores() == 1  # half a core still runs one thread
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda root=None: 1000.0)
    assert machine.cores() == affinity  # a quota above the mask does not add cores
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda root=None: None)
    assert machine.cores() == affinity


def test_cgroup_quota_files_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert machine.cgroup_cpu_limit(v2) == pytest.approx(1.5)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_cpu_limit(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert machine.cgroup_cpu_limit(v1) == pytest.approx(2.0)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert machine.cgroup_cpu_limit(v1) is None
    assert machine.cgroup_cpu_limit(tmp_path / "absent") is None


def test_default_threads_split_the_cores_among_local_ranks():
    assert machine.default_threads(cores=16, local_size=4) == 4
    assert machine.default_threads(cores=2, local_size=2) == 1
    assert machine.default_threads(cores=2, local_size=8) == 1  # never zero
    assert machine.default_threads() == machine.cores()
    with pytest.raises(ValueError, match="local_size"):
        machine.default_threads(cores=2, local_size=0)
    with pytest.raises(ValueError, match="cores"):
        machine.default_threads(cores=0)


def test_limit_threads_rejects_bad_counts():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"):
            machine.limit_threads(bad, tensorflow=False)


def test_limit_threads_pins_env_and_blas_pools_in_a_fresh_process():
    code = ("import json, numpy; from labkit.base import machine; machine.limit_threads(1, tensorflow=False); "
            "print(json.dumps(machine.thread_report()))")
    import json

    report = json.loads(_run(code))
    assert all(report[var] == "1" for var in machine.THREAD_ENV_VARS)
    assert report["blas_threads"] and set(report["blas_threads"]) == {1}
    assert "tf_intra_op" not in report  # TensorFlow was not imported


def test_blas_info_and_openblas_variables(monkeypatch):
    info = machine.blas_info()
    assert info and {"internal_api", "num_threads"} <= set(info[0])
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    assert machine.openblas_env() == {"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}
    assert "are unset" in machine.describe(tensorflow=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    text = machine.describe(tensorflow=False)
    assert "OPENBLAS_CORETYPE=Haswell" in text and "env -u OPENBLAS_CORETYPE" in text


def test_onednn_rule_parses_the_variable_as_tensorflow_documents():
    vnni, older = {"avx2", "avx512f", "avx512_vnni"}, {"avx", "avx2"}
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "0"}, "x86_64", "Linux", vnni) is False
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "False"}, "x86_64", "Linux", vnni) is False
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "1"}, "x86_64", "Linux", older) is True
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "TRUE"}, "x86_64", "Linux", older) is True
    # unset or unreadable: TensorFlow's default, which on Linux depends on the CPU
    assert machine.onednn_rule({}, "x86_64", "Linux", vnni) is True
    assert machine.onednn_rule({}, "x86_64", "Linux", {"avx2", "amx_tile"}) is True
    assert machine.onednn_rule({}, "x86_64", "Linux", older) is False
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "no"}, "x86_64", "Linux", older) is False
    assert machine.onednn_rule({}, "AMD64", "Windows", set()) is True
    # macOS wheels have no oneDNN kernels at all; Linux on Arm is off unless asked for
    assert machine.onednn_rule({}, "arm64", "Darwin") is False
    assert machine.onednn_rule({"TF_ENABLE_ONEDNN_OPTS": "1"}, "arm64", "Darwin") is False
    assert machine.onednn_rule({}, "aarch64", "Linux", set()) is False


def test_cpu_flags_are_read_where_the_system_lists_them():
    flags = machine.cpu_flags()
    if Path("/proc/cpuinfo").exists() and platform.machine().lower() in ("x86_64", "amd64"):
        assert {"sse2", "avx"} <= flags  # every x86-64 CPU TensorFlow 2.15's wheels run on has both


@pytest.mark.parametrize("value", [None, "0", "1", "no"])
def test_onednn_rule_agrees_with_tensorflow_itself(value):
    # the oracle: TensorFlow's own IsMklEnabled, read once per process, so one fresh process per setting
    code = ("import labkit; from labkit.base import machine; "
            "print(machine.tf_onednn_enabled(), machine.onednn_rule())")
    told, ruled = _run(code, TF_ENABLE_ONEDNN_OPTS=value).split()
    assert told == ruled
    if value == "0":
        assert told == "False"


def test_describe_names_cpu_cores_blas_and_onednn():
    text = machine.describe()
    assert "usable cores" in text and "numpy BLAS" in text
    assert "TensorFlow 2." in text and "oneDNN kernels " in text


def test_importing_machine_and_describing_without_tf_leave_tensorflow_unloaded():
    code = ("import sys; from labkit.base import machine; machine.cores(); machine.describe(tensorflow=False); "
            "print('tensorflow' in sys.modules)")
    assert _run(code) == "False"


def test_onednn_kernels_name_tensorflows_conv_kernel_as_its_verbose_mode_does():
    kernels = machine.onednn_kernels(batch_size=1, size=8, channels=16)
    assert {"conv2d", "matmul"} <= set(kernels)
    if machine.tf_onednn_enabled():  # oneDNN's own convolution, not TensorFlow's Eigen one
        assert "Eigen" not in kernels["conv2d"] and kernels["conv2d"] != "?"
    else:
        assert "Eigen" in kernels["conv2d"]
    with pytest.raises(ValueError, match="channels"):
        machine.onednn_kernels(channels=0)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread CPU time is read from Linux's /proc")
def test_thread_cpu_seconds_tells_a_busy_thread_from_a_sleeping_one():
    import threading
    import time
    ids, stop = {}, threading.Event()

    def spin():
        ids["spin"] = threading.get_native_id()
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:  # 0.3 s of this thread's own CPU time (the oracle)
            pass
        stop.wait()

    def sleep():
        ids["sleep"] = threading.get_native_id()
        stop.wait()

    threads = [threading.Thread(target=spin), threading.Thread(target=sleep)]
    for t in threads:
        t.start()
    while len(ids) < 2 or threads[0].is_alive() and machine.thread_cpu_seconds().get(ids["spin"], 0) < 0.3:
        time.sleep(0.01)
    cpu = machine.thread_cpu_seconds()
    stop.set()
    for t in threads:
        t.join()
    assert 0.28 < cpu[ids["spin"]] < 1.0
    assert cpu[ids["sleep"]] < 0.05
    assert machine.thread_cpu_seconds("/nonexistent/task") == {}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="wait channels are read from Linux's /proc")
def test_thread_wait_channel_names_an_event_loop_wait():
    import select
    import threading
    import time
    if not hasattr(select, "epoll"):
        pytest.skip("no epoll on this system")
    ready, tid = threading.Event(), {}

    def loop():
        tid["id"] = threading.get_native_id()
        ep = select.epoll()
        ready.set()
        ep.poll(1.0)  # sleeps in the kernel's epoll wait, as Gloo's network thread does
        ep.close()

    t = threading.Thread(target=loop)
    t.start()
    ready.wait()
    time.sleep(0.2)
    name = machine.thread_wait_channel(tid["id"])
    t.join()
    if name == "":
        pytest.skip("this kernel does not show wait channels")
    assert "epoll" in name
    assert machine.thread_wait_channel(10**9) == ""  # no such thread


def test_labkit_cores_overrides_what_labkit_sees(monkeypatch):
    monkeypatch.setenv("LABKIT_CORES", "64")
    assert machine.cores() == 64  # more than this host has: "what would labkit do on 64 cores?"
    monkeypatch.setenv("LABKIT_CORES", "1")
    assert machine.cores() == 1
    for bad in ("0", "two", "-3", "1.5"):
        monkeypatch.setenv("LABKIT_CORES", bad)
        with pytest.raises(ValueError, match="^LABKIT_CORES must be a whole number"):
            machine.cores()
    monkeypatch.delenv("LABKIT_CORES")
    assert machine.cores() == machine._usable_cores()


@pytest.mark.parametrize("text, expected", [("16G", 16 * 2**30), ("2GiB", 2 * 2**30), ("512M", 512 * 2**20),
                                            ("1.5g", 3 * 2**29), ("8 GB", 8 * 2**30), ("1048576", 2**20)])
def test_memory_sizes_as_docker_and_slurm_read_them(text, expected):
    assert machine.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "16X", "lots", "-2G", "100K", "G"])
def test_a_bad_memory_size_is_one_line(bad):
    with pytest.raises(ValueError, match="^LABKIT_MEMORY must be a size"):
        machine.parse_size(bad)


def test_labkit_memory_overrides_what_labkit_sees(monkeypatch):
    import psutil
    monkeypatch.delenv("LABKIT_MEMORY", raising=False)
    assert 0 < machine.memory_available() <= machine.memory() <= psutil.virtual_memory().total
    monkeypatch.setenv("LABKIT_MEMORY", "256G")
    assert machine.memory() == machine.memory_available() == 256 * 2**30
    monkeypatch.setattr(machine, "cgroup_memory_limit", lambda root=None: 2**30)
    monkeypatch.delenv("LABKIT_MEMORY")
    assert machine.memory() == 2**30, "a 1 GiB box caps the machine's RAM"


def test_cgroup_memory_limit_files_v2_and_v1(tmp_path):
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert machine.cgroup_memory_limit(tmp_path) == 2**31
    (tmp_path / "memory.max").write_text("max\n")
    assert machine.cgroup_memory_limit(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert machine.cgroup_memory_limit(v1) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    assert machine.cgroup_memory_limit(v1) == 2**30
    assert machine.cgroup_memory_limit(tmp_path / "none") is None


# ------------------------------------------------------------------ GPUs, counted without TensorFlow
@pytest.fixture
def driver(tmp_path):
    """A stand-in for /proc/driver/nvidia/gpus with four GPUs (one folder each, named by PCI address)."""
    for i in range(4):
        (tmp_path / f"0000:{i:02x}:00.0").mkdir()
    return tmp_path


@pytest.mark.parametrize("visible, count", [(None, 4), ("", 0), ("-1", 0), ("0,1", 2), ("2", 1), ("0,-1,2", 1),
                                            ("GPU-8f1c,GPU-77aa", 2), ("0,1,2,3,4,5", 4), ("x", 0)])
def test_gpus_reads_cuda_visible_devices_as_cuda_does(monkeypatch, driver, visible, count):
    monkeypatch.delenv("LABKIT_GPUS", raising=False)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert machine.gpus(driver) == count


def test_no_driver_is_no_gpu_and_labkit_gpus_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("LABKIT_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert machine.gpus(tmp_path / "absent") == 0  # a CPU node, macOS: the variable alone names no GPU
    monkeypatch.setenv("LABKIT_GPUS", "8")  # what would labkit do on an 8-GPU node?
    assert machine.gpus(tmp_path / "absent") == 8
    for bad in ("x", "-1", "2.5"):
        monkeypatch.setenv("LABKIT_GPUS", bad)
        with pytest.raises(ValueError, match="^LABKIT_GPUS must be a whole number"):
            machine.gpus()


# ------------------------------------------ LABKIT_CORES, LABKIT_MEMORY, LABKIT_GPUS: one reader, bounded
@pytest.mark.parametrize("name, bad, expected", [
    ("LABKIT_CORES", "100000", "from 1 to 4096"), ("LABKIT_CORES", "4097", "from 1 to 4096"),
    ("LABKIT_CORES", "٣", "from 1 to 4096"),  # an Arabic-Indic three: str.isdigit says yes, int() reads it
    ("LABKIT_GPUS", "1025", "from 0 to 1024"),
    ("LABKIT_MEMORY", "abc", "256M or more"), ("LABKIT_MEMORY", "0", "256M or more"),
    ("LABKIT_MEMORY", "1", "256M or more"), ("LABKIT_MEMORY", "512k", "256M or more"),
    ("LABKIT_MEMORY", "255M", "256M or more")])
def test_each_setting_out_of_bounds_is_one_line_naming_it(monkeypatch, name, bad, expected):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"^{name} must be .*{expected}") as err:
        machine.setting(name)
    assert "\n" not in str(err.value)
    reader = {"LABKIT_CORES": machine.cores, "LABKIT_GPUS": machine.gpus, "LABKIT_MEMORY": machine.memory}[name]
    with pytest.raises(ValueError, match=f"^{name} must be"):
        reader()
    if name == "LABKIT_MEMORY":
        with pytest.raises(ValueError, match=f"^{name} must be"):
            machine.memory_available()  # refused here too, not ignored


@pytest.mark.parametrize("name, text, value", [("LABKIT_CORES", "4096", 4096), ("LABKIT_CORES", " 3 ", 3),
                                               ("LABKIT_GPUS", "0", 0), ("LABKIT_GPUS", "1024", 1024),
                                               ("LABKIT_MEMORY", "256M", 256 * 2**20), ("LABKIT_CORES", "", None)])
def test_each_setting_at_its_bounds_is_read(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert machine.setting(name) == value


def test_default_threads_honour_labkit_cores(monkeypatch):
    monkeypatch.setenv("LABKIT_CORES", "3")
    assert machine.default_threads() == 3 and machine.default_threads(local_size=2) == 1
    monkeypatch.setenv("LABKIT_CORES", "100000")
    with pytest.raises(ValueError, match="^LABKIT_CORES must be"):
        machine.default_threads()  # not 100,000 threads per worker
