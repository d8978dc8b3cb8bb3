"""Bad input, end to end through tritonclient (session server: tiny config, max_steps 400).

Every kind gets one final response whose message (client.api.H3Error: Triton's "in ensemble
'h3_pipeline', " and "[request id: ...] " prefixes removed) starts with INVALID_ARG: and names
the field; afterwards the same normal request returns FRAMES and AUDIO byte-identical to the
first one of this module, and no model process was replaced. Every stream has a timeout.
"""

import json
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.api import H3Client, H3Error
from server.process import stub_pids

from .serving import idle_metrics, raw_stream, tensor

NORMAL = dict(
    prompt="a red ball rolls to the left",
    height=64,
    width=64,
    num_frames=9,
    num_inference_steps=2,
    seed=5,
    return_frames=True,
    return_audio=True,
)
SEQUENCE_END = (
    "sequence_end must not be set: a request runs over many iterations and Triton 2.51 would drop it "
    "after the first (perf_analyzer: --request-parameter sequence_end:false:bool)"
)


@pytest.fixture(scope="module")
def reference(server):
    """The first normal request of this module and the model processes at that time."""
    return H3Client(server.grpc_url, idle_timeout_s=120).generate(**NORMAL)[0], stub_pids(server.pid)


def prompt(value=b"a red ball"):
    return tensor("PROMPT", np.array([[value]], dtype=object), "BYTES")


def int64(name, value):
    return tensor(name, np.array([[value]], dtype=np.int64), "INT64")


TEXT = np.zeros((1, 3, 384), dtype=np.float32)  # a valid TEXT_EMBEDS of the tiny config


NO_CONDITIONS = np.zeros((1, 0), dtype=np.float32)  # the CONDITION_LATENTS of a t2va or control request


def dit_inputs(text=TEXT, fields=b'{"num_inference_steps": 2}', conditions=NO_CONDITIONS):
    """TEXT_EMBEDS, CONDITION_LATENTS and REQUEST (JSON bytes, or an object array of them) for
    h3_dit called directly."""
    fields = fields if isinstance(fields, np.ndarray) else np.array([[fields]], dtype=object)
    return [
        tensor("TEXT_EMBEDS", text, "FP32"),
        tensor("CONDITION_LATENTS", conditions, "FP32"),
        tensor("REQUEST", fields, "BYTES"),
    ]


def raw_error(server, inputs, **kwargs) -> H3Error:
    responses, error = raw_stream(server.grpc_url, inputs, **kwargs)
    assert error is not None, f"no error, {len(responses)} responses"
    return error


def client_error(client, **kwargs) -> H3Error:
    with pytest.raises(H3Error) as info:
        client.generate(**{"prompt": "a red ball", "num_inference_steps": 2, **kwargs})
    return info.value


