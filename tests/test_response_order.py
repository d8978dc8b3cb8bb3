"""End-to-end (issue 13, part 1): no response waits behind another request's VAE decode.

Request A's decode (a large clip) is under way when request B streams: B's progress and B's
CANCELLED answer reach the client before A's final response. Order is asserted, not wall time:
every event is appended to one list as its response arrives."""

import threading

from client.api import H3Error

from .serving import generate_in_thread

LARGE = dict(
    prompt="a large clip", height=256, width=256, num_frames=121, num_inference_steps=1, seed=3, return_mp4=False
)
SMALL = dict(prompt="a small clip", height=64, width=96, num_frames=22, seed=4)


def start_large(client, order: list, label: str) -> tuple[threading.Thread, threading.Event]:
    """Start A; the returned event is set once A's DiT step is done (its decode starts then)."""
    decoding = threading.Event()

    def run():
        client.generate(**LARGE, progress_every=1, on_progress=lambda *_: decoding.set())
        order.append(f"{label} result")

    thread = threading.Thread(target=run)
    thread.start()
    return thread, decoding


def test_progress_of_one_request_does_not_wait_behind_another_requests_decode(client):
    order = []
    large, decoding = start_large(client, order, "A")
    assert decoding.wait(60)
    client.generate(
        **SMALL,
        num_inference_steps=20,
        progress_every=1,
        on_progress=lambda step, *_: order.append(f"B progress {step}"),
    )
    order.append("B result")
    large.join(120)
    assert order.index("B progress 1") < order.index("A result")
    assert [event for event in order if event.startswith("B")] == [f"B progress {k}" for k in range(1, 21)] + [
        "B result"
    ]


def test_a_cancel_answer_does_not_wait_behind_another_requests_decode(client):
    order, outcome, started = [], {}, threading.Event()
    large, decoding = start_large(client, order, "A")
    assert decoding.wait(60)
    victim = generate_in_thread(
        client,
        outcome,
        "B",
        **SMALL,
        num_inference_steps=400,
        request_id="order-victim",
        progress_every=1,
        on_progress=lambda *_: started.set(),
    )
    assert started.wait(60)
    assert client.cancel("order-victim") == "cancelled"
    victim.join(60)
    order.append("B cancelled")
    large.join(120)
    assert isinstance(outcome["B"], H3Error) and outcome["B"].code == "CANCELLED"
    assert order == ["B cancelled", "A result"]
