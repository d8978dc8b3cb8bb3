"""One place for each request rule (issue 46 item 4): a table of bad values, each refused by one
field rule of h3_core.rules (or the request model's data: URL rule), run in-process through every
entry point that takes the field: the core's validate_request, the Triton request parameters
(h3_encoder and h3_dit), h3_dit's admission of REQUEST's fields, the request model's format
readers, the Videos API's create fields, H3Client and the CLI's flags. Each refuses in its wire's
words and code (INVALID_ARG, the Videos API's 400 error body naming its field, RequestError at the
sender's path, TypeError / H3Error / argparse's exit 2), and each keeps the rule's own error in its
exception chain: the same rule, with the same words, refused it. No tritonserver."""

from types import SimpleNamespace

import numpy as np
import pytest

from client import generate as cli
from client.api import H3Client
from client.errors import H3Error
from h3_core import protocol, rules
from h3_core.config import get_config
from h3_core.diffusion.request import GenerationRequest, RequestLimits, validate_request
from h3_core.request_model import RequestError, read_sglang, read_uri, read_vllm_omni
from h3_core.serving.dit.admission import parse
from h3_core.serving.dit.events import Arrival
from h3_core.serving.shared.settings import DitSettings
from videos_api import formats
from videos_api.fields import ApiError, parse_create

INT64 = f"({-(2**63)}..{2**63 - 1})"
SHIFT_RANGE = "is out of range: allowed 0.01..100.0"
TASKS = "is not allowed: allowed ['t2va', 'fl2va', 'ref2va']"
BAD_BASE64 = "is not valid base64 after 'data:...;base64,': Only base64 data is allowed"


def rule_error(error: BaseException):
    """The rule's own error in `error`'s chain (itself, its __cause__, ...): the first
    h3_core.rules.InvalidRequest, or the request model's RequestError for a data: URL."""
    seen = error
    while seen is not None and not isinstance(seen, (rules.InvalidRequest, RequestError)):
        seen = seen.__cause__
    return seen


def dit(fields: dict, parameters: str = '{"return_mp4": false}'):
    """h3_dit's admission (parse) of REQUEST `fields`, with a stand-in engine: every check under
    test comes before the engine does any work."""
    cfg = get_config("tiny")
    arrival = Arrival(
        handle=None,
        key=1,
        request_id="r",
        new=True,
        request_json=[],
        text_embeds=np.zeros((1, 1, cfg.text_dim), np.float32),
        parameters_json=parameters,
    )
    engine = SimpleNamespace(dit=SimpleNamespace(cfg=cfg))
    return parse(arrival, fields, 0.0, engine, DitSettings())


def sglang(**fields):
    return read_sglang({"task": "t2va", "prompt": "a", **fields})


def vllm(**fields):
    return read_vllm_omni({"prompt": "a", **fields})


def api(**fields):
    return parse_create({"prompt": "a", **fields}, "h3")


def client(**arguments):
    return H3Client("127.0.0.1:9").generate("a", **arguments)  # refused before any connection


def core(**fields):
    values = dict(prompt="a", height=32, width=32, num_frames=5, num_inference_steps=1) | fields
    return validate_request(GenerationRequest(**values), RequestLimits())


def flag(kind, text: str):
    return kind(text)


