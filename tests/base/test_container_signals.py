"""The container's own signals: busy-ness and free memory from this process's cgroup (fake trees under tmp_path),
the node's load average only without a CPU quota; counts that agree with their nouns; advice this machine can take."""
import pytest

from labkit.base import config, machine, observe, timing

GiB = 2**30


def _tree(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_quota_reads_the_containers_own_use_not_the_node_load(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"cpu.max": "100000 100000\n", "cpu.stat": "usage_usec 5000000\nnr_periods 10\n"
                            "nr_throttled 4\n", "cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"})
    monkeypatch.setattr(timing, "load_average", lambda: 40.0)  # a busy node: other containers' work
    later = lambda _s: (root / "cpu.stat").write_text("usage_usec 5180000\nnr_periods 10\nnr_throttled 4\n")  # noqa: E731  0.18 s in 0.2 s
    busy = timing.busy(root, window=0.2, sleep=later)
    assert busy.source == "container" and busy.cores == pytest.approx(0.9)
    assert "within its limit of 1 core" in busy.text
    line = observe.busy_line(cores=1, busy=busy)
    assert "against 1 usable core." in line and "Processes in this container" in line and "load average" not in line
    assert machine.cgroup_throttled(root) == 0.4


def test_pressure_where_the_use_is_unreadable_and_load_without_a_quota(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"cpu.max": "200000 100000\n", "cpu.pressure": "some avg10=40.00 avg60=1.00 total=9\n"})
    busy = timing.busy(root, sleep=lambda _s: None)
    assert (busy.source, busy.cores) == ("pressure", pytest.approx(0.8)) and "40 % of the last 10 s" in busy.text
    free = _tree(tmp_path / "free", {"cpu.max": "max 100000\n"})
    monkeypatch.setattr(timing, "load_average", lambda: 3.0)
    busy = timing.busy(free)
    assert (busy.source, busy.cores, busy.text) == ("load average", 3.0, "load average 3.00 (1 min)")
    assert observe.busy_line(cores=2, busy=busy).startswith("This machine is busy: load average 3.0 against 2 ")


def test_cgroup_v1_cpu_files(tmp_path):
    root = _tree(tmp_path, {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n",
                            "cpuacct/cpuacct.usage": "2000000000\n"})
    assert machine.cgroup_cpu_seconds(root) == 2.0
    later = lambda _s: (root / "cpuacct/cpuacct.usage").write_text("2050000000\n")  # noqa: E731
    busy = timing.busy(root, window=0.1, sleep=later)
    assert busy.cores == pytest.approx(0.5) and "limit of 0.5 cores" in busy.text


@pytest.mark.parametrize("files", [
    {"memory.max": f"{2 * GiB}\n", "memory.current": f"{GiB + GiB // 2}\n",
     "memory.stat": f"inactive_file {GiB // 2}\n"},
    {"memory/memory.limit_in_bytes": f"{2 * GiB}\n", "memory/memory.usage_in_bytes": f"{GiB + GiB // 2}\n",
     "memory/memory.stat": f"cache 1\ntotal_inactive_file {GiB // 2}\n"},
])
def test_free_memory_is_the_limit_less_every_process_of_the_cgroup(tmp_path, monkeypatch, files):
    import psutil
    monkeypatch.delenv("LABKIT_MEMORY", raising=False)
    root = _tree(tmp_path, files)
    assert machine.cgroup_memory_usage(root) == GiB  # other kernels count; the droppable file cache does not
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": 64 * GiB, "total": 96 * GiB}))
    assert machine.memory_available(root) == GiB  # the node's 64 GiB free are not this container's
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("VM", (), {"available": GiB // 4, "total": 96 * GiB}))
    assert machine.memory_available(root) == GiB // 4


def test_numbers_agree_with_nouns(monkeypatch):
    monkeypatch.setenv("LABKIT_CORES", "1")
    assert machine.count_text(1, "usable core") == "1 usable core" and machine.count_text(2, "core") == "2 cores"
    assert machine.count_text(3, "process", "processes") == "3 processes"
    assert " 1 usable core of " in machine.describe(tensorflow=False).splitlines()[0]
    assert config.describe().splitlines()[1].endswith(" on 1 core")
    assert observe.conditions(cores=1, load=0.0).startswith("load average 0.00 (1 min) on 1 usable core:")
    assert "(3.0 on 2 cores)" in observe.likely_reason(cores=2, load=3.0).replace("load average ", "")


@pytest.mark.parametrize("euid", [0, 1000])
def test_one_core_offers_the_virtual_cluster_only_where_it_can_run(monkeypatch, capsys, euid):
    from labkit.deepdive import vcluster
    monkeypatch.setattr("os.geteuid", lambda: euid)
    monkeypatch.setattr("sys.platform", "linux")
    observe.one_core("two workers share it", "they stay in sync", cores=1)
    out = capsys.readouterr().out
    assert ("virtual cluster" in out) == (euid == 0) and out.count("\n") == 1
    assert (vcluster.why_not() or "").startswith("" if euid == 0 else "the virtual cluster needs root")
