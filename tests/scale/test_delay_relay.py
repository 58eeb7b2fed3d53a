"""scripts/delay_relay.py: the userspace link delay the virtual cluster uses where the kernel has no tc netem.

The relay's loop is tested on a socket pair (no root needed): what goes in comes back intact, in order, and no
sooner than the delay. On a real TUN device inside the cluster, tests/deepdive/test_vcluster.py checks the round trip
between nodes and the fitted latency."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import ROOT  # noqa: E402  (the repository root, one definition)

sys.path.insert(0, str(ROOT / "scripts"))
import delay_relay  # noqa: E402


@pytest.mark.parametrize("text, seconds", [("2ms", 0.002), ("500us", 0.0005), ("0.25s", 0.25), ("1.5ms", 0.0015)])
def test_parse_delay_reads_tc_time(text, seconds):
    assert delay_relay.parse_delay(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "0ms", "soon", "5", "-1ms", "2 ms x"])
def test_parse_delay_refuses_what_is_not_a_positive_time(text):
    with pytest.raises(ValueError, match="--delay must be a positive time"):
        delay_relay.parse_delay(text)


def test_packets_come_back_intact_in_order_after_the_delay():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    delay, stop = 0.05, []
    worker = threading.Thread(target=delay_relay.relay, args=(ours.fileno(), delay, 9000, stop), daemon=True)
    worker.start()
    try:
        packets = [os.urandom(n) for n in (60, 1500, 9000, 1)]
        sent = []
        for p in packets:
            sent.append(time.monotonic())
            theirs.send(p)
            time.sleep(0.01)
        theirs.settimeout(2)
        got = []
        for _ in packets:
            got.append((theirs.recv(65536), time.monotonic()))
        assert [g for g, _ in got] == packets
        held = [t - s for (_, t), s in zip(got, sent)]
        assert min(held) >= delay, held
        assert max(held) < delay + 0.5, held  # generous: a loaded 2-core machine, but not lost or stuck
    finally:
        stop.append(1)
        worker.join(timeout=2)
        ours.close()
        theirs.close()
    assert not worker.is_alive()


def test_relay_returns_when_the_other_end_closes():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    worker = threading.Thread(target=delay_relay.relay, args=(ours.fileno(), 0.01, 9000, []), daemon=True)
    worker.start()
    theirs.close()
    worker.join(timeout=3)
    ours.close()
    assert not worker.is_alive()


@pytest.mark.parametrize("args, expected", [
    (["--dev", "lkd0", "--delay", "soon"],
     "delay_relay: --delay must be a positive time such as 2ms or 500us; got 'soon'"),
    (["--dev", "a/b", "--delay", "2ms"],
     "delay_relay: --dev must be an interface name of 1-15 letters, digits, '_', '.' or '-'; got 'a/b'"),
    (["--dev", "lkd0", "--delay", "2ms", "--mtu", "20"], "delay_relay: --mtu must be 68..65535 bytes; got 20"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "delay_relay.py"), *args],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and res.stderr.strip() == expected, res
