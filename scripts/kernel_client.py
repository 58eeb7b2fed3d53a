"""The kernel client the course's own notebook runs use (scripts/refresh_notebooks.py, scripts/binder_box.py and the
suite's nbclient and nbconvert runs): jupyter_client's asyncio client, with every wait for a message cut into
POLL_SLICE_S slices.

Why: nbclient waits for a cell's reply with one asyncio poll of the whole cell timeout. pyzmq's asyncio poll wakes on
the socket's edge-triggered file descriptor, and that wake-up is sometimes missed; the reply then sits in the socket
until the timeout, when pyzmq's last, real zmq poll finds it and the run goes on as if nothing happened (the symptom
pyzmq#1558 reports: "the poller will return a received event after the timeout"; the exact cause here is not
known). Seen here as an idle kernel and a cell that took its whole bound, then passed: 04's widget cell in the box
beside a busy core (+174 s at its 180 s bound), 01 from a read-only course (+594 s at nbconvert's 600 s). Polling in
slices makes that last poll happen every POLL_SLICE_S, so a lost wake-up costs at most that long; the timeout itself
is unchanged.

    NotebookClient(nb, kernel_manager_class=kernel_client.SlicedWaitKernelManager, ...)
    jupyter nbconvert --execute --ExecutePreprocessor.kernel_manager_class=kernel_client.SlicedWaitKernelManager
                                                          (with this folder on PYTHONPATH)
"""
from __future__ import annotations

import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Type, default

POLL_SLICE_S = 1.0  # the longest a message that has arrived can wait unread


class SlicedWaitChannel(AsyncZMQSocketChannel):
    """An asyncio channel whose get_msg polls at most POLL_SLICE_S at a time until its timeout (None: for ever)."""

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            wait = POLL_SLICE_S if left is None else max(0.0, min(POLL_SLICE_S, left))
            if await self.socket.poll(int(wait * 1000)):
                return await self._recv()
            if left is not None and left <= POLL_SLICE_S:
                raise Empty


class SlicedWaitClient(AsyncKernelClient):
    """AsyncKernelClient whose shell, iopub, stdin and control channels wait in slices."""

    shell_channel_class = Type(SlicedWaitChannel)
    iopub_channel_class = Type(SlicedWaitChannel)
    stdin_channel_class = Type(SlicedWaitChannel)
    control_channel_class = Type(SlicedWaitChannel)


class SlicedWaitKernelManager(AsyncKernelManager):
    """AsyncKernelManager whose clients are SlicedWaitClient (nbclient's kernel_manager_class)."""

    @default("client_factory")
    def _client_factory_default(self) -> type:
        return SlicedWaitClient
