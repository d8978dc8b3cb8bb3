"""One request's media cannot jam the server (issue 41, item 6): h3_encoder decodes files in
media_workers threads apart from the text encoder, each request within its decode budget, holding
its id so that a cancel by id answers "cancelled" and stops it between files. Asserted as an order,
never a time (benchmarks/media_jam_bench.py measures the seconds): a plain t2va sent after three
heavy ref2va requests (two abandoned: cancel by id, stream closed) finishes before the first heavy
request has even started its last file; before, it waited for every file of the first."""

import io
import json
import sqlite3
from contextlib import closing

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from PIL import Image

from client.api import H3Error
from h3_core.serving.shared.registry import DATABASE_FILE, ENCODER_INSTANCE, server_folder

from .serving import tensor
from .videos_api_serving import wait_for

FILES = 9  # the most reference images a request may send
HEAVY_SIDE = (4500, 6000)  # 27 MP: 9 of them, 243 MP, are just under the shipped 250 MP budget


def heavy_png() -> bytes:
    """One 27 MP PNG (a flat colour: a small file that decodes to 81 MB)."""
    out = io.BytesIO()
    Image.new("RGB", HEAVY_SIDE[::-1], (90, 120, 200)).save(out, format="PNG")
    return out.getvalue()


def heavy_inputs(data: bytes) -> list:
    return [
        tensor("PROMPT", np.array([[b"a heavy one"]], dtype=object), "BYTES"),
        tensor("NUM_INFERENCE_STEPS", np.array([[2]], dtype=np.int64), "INT64"),
        tensor("REFERENCE_IMAGES", np.array([[data] * FILES], dtype=object), "BYTES"),
    ]


def started(server, request_id: str, index: int) -> bool:
    return f"h3_encoder: request {request_id} decoding REFERENCE_IMAGES[{index}] " in server.log_text()


def held(server, request_id: str) -> bool:
    """Whether h3_encoder holds `request_id` in the server's registry (live on ENCODER_INSTANCE)."""
    with closing(sqlite3.connect(server_folder(server.pid) / DATABASE_FILE)) as db:
        row = db.execute(
            "SELECT 1 FROM live WHERE request_id = ? AND instance = ?", (request_id, ENCODER_INSTANCE)
        ).fetchone()
    return row is not None


def test_a_light_request_finishes_before_a_heavy_ones_files_are_decoded(server, client):
    data, streams, outcomes = heavy_png(), {}, {}
    # sent one by one, each once the one before holds its place (three streams reach the encoder in
    # no set order): heavy-1 and heavy-2 decoding in the two media workers, heavy-3 held, waiting
    for name, arrived in (("heavy-1", "decoding"), ("heavy-2", "decoding"), ("heavy-3", "held")):
        stream = grpcclient.InferenceServerClient(server.grpc_url)
        stream.start_stream(callback=lambda result, error, name=name: outcomes.setdefault(name, []).append(error))
        stream.async_stream_infer("h3_pipeline", heavy_inputs(data), request_id=name)
        streams[name] = stream
        if arrived == "decoding":
            wait_for(lambda name=name: started(server, name, 0), 120, f"{name}'s first file")
        else:
            wait_for(lambda name=name: held(server, name), 120, f"{name} held by h3_encoder")
    try:
        # heavy-2 (decoding) and heavy-3 (waiting for a worker) are abandoned: held, so "cancelled"
        assert [client.cancel(name) for name in ("heavy-2", "heavy-3")] == ["cancelled", "cancelled"]
        for name in ("heavy-2", "heavy-3"):
            streams.pop(name).stop_stream(cancel_requests=True)
        (light,) = client.generate("a light one", height=32, width=32, num_frames=5, num_inference_steps=2, seed=1)
        assert not started(server, "heavy-1", FILES - 1)  # the order: heavy-1 has files left to decode
        assert light.info["num_frames"] == 5
        assert client.cancel("heavy-1") == "cancelled"
        ended = wait_for(lambda: outcomes.get("heavy-1"), 120, "heavy-1's end")
        assert "CANCELLED: request heavy-1 cancelled by request while its media were decoded (before " in str(ended[0])
    finally:
        for stream in streams.values():
            stream.stop_stream(cancel_requests=True)
    for name in ("heavy-1", "heavy-2", "heavy-3"):  # each stops before its next file
        ended = f"h3_encoder: request {name} refused: CANCELLED: request {name} cancelled by request while"
        wait_for(lambda ended=ended: ended in server.log_text(), 120, f"{name}'s end")
    assert not started(server, "heavy-1", FILES - 1) and not started(server, "heavy-3", 0)
    # the ids left the encoder: a new cancel finds them finished
    assert [client.cancel(name) for name in ("heavy-1", "heavy-2", "heavy-3")] == ["finished"] * 3


def test_a_request_over_its_decode_budget_is_refused_naming_it(client):
    image = heavy_png()
    with pytest.raises(H3Error) as refused:  # 10 x 27 MP would pass 250 MP; 9 + a 4th 27 MP guide do
        client.generate("too much", num_inference_steps=1, reference_images=[image] * 9, guides=[(image, 0)])
    assert refused.value.code == "INVALID_ARG"
    assert refused.value.message.endswith(
        "REFERENCE_IMAGES[8]: the request's media decode to more than max_decoded_pixels=250000000 pixels (the decode "
        "budget of one request: images and video frames in all, at their stored size)"
    )
    (after,) = client.generate("after", num_frames=5, height=32, width=32, num_inference_steps=1)
    assert json.loads(json.dumps(after.info))["kind"] == "result"
