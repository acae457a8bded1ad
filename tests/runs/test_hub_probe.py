"""The Hub probe: a refused port, a black-hole socket and a slow server are offline within 3 s each; an answer of
any kind is online; HF_HUB_OFFLINE set by the user wins without a probe."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from prime_lab.runs import hub_probe
from tests.support.hf_hub import loopback_hub


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never reads or answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def slow_server() -> Iterator[str]:
    """Accepts, reads the request, and answers only after 10 s."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.recv(65536)
            if not stop.wait(10):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()


def _timed_offline(endpoint: str) -> float:
    started = time.monotonic()
    assert not hub_probe.hub_online(endpoint)
    reason = hub_probe.offline_reason(endpoint)
    assert reason is not None and endpoint in reason
    return time.monotonic() - started


def test_a_refused_port_is_offline_at_once() -> None:
    assert _timed_offline(f"http://127.0.0.1:{_refused_port()}") < 3


def test_a_black_hole_and_a_slow_server_are_offline_within_the_probe(black_hole: str, slow_server: str) -> None:
    assert _timed_offline(black_hole) < 3
    assert _timed_offline(slow_server) < 3
    started = time.monotonic()  # decided once per process: asked again, no second wait
    assert not hub_probe.hub_online(black_hole)
    assert time.monotonic() - started < 0.1


def test_any_answer_is_online_and_the_users_choice_wins(black_hole: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with loopback_hub([]) as hub:  # it answers 404 to HEAD /: an answer all the same
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert hub_probe.hub_endpoint() == hub.url and hub_probe.hub_online()
        assert [r.method for r in hub.requests] == ["HEAD"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    assert hub_probe.offline_reason(f"http://127.0.0.1:{_refused_port()}") == "HF_HUB_OFFLINE is set"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert hub_probe.hub_online(black_hole + "/never-probed")
    assert time.monotonic() - started < 0.1
