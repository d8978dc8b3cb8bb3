"""h3_core.serving.decodes: h3_vae's open decodes get a keep-alive after heartbeat_s seconds
without a response, never after they are finished; one failing send stops only its own."""

import threading

import pytest

from h3_core.serving.decodes import Decodes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keepalives_follow_heartbeat_s_of_silence_and_stop_at_finish():
    lock, clock, sent, lines = threading.Lock(), Clock(), [], []

    def send(decode):
        assert lock.locked()
        if decode.request_id == "broken":
            raise RuntimeError("the sender is closed")
        sent.append((decode.request_id, clock.now))

    decodes = Decodes(lock, 10.0, send, lines.append, clock)
    try:
        with lock:
            a = decodes.add("a", "reply a", keepalive=True)
            broken = decodes.add("broken", "reply broken", keepalive=True)
            clock.now = 104.0
            decodes.add("b", "reply b", keepalive=True)
            decodes.add("off", "reply off", keepalive=False)
            decodes.start(a)
            assert decodes.counts() == (3, 1)
            clock.now = 109.9
            assert decodes.keep_alive() == pytest.approx(0.1) and sent == []  # a is due at 110
            clock.now = 110.0
            assert decodes.keep_alive() == 4.0 and sent == [("a", 110.0)]  # then b at 114
            assert len(lines) == 1 and lines[0].startswith("h3_vae: a keep-alive of request broken could not be sent:")
            assert lines[0].endswith("RuntimeError: the sender is closed\n") and not broken.keepalive
            clock.now = 115.0
            assert decodes.keep_alive() == 5.0 and sent[1:] == [("b", 115.0)]
            decodes.finish(a)
            clock.now = 200.0
            assert decodes.keep_alive() == 10.0 and sent[2:] == [("b", 200.0)] and len(lines) == 1
            assert decodes.counts() == (3, 0)
    finally:
        decodes.close()
    assert not decodes.thread.is_alive()


def test_the_thread_sends_keepalives_on_its_own():
    lock, sent = threading.Lock(), threading.Event()
    decodes = Decodes(lock, 0.05, lambda decode: sent.set(), print)
    with lock:
        decodes.add("a", "reply", keepalive=True)
    assert sent.wait(30)
    decodes.close()
    assert not decodes.thread.is_alive()
