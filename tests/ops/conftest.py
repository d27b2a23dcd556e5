"""Helpers for the operations tests: a block of free ports, and processes that serve a data dir."""

from __future__ import annotations

import random
import socket


def free_port_block(count: int = 5) -> int:
    """A base port such that base..base+count-1 are all free on loopback (`a2m up --port base`)."""
    for _ in range(200):
        base = random.randint(20000, 60000)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free block of ports")
