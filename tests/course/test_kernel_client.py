"""scripts/kernel_client.py: a message whose wake-up was lost is read within one slice, not at the end of the wait;
the wait's own timeout still holds."""
import asyncio
import sys
import time
from queue import Empty

import pytest
from jupyter_client.channels import AsyncZMQSocketChannel

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import kernel_client  # noqa: E402


class LostWakeUp:
    """A socket as pyzmq's asyncio poll behaves when the edge of its file descriptor was consumed: a message that
    arrives is not noticed until the poll's timeout, when its last, real poll finds it (pyzmq#1558)."""

    def __init__(self, arrives_after_s: float | None):
        self.arrives = None if arrives_after_s is None else time.monotonic() + arrives_after_s
        self.polls: list[int] = []

    async def poll(self, timeout_ms=None):
        self.polls.append(timeout_ms)
        await asyncio.sleep((timeout_ms or 0) / 1000)
        return int(self.arrives is not None and time.monotonic() >= self.arrives)


def _channel(cls, socket):
    channel = object.__new__(cls)  # no zmq socket behind it: the fake stands in
    channel.socket = socket

    async def recv():
        return {"msg_type": "execute_reply"}
    channel._recv = recv
    return channel


def _timed(channel, timeout):
    # a loop of its own, never the thread's current one: asyncio.run would leave the thread without one, and
    # refresh_notebooks, run later in this test process, asks for it (asyncio.get_event_loop)
    loop = asyncio.new_event_loop()
    start = time.monotonic()
    try:
        return loop.run_until_complete(channel.get_msg(timeout=timeout)), time.monotonic() - start
    except Empty:
        return None, time.monotonic() - start
    finally:
        loop.close()


@pytest.fixture
def short_slices(monkeypatch):
    monkeypatch.setattr(kernel_client, "POLL_SLICE_S", 0.05)


def test_a_lost_wake_up_costs_one_slice_not_the_whole_wait(short_slices):
    # jupyter_client's own channel: the reply, there after 0.02 s, is read when the 1 s wait ends
    msg, waited = _timed(_channel(AsyncZMQSocketChannel, LostWakeUp(0.02)), timeout=1.0)
    assert msg is not None and waited >= 0.95
    socket = LostWakeUp(0.02)
    msg, waited = _timed(_channel(kernel_client.SlicedWaitChannel, socket), timeout=1.0)
    assert msg == {"msg_type": "execute_reply"} and waited < 0.5, waited
    assert all(ms == 50 for ms in socket.polls)


def test_the_timeout_still_ends_the_wait(short_slices):
    socket = LostWakeUp(None)
    msg, waited = _timed(_channel(kernel_client.SlicedWaitChannel, socket), timeout=0.12)
    assert msg is None and 0.11 <= waited < 0.5, waited
    assert socket.polls[:2] == [50, 50] and len(socket.polls) == 3 and socket.polls[2] <= 20, socket.polls


def test_no_timeout_waits_in_slices_until_the_message_comes(short_slices):
    socket = LostWakeUp(0.2)
    msg, waited = _timed(_channel(kernel_client.SlicedWaitChannel, socket), timeout=None)
    assert msg is not None and 0.2 <= waited < 0.6 and len(socket.polls) >= 4 and set(socket.polls) == {50}


def test_the_manager_makes_sliced_clients():
    km = kernel_client.SlicedWaitKernelManager(kernel_name="python3")
    client = km.client()
    assert isinstance(client, kernel_client.SlicedWaitClient)
    for name in ("shell", "iopub", "stdin", "control"):
        assert getattr(client, f"{name}_channel_class") is kernel_client.SlicedWaitChannel
