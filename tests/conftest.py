"""Shared fixtures for the peer runtime tests."""

from __future__ import annotations

import socket

import pytest


def free_tcp_port() -> int:
    """A loopback port nobody listens on right now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unused_tcp_address() -> str:
    return f"tcp://127.0.0.1:{free_tcp_port()}"
