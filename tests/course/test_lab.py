"""The open-the-course command serves JupyterLab on 127.0.0.1 only, refuses requests without the token, and
never shows the token to other users: not on a command line (`ps`), not in a kernel's environment, not in
the server's log; without a display, the URL with the token goes to the learner's terminal only."""
import json
import os
import pty
import select
import time

import psutil
import pytest

from helpers import http_get as get
from helpers import http_post as post
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


def test_course_settings_turn_jupyter_news_off(lab):
    """scripts/jupyter/labconfig: no "Would you like to get notified about official Jupyter news?" pop-up."""
    _, base, token = lab
    status, body = get(base + "/lab/api/settings/@jupyterlab/apputils-extension:notification", token)
    assert status == 200
    # the course's overrides become the schema's defaults, which the page uses where the user set nothing
    defaults = {k: v.get("default") for k, v in json.loads(body)["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults


def test_bound_to_loopback_only(lab):
    proc, _, _ = lab
    server = psutil.Process(proc.pid)  # lab.sh execs jupyter: same pid
    listening = [c.laddr for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "JupyterLab has no listening socket"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}


def test_post_without_token_is_refused(lab):
    _, base, _ = lab
    assert post(base + "/api/kernels", None, b'{"name": "python3"}')[0] == 403  # no token, no XSRF cookie


def wait_for_kernel(server: psutil.Process, timeout=60) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in server.children(recursive=True):
            try:
                if "ipykernel" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    pytest.fail("the kernel process did not appear")


def test_token_is_on_no_command_line_and_not_in_the_kernels_environment(lab, isolated_home):
    proc, base, token = lab
    status, body = post(base + "/api/kernels", token, b'{"name": "python3"}')
    assert status == 201, body
    server = psutil.Process(proc.pid)
    kernel = wait_for_kernel(server)
    for p in [server, *server.children(recursive=True)]:
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:  # what `ps` shows every user
            assert token.encode() not in f.read(), f"token on the command line of {p.pid}"
    with open(f"/proc/{kernel.pid}/environ", "rb") as f:
        environ = f.read()
    assert b"JUPYTER_TOKEN" not in environ and token.encode() not in environ
    assert token not in (isolated_home / "lab.log").read_text()  # the server's log shows it masked


def test_headless_lab_prints_the_url_with_its_token_to_the_terminal_only(isolated_home):
    token = "labkit-tty-" + os.urandom(8).hex()
    master, terminal = pty.openpty()  # the learner's terminal, no display
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    try:
        with running_lab(isolated_home, token, env=env, stdout=terminal) as (_, base):
            shown = b""
            deadline = time.time() + 10
            while b"\n" not in shown.partition(b"lab: open")[2] and time.time() < deadline:
                if select.select([master], [], [], 0.5)[0]:
                    shown += os.read(master, 4096)
    finally:
        os.close(terminal)
        os.close(master)
    text = shown.decode(errors="replace")
    assert f"lab: open {base}/lab?token={token}" in text
    assert token not in (isolated_home / "lab.log").read_text()


def test_headless_lab_without_a_terminal_names_where_the_token_is(lab, isolated_home):
    _, base, token = lab  # stdout is a log file and there is no controlling terminal
    log = (isolated_home / "lab.log").read_text()
    assert token not in log
    assert f"{base}/lab" in log and "jupyter server list" in log


@pytest.mark.parametrize("args, word", [(["--port", "abc"], "--port"), (["--port"], "--port"),
                                        (["--open-to-all"], "unknown option")])
def test_bad_arguments_are_one_line_exit_2(args, word):
    import subprocess

    from helpers import ROOT

    proc = subprocess.run(["bash", str(ROOT / "scripts/lab.sh"), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and word in proc.stderr
