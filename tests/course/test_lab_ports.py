"""scripts/lab.sh: the port is checked, a busy one said, port 0 printed."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, one_line  # noqa: E402


# ================================================================ the smaller items: lab.sh ports, LABKIT_DATA
def lab(*args, timeout=30):
    env = {**os.environ, "LABKIT_VENV": str(Path(sys.executable).parent.parent)}
    return subprocess.run(["bash", str(ROOT / "scripts/lab.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("port", ["99999", "65536", "123456"])
def test_lab_refuses_a_port_out_of_range(port):
    one_line(lab("--port", port, "--no-browser"), "--port must be 1-65535", port)


def test_lab_says_how_to_pick_another_port_when_it_is_busy():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line(lab("--port", str(port), "--no-browser"), f"port {port}", "busy", "--port 0")


def test_lab_port_0_prints_the_port_it_listens_on(tmp_path, isolated_home):
    from helpers import http_get
    env = {**os.environ, "LABKIT_VENV": str(Path(sys.executable).parent.parent), "JUPYTER_TOKEN": "t0k3n"}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/lab.sh"), "--port", "0", "--no-browser"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/lab", first).group(1))
        assert port > 0
        deadline = time.time() + 90
        while True:
            try:
                if http_get(f"http://127.0.0.1:{port}/api/status", "t0k3n")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "the server did not answer on the printed port"
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