# rule words -> [(entry point, call, the exception type, its exact text, the Videos API field)]
TABLE = {
    rules.MUST_BE_INTEGER: [
        ("request model: vLLM-Omni", lambda: vllm(num_inference_steps="2.5"), RequestError,
         "num_inference_steps: '2.5' must be an integer", None),
        ("request model: SGLang", lambda: sglang(seed=2.5), RequestError, "seed: 2.5 must be an integer", None),
        ("Videos API", lambda: api(num_inference_steps=2.5), ApiError,
         "INVALID_ARG: num_inference_steps=2.5 must be an integer", "num_inference_steps"),
        ("Videos API", lambda: api(n="two"), ApiError, "INVALID_ARG: n='two' must be an integer", "n"),
        ("h3_dit admission", lambda: dit({"num_inference_steps": 2.5}), ValueError,
         "num_inference_steps must be an integer, got 2.5", None),
        ("H3Client", lambda: client(num_inference_steps=2.5), TypeError,
         "num_inference_steps must be int or None, got float 2.5", None),
        ("CLI", lambda: flag(cli.POSITIVE, "2.5"), cli.argparse.ArgumentTypeError,
         "must be an integer >= 1, got '2.5'", None),
    ],
    rules.DOES_NOT_FIT_INT64: [
        ("request model: SGLang", lambda: sglang(seed=2**64), RequestError,
         f"seed: {2**64} does not fit INT64 {INT64}", None),
        ("Videos API", lambda: api(preview_every=str(2**63)), ApiError,
         f"INVALID_ARG: preview_every={2**63} does not fit INT64 {INT64}", "preview_every"),
        ("H3Client", lambda: client(seed=2**64), H3Error, f"INVALID_ARG: SEED={2**64} does not fit INT64 {INT64}",
         None),
    ],
    "is out of range: allowed >= ": [
        ("Triton request parameters", lambda: protocol.check_request_parameters('{"progress_every": -1}'),
         ValueError, "progress_every=-1 is out of range: allowed >= 0", None),
        ("request model: SGLang", lambda: sglang(target={"short_edge": 0}), RequestError,
         "target.short_edge: 0 is out of range: allowed >= 1", None),
        ("CLI", lambda: flag(cli.NON_NEGATIVE, "-1"), cli.argparse.ArgumentTypeError,
         "must be an integer >= 0, got '-1'", None),
    ],
    "is out of range: allowed ": [  # LOW..HIGH
        ("core validate_request", lambda: core(num_inference_steps=0), ValueError,
         "num_inference_steps=0 is out of range: allowed 1..50", None),
        ("core validate_request", lambda: core(num_outputs=5), ValueError,
         "num_outputs=5 is out of range: allowed 1..4", None),
        ("h3_dit admission", lambda: dit({}, '{"return_mp4": false, "request_priority": 101}'), ValueError,
         "request_priority=101 is out of range: allowed -100..100 (priority_max)", None),
    ],
    rules.MUST_BE_SECONDS: [
        ("Videos API", lambda: api(seconds="0"), ApiError, "INVALID_ARG: seconds='0' must be a number of seconds > 0",
         "seconds"),
        ("Videos API", lambda: api(seconds="nan"), ApiError,
         "INVALID_ARG: seconds='nan' must be a number of seconds > 0", "seconds"),
        ("CLI", lambda: flag(cli.SECONDS, "nan"), cli.argparse.ArgumentTypeError,
         "must be a number of seconds > 0, got 'nan'", None),
    ],
    "must be a finite number ": [
        ("request model: SGLang", lambda: sglang(target={"duration_seconds": 0}), RequestError,
         "target.duration_seconds: 0 must be a finite number > 0", None),
        ("request model: vLLM-Omni", lambda: vllm(extra_params='{"duration": -1}'), RequestError,
         "extra_params.duration: -1 must be a finite number > 0", None),
        ("CLI", lambda: flag(cli.CACHE_THRESHOLD, "-0.1"), cli.argparse.ArgumentTypeError,
         "must be a finite number >= 0, got '-0.1'", None),
    ],
    rules.MUST_BE_NUMBER: [
        ("Videos API", lambda: api(flow_shift="fast"), ApiError, "INVALID_ARG: flow_shift='fast' must be a number",
         "flow_shift"),
        ("h3_dit admission", lambda: dit({"encode_seconds": [1]}), ValueError,
         "encode_seconds must be a number, got [1]", None),
        ("H3Client", lambda: client(flow_shift="5"), TypeError, "flow_shift must be number or None, got str '5'", None),
    ],
    SHIFT_RANGE: [
        ("Triton request parameters", lambda: protocol.check_request_parameters('{"flow_shift": 0}'), ValueError,
         f"flow_shift=0 {SHIFT_RANGE}", None),
        ("request model: vLLM-Omni", lambda: vllm(flow_shift="200"), RequestError,
         f"flow_shift: 200.0 {SHIFT_RANGE}", None),
        ("CLI", lambda: flag(cli.SHIFT, "0"), cli.argparse.ArgumentTypeError,
         "must be a number from 0.01 to 100, got '0'", None),
    ],
    TASKS: [
        ("core check_task", lambda: rules.check_task("i2v", []), ValueError, f"task='i2v' {TASKS}", None),
        ("Triton h3_encoder / h3_dit (TASK)", lambda: protocol.check_task("i2v", []), ValueError,
         f"TASK='i2v' {TASKS}", None),
        ("request model: SGLang", lambda: sglang(task="i2v"), RequestError, f"task: 'i2v' {TASKS}", None),
        ("request model: vLLM-Omni", lambda: vllm(extra_params='{"task": "i2v"}'), RequestError,
         f"extra_params.task: 'i2v' {TASKS}", None),
    ],
    "is not allowed: allowed ['crop', 'pad', 'stretch']": [
        ("Triton request parameters", lambda: protocol.check_request_parameters('{"fit": "zoom"}'), ValueError,
         "fit='zoom' is not allowed: allowed ['crop', 'pad', 'stretch']", None),
    ],
    "is not served here; allowed: 'h3'": [
        ("Videos API", lambda: api(model="sora-2"), ApiError,
         "INVALID_ARG: model='sora-2' is not served here; allowed: 'h3'", "model"),
        ("Videos API: SGLang's format", lambda: formats.read({"model": "sora-2", "target": {}}, False, "h3"), ApiError,
         "INVALID_ARG: model: 'sora-2' is not served here; allowed: 'h3'", "model"),
    ],
    rules.PROMPT_REQUIRED: [
        ("request model: vLLM-Omni", lambda: read_vllm_omni({}), RequestError,
         "prompt: is required and must be a string", None),
        ("Videos API", lambda: parse_create({"prompt": 3}, "h3"), ApiError,
         "INVALID_ARG: prompt is required and must be a string", "prompt"),
    ],
    BAD_BASE64: [
        ("request model: read_uri", lambda: read_uri("conditions[0].uri", "data:image/png;base64,@@", {}),
         RequestError, f"conditions[0].uri: {BAD_BASE64}", None),
        ("Videos API", lambda: api(last_frame="data:image/png;base64,@@"), ApiError,
         f"INVALID_ARG: last_frame {BAD_BASE64}", "last_frame"),
    ],
}  # fmt: skip
CASES = [(words, *case) for words, cases in TABLE.items() for case in cases]


