"""The open-the-course command serves JupyterLab on 127.0.0.1 only, and refuses requests without the token."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

pytestmark = pytest.mark.server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture
def lab(repo_root, isolated_home):
    port, token = free_port(), "labkit-test-" + os.urandom(8).hex()
    env = dict(os.environ, JUPYTER_TOKEN=token)
    proc = subprocess.Popen(["bash", str(repo_root / "scripts/lab.sh"), "--port", str(port), "--no-browser"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited early:\n{proc.stdout.read().decode()}")
            try:
                if get(base + "/api/status", token)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 90 s")
        yield proc, base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_token_required_and_notebooks_listed(lab):
    _, base, token = lab
    assert get(base + "/api/contents/notebooks")[0] == 403
    assert get(base + "/api/contents/notebooks", "wrong-token")[0] == 403
    status, body = get(base + "/api/contents/notebooks", token)
    assert status == 200
    names = {item["name"] for item in json.loads(body)["content"]}
    assert "00_welcome.ipynb" in names


def test_bound_to_loopback_only(lab):
    proc, _, _ = lab
    server = psutil.Process(proc.pid)  # lab.sh execs jupyter: same pid
    listening = [c.laddr for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "JupyterLab has no listening socket"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}
