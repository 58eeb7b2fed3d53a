"""The open-the-course command serves JupyterLab on 127.0.0.1 only, and refuses requests without the token."""
import json
import os

import psutil
import pytest
from helpers import http_get as get
from helpers import running_lab

pytestmark = pytest.mark.server


@pytest.fixture
def lab(isolated_home):
    token = "labkit-test-" + os.urandom(8).hex()
    with running_lab(isolated_home, token) as (proc, base):
        yield proc, base, token


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
