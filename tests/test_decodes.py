"""h3_core.serving.vae.decodes: h3_vae's open decodes get a keep-alive after heartbeat_s seconds
without a response, never after they are finished; one failing send stops only its own."""

import threading

import pytest

from h3_core.diffusion.request import RequestLimits
from h3_core.serving.vae.decodes import BacklogFull, Decodes, check_result


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

    published = []
    decodes = Decodes(lock, 1, 3, 10.0, send, lines.append, lambda *counts: published.append(counts), clock)
    try:
        with lock:
            a = decodes.add("a", "reply a", keepalive=True)
            broken = decodes.add("broken", "reply broken", keepalive=True)
            clock.now = 104.0
            decodes.add("b", "reply b", keepalive=True)
            decodes.add("off", "reply off", keepalive=False)
            decodes.start(a)
            assert decodes.counts() == (3, 1) and published == [(1, 0), (2, 0), (3, 0), (4, 0), (3, 1)]
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
            assert decodes.counts() == (3, 0) and published[-1] == (3, 0)
    finally:
        decodes.close()
    assert not decodes.thread.is_alive()


def test_the_thread_sends_keepalives_on_its_own():
    lock, sent = threading.Lock(), threading.Event()
    decodes = Decodes(lock, 1, 0, 0.05, lambda decode: sent.set(), print, lambda *counts: None)
    with lock:
        decodes.add("a", "reply", keepalive=True)
    assert sent.wait(30)
    decodes.close()
    assert not decodes.thread.is_alive()


def test_a_full_backlog_refuses_naming_the_settings_and_frees_a_place_when_a_decode_ends():
    lock = threading.Lock()
    decodes = Decodes(lock, 2, 1, 10.0, lambda decode: None, print, lambda *counts: None)
    with lock:
        first = [decodes.add(f"r{i}", None, keepalive=True) for i in range(3)]
        with pytest.raises(BacklogFull) as full:
            decodes.add("r3", None, keepalive=True)
        assert str(full.value) == (
            "the decode backlog is full: 3 decodes open, decode_workers + max_queued_decodes = 2 + 1"
        )
        decodes.finish(first[0])
        assert decodes.add("r3", None, keepalive=True).request_id == "r3"
    decodes.close()


RESULT = {"kind": "result", "height": 64, "width": 96, "num_frames": 22}
VIDEO, AUDIO = (1, 24, 7, 4, 6), (1, 2, 32, 37)  # latent_frames(22) = 7; audio_latent_frames(22) = 37


@pytest.mark.parametrize(
    "info, video, audio, message",
    [
        (
            dict(RESULT, height=4096),
            (1, 24, 7, 256, 6),
            AUDIO,
            "height=4096 is out of range: allowed multiples of 32 in 32..256",
        ),
        (dict(RESULT, width=100), VIDEO, AUDIO, "width=100 is out of range: allowed multiples of 32 in 32..256"),
        (
            dict(RESULT, num_frames=100_000),
            VIDEO,
            AUDIO,
            "num_frames=100000 is out of range: allowed 1..124 (NUM_FRAMES; the clip is aligned up to 17n+5 frames, "
            "at most max_num_frames=124)",
        ),
        (
            dict(RESULT, num_frames="22"),
            VIDEO,
            AUDIO,
            "INFO of a response with latents must be a result holding integers ['height', 'width', 'num_frames']",
        ),
        (
            dict(RESULT, kind="progress"),
            VIDEO,
            AUDIO,
            "INFO of a response with latents must be a result holding integers ['height', 'width', 'num_frames']",
        ),
        (
            RESULT,
            (1, 24, 7, 400, 400),
            AUDIO,
            "VIDEO_LATENT is [1, 24, 7, 400, 400]; height=64, width=96, num_frames=22 need [1, 24, 7, 4, 6]",
        ),
        (
            RESULT,
            VIDEO,
            (1, 2, 32, 9000),
            "AUDIO_LATENT is [1, 2, 32, 9000]; height=64, width=96, num_frames=22 need [1, 2, 32, 37]",
        ),
    ],
)
def test_a_forged_result_is_refused_against_h3_vaes_own_limits(info, video, audio, message):
    with pytest.raises(ValueError) as refused:
        check_result(info, video, audio, RequestLimits())
    assert str(refused.value) == message


def test_a_result_within_the_limits_passes():
    check_result(RESULT, VIDEO, AUDIO, RequestLimits())
    check_result(
        dict(RESULT, height=256, width=256, num_frames=121), (1, 24, 37, 16, 16), (1, 2, 32, 202), RequestLimits()
    )


def test_a_decode_keeps_the_silence_before_its_result_and_wakes_the_thread():
    """The DiT's result says how long its client has heard nothing (INFO silent_s); the decode's
    first keep-alive comes heartbeat_s after the client's last response, not after the result
    reached h3_vae (a fresh user saw 20 s between responses with heartbeat_s 15), and adding the
    decode wakes the keep-alive thread, which may be sleeping for up to heartbeat_s."""
    lock, clock, sent = threading.Lock(), Clock(), []
    decodes = Decodes(lock, 1, 3, 10.0, lambda decode: sent.append((decode.request_id, clock.now)), print, print, clock)
    try:
        with lock:
            clock.now = 100.0
            quiet = decodes.add("quiet", "reply", keepalive=True, silent_s=8.0)
            forged = decodes.add("forged", "reply", keepalive=True, silent_s=1e9)
            assert (quiet.last_sent, forged.last_sent) == (92.0, 90.0)  # silence counted within heartbeat_s
            assert decodes.keep_alive() == 2.0 and sent == [("forged", 100.0)]  # quiet is due at 102
            clock.now = 102.0
            assert decodes.keep_alive() == 8.0 and sent[1:] == [("quiet", 102.0)]  # forged is due at 110
    finally:
        decodes.close()
    woke = threading.Event()
    slow = Decodes(lock, 1, 3, 3600.0, lambda decode: woke.set(), print, print)  # its first round in an hour
    try:
        with lock:
            slow.add("late", "reply", keepalive=True, silent_s=3600.0)  # due at once
        assert woke.wait(30)  # sent after the wake, not after the hour
    finally:
        slow.close()
