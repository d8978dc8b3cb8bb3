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