@pytest.mark.parametrize("words, entry, call, kind, text, field", CASES, ids=[f"{c[1]}: {c[5]}" for c in CASES])
def test_each_entry_point_refuses_by_the_one_rule_in_its_wires_words(words, entry, call, kind, text, field):
    with pytest.raises(Exception) as caught:
        call()
    error = caught.value
    assert isinstance(error, kind) and str(error) == text, f"{entry}: {type(error).__name__}: {error}"
    rule = rule_error(error)
    assert rule is not None, f"{entry}: the rule's error is not in the chain of {error!r}"
    if isinstance(rule, rules.InvalidValue):
        assert rule.reason.startswith(words), (entry, rule.reason)
        # the rule's words, as they are, unless the entry point's own words are pinned (a flag's
        # "must be an integer >= 1", H3Client's TypeError "must be int")
        assert rule.reason in text or kind in (TypeError, cli.argparse.ArgumentTypeError), (entry, rule.reason)
    else:  # the prompt and data: URL rules: no value to show
        assert words in str(rule), (entry, str(rule))
    if kind is ApiError:  # OpenAI's error shape, naming the API field
        assert (error.status, error.body()) == (
            400,
            {"error": {"message": text, "type": "invalid_request_error", "param": field, "code": "INVALID_ARG"}},
        )


def test_the_table_covers_every_entry_point_and_every_rule_reaches_several():
    entries = {entry.split(":")[0] for _, entry, *_ in CASES}
    assert entries >= {
        "core validate_request",
        "Triton request parameters",
        "Triton h3_encoder / h3_dit (TASK)",
        "h3_dit admission",
        "request model",
        "Videos API",
        "H3Client",
        "CLI",
    }
    assert [words for words, cases in TABLE.items() if len({entry for entry, *_ in cases}) < 2] == [
        "is not allowed: allowed ['crop', 'pad', 'stretch']"
    ]


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--steps", "2.5"], "argument --steps: must be an integer >= 1, got '2.5'"),
        (["--deadline", "nan"], "argument --deadline: must be a number of seconds > 0, got 'nan'"),
        (["--cache-threshold", "-0.1"], "argument --cache-threshold: must be a finite number >= 0, got '-0.1'"),
        (["--guide", "g.png@-1"], "argument --guide: must be IMAGE@FRAME with FRAME an integer >= 0, got 'g.png@-1'"),
    ],
)
def test_the_cli_ends_a_refused_flag_with_status_2_and_one_line(argv, line, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(["--prompt", "a", "--out", str(tmp_path / "a.mp4"), *argv])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m client.generate: error: {line}"
