"""Client-side error handling without a server."""
import pytest
from tritonclient.utils import InferenceServerException

from client.api import H3Client, H3Error


def test_unreachable_server_is_unavailable():
    with pytest.raises(H3Error) as info:
        H3Client("127.0.0.1:1", timeout_s=30).generate("x", num_inference_steps=1)
    assert info.value.code == "UNAVAILABLE"  # whichever of gRPC's two reports arrives first


def test_seed_outside_int64_is_refused_before_sending():
    with pytest.raises(H3Error) as info:
        H3Client("127.0.0.1:1").generate("x", seed=2**64)
    assert info.value.code == "INVALID_ARG"
    assert info.value.message == "SEED=18446744073709551616 does not fit INT64 (-9223372036854775808..9223372036854775807)"


@pytest.mark.parametrize("text,code", [
    ("in ensemble 'h3_pipeline', INVALID_ARG: height=33 is out of range", "INVALID_ARG"),
    ("Stream removed (Socket closed)", "UNAVAILABLE"),
    ("something else", "UNKNOWN"),
])
def test_server_messages_are_classified(text, code):
    assert H3Error.from_server(InferenceServerException(msg=text)).code == code


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=None), "prompt must be str or bytes, got NoneType None"),
    (dict(num_inference_steps=2.9), "num_inference_steps must be int or None, got float 2.9"),
    (dict(seed=True), "seed must be int or None, got bool True"),
    (dict(height="64"), "height must be int or None, got str '64'"),
    (dict(return_mp4="false"), "return_mp4 must be bool, got str 'false'"),
    (dict(return_frames=1), "return_frames must be bool, got int 1"),
    (dict(progress_every=None), "progress_every must be int, got NoneType None"),
    (dict(deadline_s="5"), "deadline_s must be number or None, got str '5'"),
    (dict(request_id=7), "request_id must be str, got int 7"),
])
def test_wrong_python_types_are_refused_before_sending(kwargs, message):
    """tritonclient would send 2.9 as 2 steps and "false" as true; the client refuses first (the
    url is unreachable, so anything sent would end in UNAVAILABLE instead)."""
    kwargs = {"prompt": "a", **kwargs}
    with pytest.raises(TypeError) as raised:
        H3Client("127.0.0.1:1", timeout_s=5).generate(kwargs.pop("prompt"), **kwargs)
    assert str(raised.value) == message


def test_numpy_integers_pass_the_type_checks():
    import numpy as np

    with pytest.raises(H3Error) as raised:  # checks passed: the request reached the transport
        H3Client("127.0.0.1:1", timeout_s=5).generate("a", num_inference_steps=np.int64(2), progress_every=np.int32(1))
    assert raised.value.code == "UNAVAILABLE"


def test_client_settings_are_checked():
    with pytest.raises(ValueError, match=r"^url must be host:port without a scheme, got 'http://127.0.0.1:8001'$"):
        H3Client("http://127.0.0.1:8001")
    with pytest.raises(ValueError, match=r"^timeout_s must be > 0 seconds, got 0$"):
        H3Client(timeout_s=0)
    with pytest.raises(TypeError, match=r"^timeout_s must be number, got str '5'$"):
        H3Client(timeout_s="5")


@pytest.mark.parametrize("flags, message", [
    (["--timeout", "-1"], "--timeout must be > 0 seconds, got -1"),
    (["--out", "."], "--out . is a folder; give a file path"),
    (["--wav", "."], "--wav . is a folder; give a file path"),
])
def test_generate_cli_refuses_bad_flags_before_sending(flags, message, capsys):
    from client.generate import main

    argv = ["--prompt", "a", "--out", "clip.mp4", "--url", "127.0.0.1:1", *flags]
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m client.generate: error: {message}"