CASES = {
    # prompt
    "empty_prompt": (lambda s, c: client_error(c, prompt=""), "prompt must be a non-empty string, got ''"),
    "whitespace_prompt": (
        lambda s, c: client_error(c, prompt=" \t\n "),
        "prompt must contain visible characters, got ' \\t\\n '",
    ),
    "zero_width_prompt": (
        lambda s, c: client_error(c, prompt="\u200b\u200b"),
        "prompt must contain visible characters, got '\\u200b\\u200b'",
    ),
    "prompt_over_256_tokens": (
        lambda s, c: client_error(c, prompt="word " * 300),
        "prompt has 302 tokens; the text encoder accepts at most 256",
    ),
    "prompt_over_4096_bytes": (
        lambda s, c: client_error(c, prompt="a" * 5000),
        "prompt is 5000 bytes: allowed 1..4096",
    ),
    "prompt_not_utf8": (
        lambda s, c: client_error(c, prompt=b"\xff\xfe a ball"),
        "prompt is not valid UTF-8 (invalid start byte at byte 0)",
    ),
    "missing_prompt": (lambda s, c: raw_error(s, [int64("HEIGHT", 64)]), "PROMPT is required"),
    # data type and shape (Triton refuses these before any model runs)
    "prompt_wrong_dtype": (
        lambda s, c: raw_error(s, [tensor("PROMPT", np.array([[1]], dtype=np.int64), "INT64")]),
        "inference input 'PROMPT' data-type is 'INT64', but model 'h3_pipeline' expects 'BYTES'",
    ),
    "height_wrong_dtype": (
        lambda s, c: raw_error(s, [prompt(), tensor("HEIGHT", np.array([[64]], dtype=np.int32), "INT32")]),
        "inference input 'HEIGHT' data-type is 'INT32', but model 'h3_pipeline' expects 'INT64'",
    ),
    "seed_beyond_int64_as_uint64": (
        lambda s, c: raw_error(s, [prompt(), tensor("SEED", np.array([[2**64 - 1]], dtype=np.uint64), "UINT64")]),
        "inference input 'SEED' data-type is 'UINT64', but model 'h3_pipeline' expects 'INT64'",
    ),
    "height_two_values": (
        lambda s, c: raw_error(s, [prompt(), tensor("HEIGHT", np.array([[64, 64]], dtype=np.int64), "INT64")]),
        "unexpected shape for input 'HEIGHT' for model 'h3_pipeline'. Expected [-1,1], got [1,2].",
    ),
    "prompt_without_batch_dimension": (
        lambda s, c: raw_error(s, [tensor("PROMPT", np.array([b"x"], dtype=object), "BYTES")]),
        "unexpected shape for input 'PROMPT' for model 'h3_pipeline'. Expected [-1,1], got [1].",
    ),
    "prompt_batch_of_two": (
        lambda s, c: raw_error(s, [tensor("PROMPT", np.array([[b"x"], [b"y"]], dtype=object), "BYTES")]),
        "inference request batch-size must be <= 1 for 'h3_pipeline'",
    ),
    "unknown_input": (
        lambda s, c: raw_error(s, [prompt(), int64("COLOUR", 3)]),
        "unexpected inference input 'COLOUR' for model 'h3_pipeline'",
    ),
    "output_that_does_not_exist": (
        lambda s, c: raw_error(s, [prompt()], outputs=[grpcclient.InferRequestedOutput("NOPE")]),
        "unexpected inference output 'NOPE' for model 'h3_pipeline'",
    ),
    # request fields
    "width_not_multiple_of_32": (
        lambda s, c: client_error(c, width=100),
        "width=100 is out of range: allowed multiples of 32 in 32..256",
    ),
    "height_zero": (
        lambda s, c: client_error(c, height=0),
        "height=0 is out of range: allowed multiples of 32 in 32..256",
    ),
    "width_negative": (
        lambda s, c: client_error(c, width=-32),
        "width=-32 is out of range: allowed multiples of 32 in 32..256",
    ),
    "height_beyond_maximum": (
        lambda s, c: client_error(c, height=288),
        "height=288 is out of range: allowed multiples of 32 in 32..256",
    ),
    "num_frames_zero": (
        lambda s, c: client_error(c, num_frames=0),
        "num_frames=0 is out of range: allowed 1..124 (NUM_FRAMES; the clip is aligned up to 17n+5 frames, at most "
        "max_num_frames=124)",
    ),
    "num_frames_beyond_maximum": (
        lambda s, c: client_error(c, num_frames=125),
        "num_frames=125 is out of range: allowed 1..124 (NUM_FRAMES; the clip is aligned up to 17n+5 frames, at "
        "most max_num_frames=124)",
    ),
    "steps_zero": (
        lambda s, c: client_error(c, num_inference_steps=0),
        "num_inference_steps=0 is out of range: allowed 1..400",
    ),
    "steps_beyond_maximum": (
        lambda s, c: client_error(c, num_inference_steps=401),
        "num_inference_steps=401 is out of range: allowed 1..400",
    ),
    "seed_negative": (lambda s, c: client_error(c, seed=-1), "seed=-1 is out of range: allowed 0..9223372036854775807"),
    "seed_plus_outputs_beyond_int64": (
        lambda s, c: client_error(c, seed=2**63 - 1, num_outputs=2),
        "seed=9223372036854775807 is out of range: allowed 0..9223372036854775806",
    ),
    "num_outputs_zero": (lambda s, c: client_error(c, num_outputs=0), "num_outputs=0 is out of range: allowed 1..4"),
    "num_outputs_beyond_maximum": (
        lambda s, c: client_error(c, num_outputs=5),
        "num_outputs=5 is out of range: allowed 1..4",
    ),
    "rows_over_budget": (
        lambda s, c: client_error(c, height=256, width=256, num_frames=121, num_outputs=2),
        "rows=5632 is out of range: allowed 1..4096 (max_batch_rows)",
    ),
    # request parameters
    "unknown_parameter": (
        lambda s, c: raw_error(s, [prompt()], parameters={"colour": "red"}),
        "request parameter 'colour' is unknown; allowed: ['audio_flow_shift', 'cache_threshold', 'deadline_s', 'fit', "
        "'flow_shift', 'inject_fault', 'keepalive', 'preview_every', 'progress_every', 'ref_kv_refresh', "
        "'request_priority', 'return_audio', 'return_frames', 'return_mp4']",
    ),
    "progress_every_wrong_type": (
        lambda s, c: raw_error(s, [prompt()], parameters={"progress_every": "x"}),
        "request parameter 'progress_every' must be int, got 'x'",
    ),
    "return_frames_wrong_type": (
        lambda s, c: raw_error(s, [prompt()], parameters={"return_frames": 1}),
        "request parameter 'return_frames' must be bool, got 1",
    ),
    "return_mp4_wrong_type": (
        lambda s, c: raw_error(s, [prompt()], parameters={"return_mp4": 1}),
        "request parameter 'return_mp4' must be bool, got 1",
    ),
    "progress_every_negative": (
        lambda s, c: client_error(c, progress_every=-1),
        "progress_every=-1 is out of range: allowed >= 0",
    ),
    "cache_threshold_above_max": (
        lambda s, c: raw_error(s, [prompt()], parameters={"cache_threshold": 0.9}),
        "cache_threshold=0.9 is out of range: allowed 0..0.5 (max_cache_threshold)",
    ),
    "ref_kv_refresh_above_max": (  # the shipped max_ref_kv_refresh is 1: reference reuse off
        lambda s, c: raw_error(s, [prompt()], parameters={"ref_kv_refresh": 2}),
        "ref_kv_refresh=2 is out of range: allowed 1..1 (max_ref_kv_refresh)",
    ),
    # below 0.01 the float32 schedule is wrong (1e-5) or NaN at step 1 (1e-8): refused
    "flow_shift_below_float32_arithmetic": (
        lambda s, c: raw_error(s, [prompt()], parameters={"flow_shift": 1e-8}),
        "flow_shift=1e-08 is out of range: allowed 0.01..100.0",
    ),
    "audio_flow_shift_below_float32_arithmetic": (
        lambda s, c: client_error(c, audio_flow_shift=1e-5),
        "audio_flow_shift=1e-05 is out of range: allowed 0.01..100.0",
    ),
    "deadline_zero": (
        lambda s, c: raw_error(s, [prompt()], parameters={"deadline_s": 0}),
        "deadline_s=0 is out of range: allowed finite > 0 seconds",
    ),
    "deadline_infinite": (
        lambda s, c: raw_error(s, [prompt()], parameters={"deadline_s": float("inf")}),
        "deadline_s=inf is out of range: allowed finite > 0 seconds",
    ),
    "inject_fault_when_off": (
        lambda s, c: client_error(c, inject_fault="raise"),
        "request parameter 'inject_fault' is refused: h3_dit parameter allow_fault_injection is not 'true'",
    ),
    # sequence flags (never needed: the DiT's iterative sequencer assigns an id)
    "sequence_end_with_id": (
        lambda s, c: raw_error(s, [prompt()], sequence_id=9_100_001, sequence_start=True, sequence_end=True),
        SEQUENCE_END,
    ),
    "sequence_id_without_start": (
        lambda s, c: raw_error(s, [prompt()], sequence_id=9_100_002),
        "inference request for sequence 9100002 to model 'h3_dit' must specify the START flag on "
        "the first request of the sequence",
    ),
    # h3_dit called directly
    "dit_request_not_json": (
        lambda s, c: raw_error(s, dit_inputs(fields=b"{height: 64"), model="h3_dit"),
        "REQUEST is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    ),
    "dit_request_not_an_object": (
        lambda s, c: raw_error(s, dit_inputs(fields=b"[64]"), model="h3_dit"),
        "REQUEST must hold one JSON object, got list",
    ),
    "dit_field_wrong_type": (
        lambda s, c: raw_error(s, dit_inputs(fields=b'{"height": "64"}'), model="h3_dit"),
        "height must be an integer, got '64'",
    ),
    "dit_text_embeds_not_finite": (
        lambda s, c: raw_error(s, dit_inputs(text=np.full((1, 3, 384), np.nan, dtype=np.float32)), model="h3_dit"),
        "TEXT_EMBEDS holds non-finite values",
    ),
    "dit_text_embeds_wrong_width": (
        lambda s, c: raw_error(s, dit_inputs(text=np.zeros((1, 3, 100), dtype=np.float32)), model="h3_dit"),
        "text_embeds has shape (3, 100); expected [L >= 1, 384]",
    ),
    "dit_batch_of_two": (
        lambda s, c: raw_error(
            s,
            dit_inputs(
                text=np.zeros((2, 3, 384), dtype=np.float32),
                fields=np.array([[b"{}"], [b"{}"]], dtype=object),
                conditions=np.zeros((2, 0), dtype=np.float32),
            ),
            model="h3_dit",
        ),
        "inference request to model 'h3_dit' must specify batch-size 1 due to requirements of sequence batcher",
    ),
    "dit_inputs_of_different_batch_sizes": (
        lambda s, c: raw_error(s, dit_inputs(text=np.zeros((2, 3, 384), dtype=np.float32)), model="h3_dit"),
        "input 'TEXT_EMBEDS' batch size does not match other inputs for 'h3_dit'",
    ),
    "dit_encode_seconds_wrong_type": (
        lambda s, c: raw_error(s, dit_inputs(fields=b'{"encode_seconds": [1]}'), model="h3_dit"),
        "encode_seconds must be a number, got [1]",
    ),
    "dit_encode_seconds_negative": (
        lambda s, c: raw_error(s, dit_inputs(fields=b'{"encode_seconds": -1}'), model="h3_dit"),
        "encode_seconds=-1 is out of range: allowed finite >= 0 seconds",
    ),
    "dit_encode_seconds_nan": (
        lambda s, c: raw_error(s, dit_inputs(fields=b'{"encode_seconds": NaN}'), model="h3_dit"),
        "encode_seconds=nan is out of range: allowed finite >= 0 seconds",
    ),
}


@pytest.mark.parametrize("kind", CASES)
def test_bad_input_is_refused_and_harms_nothing(server, client, reference, kind):
    send, message = CASES[kind]
    error = send(server, client)
    assert error.code == "INVALID_ARG"
    assert error.message.startswith(message), error.message
    after = client.generate(**NORMAL)[0]
    assert after.frames.tobytes() == reference[0].frames.tobytes()
    assert after.audio.tobytes() == reference[0].audio.tobytes()


FIELD_NAMES = (
    "['audio_sigmas', 'conditions', 'encode_seconds', 'geometry', 'height', 'lora', 'num_frames', "
    "'num_inference_steps', 'num_outputs', 'outside_training', 'received_unix_s', 'seed', 'task', 'video_sigmas', "
    "'vision_spans', 'width'], "
    "or 'cancel_request_id' alone (a cancel request)"
)
NO_TEXT = np.zeros((1, 0, 0), dtype=np.float32)  # the TEXT_EMBEDS of a cancel request (client.api.H3Client.cancel)
DIT_CASES = {  # h3_dit called directly: (TEXT_EMBEDS, REQUEST, the whole message after "INVALID_ARG: ")
    "text_embeds_empty": (
        NO_TEXT,
        b'{"num_inference_steps": 2}',
        "text_embeds has shape (0, 0); expected [L >= 1, 384]",
    ),
    "text_embeds_zero_width": (
        np.zeros((1, 3, 0), dtype=np.float32),
        b"{}",
        "text_embeds has shape (3, 0); expected [L >= 1, 384]",
    ),
    "text_embeds_no_tokens": (
        np.zeros((1, 0, 384), dtype=np.float32),
        b"{}",
        "text_embeds has shape (0, 384); expected [L >= 1, 384]",
    ),
    "text_embeds_narrow": (
        np.zeros((1, 3, 7), dtype=np.float32),
        b"{}",
        "text_embeds has shape (3, 7); expected [L >= 1, 384]",
    ),
    "unknown_field": (
        np.zeros((1, 3, 384), dtype=np.float32),
        b'{"colour": 1}',
        f"REQUEST field 'colour' is unknown; allowed: {FIELD_NAMES}",
    ),
    "field_name_typo": (
        np.zeros((1, 3, 384), dtype=np.float32),
        b'{"num_inference_step": 2}',
        f"REQUEST field 'num_inference_step' is unknown; allowed: {FIELD_NAMES}",
    ),
    "cancel_with_another_field": (
        NO_TEXT,
        b'{"cancel_request_id": "x-1", "height": 64}',
        "REQUEST field 'height' is not allowed beside 'cancel_request_id': a cancel request holds that field alone",
    ),
    "cancel_id_number": (
        NO_TEXT,
        b'{"cancel_request_id": 5}',
        "cancel_request_id must be a non-empty string, got number 5",
    ),
    "cancel_id_null": (
        NO_TEXT,
        b'{"cancel_request_id": null}',
        "cancel_request_id must be a non-empty string, got null",
    ),
    "cancel_id_empty": (
        NO_TEXT,
        b'{"cancel_request_id": ""}',
        "cancel_request_id must be a non-empty string, got an empty string",
    ),
    "cancel_id_boolean": (
        NO_TEXT,
        b'{"cancel_request_id": true}',
        "cancel_request_id must be a non-empty string, got boolean true",
    ),
    "cancel_id_array": (
        NO_TEXT,
        b'{"cancel_request_id": ["x-1"]}',
        'cancel_request_id must be a non-empty string, got array ["x-1"]',
    ),
}


@pytest.mark.parametrize("kind", DIT_CASES)
def test_bad_direct_dit_request_is_refused_and_harms_nothing(server, client, reference, kind):
    text, fields, message = DIT_CASES[kind]
    responses, error = raw_stream(server.grpc_url, dit_inputs(text=text, fields=fields), model="h3_dit")
    assert responses == [] and error is not None
    assert (error.code, error.message) == ("INVALID_ARG", message)
    after = client.generate(**NORMAL)[0]
    assert after.frames.tobytes() == reference[0].frames.tobytes()
    assert after.audio.tobytes() == reference[0].audio.tobytes()


CANCEL_CASES = [  # h3_cancel's REQUEST, the whole message after "INVALID_ARG: "
    (
        b'{"num_inference_steps": 2}',
        "REQUEST must hold 'cancel_request_id' alone (a cancel request); generation goes to h3_pipeline",
    ),
    (b'{"cancel_request_id": "x-1", "height": 64}', DIT_CASES["cancel_with_another_field"][2]),
    (b'{"cancel_request_id": ""}', DIT_CASES["cancel_id_empty"][2]),
    (b'{"cancel_request_id": "' + b"x" * 257 + b'"}', "cancel_request_id has 257 characters: allowed 1..256"),
    (b"[1]", "REQUEST must hold one JSON object, got list"),
    # Triton cuts a request id at a NUL: such a target could never match its request
    (
        b'{"cancel_request_id": "a\\u0000b"}',
        "cancel_request_id holds a NUL character at index 1: not allowed in a request id",
    ),
]


def test_bad_cancel_requests_are_refused_by_h3_cancel_as_by_h3_dit(server):
    """h3_cancel, where clients send their cancels, reads REQUEST with h3_dit's checks
    (protocol.read_request_json) and refuses a generation request's fields too."""
    for fields, message in CANCEL_CASES:
        request = tensor("REQUEST", np.array([[fields]], dtype=object), "BYTES")
        responses, error = raw_stream(server.grpc_url, [request], model="h3_cancel", timeout_s=30)
        assert responses == [] and error is not None
        assert (error.code, error.message) == ("INVALID_ARG", message)


def test_direct_cancel_to_h3_dit_sends_empty_condition_latents(server):
    """The cancel sent straight to h3_dit (README, request_contract.md) carries TEXT_EMBEDS
    [1, 0, 0], CONDITION_LATENTS [1, 0] and REQUEST, and is answered like h3_cancel's; without
    CONDITION_LATENTS (a required input: Triton packs only requests with the same inputs, so it
    stays required) Triton refuses it before h3_dit runs."""
    cancel = b'{"cancel_request_id": "issue-41-never-sent"}'
    responses, error = raw_stream(server.grpc_url, dit_inputs(text=NO_TEXT, fields=cancel), model="h3_dit")
    assert error is None and len(responses) == 1
    info = json.loads(responses[0].as_numpy("INFO").reshape(-1)[0])
    assert info == {"kind": "cancel", "request_id": "issue-41-never-sent", "state": "unknown"}
    without = [item for item in dit_inputs(text=NO_TEXT, fields=cancel) if item.name() != "CONDITION_LATENTS"]
    error = raw_error(server, without, model="h3_dit")
    assert error.message == (
        "expected 3 inputs but got 2 inputs for model 'h3_dit'. Got input(s) ['REQUEST','TEXT_EMBEDS'], but missing "
        "required input(s) ['CONDITION_LATENTS']. Please provide all required input(s)."
    )


def test_bad_direct_dit_requests_leave_a_running_neighbour_bit_identical(server, client):
    # Before TEXT_EMBEDS's shape was checked, [1, 3, 0] raised in parse, the exception left
    # execute() and Triton failed every request of that execute(), the running one included,
    # with a Python traceback naming server paths.
    neighbour = dict(
        prompt="a neighbour",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=400,
        seed=6,
        return_frames=True,
        return_audio=True,
    )
    outcome, steps = {}, []
    thread = threading.Thread(
        target=lambda: outcome.update(
            result=client.generate(**neighbour, progress_every=1, on_progress=lambda step, *_: steps.append(step))
        )
    )
    thread.start()
    deadline = time.monotonic() + 60
    while not steps and time.monotonic() < deadline:
        time.sleep(0.01)
    codes = [
        raw_error(server, dit_inputs(text=np.zeros(shape, dtype=np.float32), fields=fields), model="h3_dit").code
        for shape, fields in (((1, 3, 0), b"{}"), ((1, 0, 0), b"{}"), ((1, 3, 384), b'{"colour": 1}'))
    ]
    refused_at = steps[-1]
    thread.join(120)
    assert codes == ["INVALID_ARG"] * 3
    assert 1 <= refused_at < 400  # the neighbour was denoising while the three were refused
    alone = client.generate(**neighbour)[0]
    assert outcome["result"][0].frames.tobytes() == alone.frames.tobytes()
    assert outcome["result"][0].audio.tobytes() == alone.audio.tobytes()


def test_reused_sequence_id_ends_the_first_request_naming_its_request_id(server, client, reference):
    # Called directly with a sequence_id in use: h3_dit refuses the newcomer and drops the
    # running request, which Triton 2.51 delivers once more; its CANCELLED: final response names
    # its request id (server-assigned h3-<n> here), not the sequence id.
    sequence_id, before = 9_600_001, server.h3_metrics()["h3_cancellations_total"]
    responses, first = queue.Queue(), grpcclient.InferenceServerClient(server.grpc_url)
    first.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        first.async_stream_infer(
            "h3_dit",
            dit_inputs(fields=b'{"num_inference_steps": 400}'),
            parameters={"progress_every": 1},
            sequence_id=sequence_id,
            sequence_start=True,
            enable_empty_final_response=True,
        )
        result, error = responses.get(timeout=60)
        assert error is None
        request_id = json.loads(result.as_numpy("INFO").reshape(-1)[0])["request_id"]
        assert request_id.startswith("h3-") and request_id != f"h3-{sequence_id}"
        error = raw_error(server, dit_inputs(), model="h3_dit", sequence_id=sequence_id, sequence_start=True)
        assert (error.code, error.message) == (
            "INVALID_ARG",
            f"sequence id {sequence_id} belongs to request {request_id}, "
            "which Triton has now ended; do not send sequence_id",
        )
        while True:
            result, error = responses.get(timeout=30)
            assert error is None
            info = json.loads(result.as_numpy("INFO").reshape(-1)[0])
            if info["kind"] not in ("progress", "heartbeat"):  # h3_dit called directly sends heartbeats too
                break
        assert info == {
            "kind": "error",
            "request_id": request_id,
            "code": "CANCELLED",
            "message": f"request {request_id} was dropped: another request reused its sequence id {sequence_id}",
        }
        assert result.get_response().parameters["triton_final_response"].bool_param
    finally:
        first.stop_stream(cancel_requests=True)
        first.close()
    assert idle_metrics(server)["h3_cancellations_total"] == before + 1
    after = client.generate(**NORMAL)[0]
    assert after.frames.tobytes() == reference[0].frames.tobytes()


def test_bad_input_duplicate_request_id_while_running(server, client, reference):
    outcome, running = {}, threading.Event()

    def first():
        try:
            client.generate(
                "the first",
                num_inference_steps=400,
                request_id="dup-1",
                progress_every=1,
                on_progress=lambda *_: running.set(),
            )
        except H3Error as error:
            outcome["first"] = error

    thread = threading.Thread(target=first)
    thread.start()
    assert running.wait(60)
    error = client_error(client, request_id="dup-1")
    assert client.cancel("dup-1") == "cancelled"
    thread.join(60)
    assert error.code == "INVALID_ARG" and error.message == "request id 'dup-1' is already running; ids must be unique"
    assert outcome["first"].code == "CANCELLED"
    after = client.generate(**NORMAL)[0]
    assert after.frames.tobytes() == reference[0].frames.tobytes()


def test_bad_input_sequence_end_without_sequence_id_still_completes(server, reference):
    # Without a sequence_id the ensemble does not pass the flags to h3_dit, so the request runs.
    inputs = [prompt(NORMAL["prompt"].encode())] + [
        int64(name, NORMAL[key])
        for name, key in (
            ("HEIGHT", "height"),
            ("WIDTH", "width"),
            ("NUM_FRAMES", "num_frames"),
            ("NUM_INFERENCE_STEPS", "num_inference_steps"),
            ("SEED", "seed"),
        )
    ]
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("FRAMES", "AUDIO", "INFO")]
    responses, error = raw_stream(
        server.grpc_url,
        inputs,
        outputs=outputs,
        sequence_end=True,
        parameters={"return_frames": True, "return_audio": True},
    )
    assert error is None
    result = next(
        r
        for r in responses
        if r.as_numpy("INFO") is not None and json.loads(r.as_numpy("INFO")[0, 0])["kind"] == "result"
    )
    assert result.as_numpy("FRAMES")[0].tobytes() == reference[0].frames.tobytes()
    assert result.as_numpy("AUDIO")[0].tobytes() == reference[0].audio.tobytes()


def test_bad_input_left_every_model_process_in_place(server, reference):
    assert stub_pids(server.pid) == reference[1]
    assert sorted(reference[1].values()) == ["h3_cancel_0_0", "h3_dit_0_0", "h3_encoder_0_0", "h3_vae_0_0"]
    metrics = idle_metrics(server)
    assert metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0
