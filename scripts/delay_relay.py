#!/usr/bin/env python3
"""Hold every packet that enters a TUN device for a fixed time, then hand it back to the kernel.

scripts/vcluster.sh runs one inside a node's network namespace when a link needs a delay and the kernel has
no tc netem (CONFIG_NET_SCH_NETEM): the node routes its own packets for the other nodes into the TUN device,
this process reads each one, waits DELAY and writes it back, and the node forwards it out of its shaped
link. A message between two nodes then takes DELAY more, a round trip 2 x DELAY, as with netem on each
node's way out. Standard library only; Linux; root (or CAP_NET_ADMIN) to create the device.

    delay_relay.py --dev lkd0 --delay 2ms [--mtu 9000] [--node labkit-node1]

It exits when the device goes away (its namespace deleted) or on SIGTERM/SIGINT, and the device with it.
"""
import argparse
import collections
import errno
import fcntl
import os
import re
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_delay(text: str) -> float:
    """tc's time syntax ('2ms', '500us', '0.1s') in seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--delay must be a positive time such as 2ms or 500us; got {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def open_tun(name: str) -> int:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", name):
        raise ValueError(f"--dev must be an interface name of 1-15 letters, digits, '_', '.' or '-'; got {name!r}")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def relay(fd: int, delay: float, mtu: int, stop: list) -> None:
    """Read packets as they come, write each back `delay` seconds after it was read (first in, first out),
    until `stop` is not empty."""
    held = collections.deque()  # (due time, packet); a constant delay keeps them in order
    while not stop:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.2
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
        except InterruptedError:
            continue
        if ready:
            now = time.monotonic()
            while True:
                try:
                    packet = os.read(fd, mtu + 64)
                except BlockingIOError:
                    break
                if not packet:  # the other end is closed (a socket in the tests; a TUN device never says so)
                    return
                held.append((now + delay, packet))
        now = time.monotonic()
        while held and held[0][0] <= now:
            try:
                os.write(fd, held.popleft()[1])
            except BlockingIOError:  # the kernel's backlog is full: drop, as a full link queue would
                pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Delay every packet through a TUN device by a fixed time.")
    p.add_argument("--dev", required=True, help="TUN device to create, e.g. lkd0")
    p.add_argument("--delay", required=True, help="one-way delay, tc syntax: 2ms, 500us")
    p.add_argument("--mtu", type=int, default=9000, help="largest packet, bytes (the link's MTU)")
    p.add_argument("--node", default="", help="the node this runs for (shown in ps; unused otherwise)")
    args = p.parse_args(argv)
    try:
        delay = parse_delay(args.delay)
        if not 68 <= args.mtu <= 65535:
            raise ValueError(f"--mtu must be 68..65535 bytes; got {args.mtu}")
        fd = open_tun(args.dev)
    except (ValueError, OSError) as e:
        print(f"delay_relay: {e}", file=sys.stderr)
        return 2
    print(f"delay_relay: {args.dev} holds each packet {delay * 1e3:g} ms", flush=True)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    try:
        relay(fd, delay, args.mtu, stop)
    except OSError as e:  # EBADFD/EIO/ENODEV: the device or its namespace is gone
        if e.errno not in (errno.EBADFD, errno.EIO, errno.ENODEV, errno.ENXIO):
            raise
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
