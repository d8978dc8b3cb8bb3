"""The one typed generation request (VideoRequest) and the three request formats H3's users send,
read into it: SGLang's H3 JSON (read_sglang), vLLM-Omni's multipart form (read_vllm_omni) and ours,
OpenAI-style (videos_api.formats.from_parsed). Plain Python, no torch: the Videos API, the CLI and
H3Client use it.

    request.py    VideoRequest (Keyframe, Reference), RequestError, and the field checks the
                  readers share (each applies an h3_core.rules field rule at the sender's path)
    sglang.py     read_sglang: SGLang's H3 JSON
    vllm_omni.py  read_vllm_omni: vLLM-Omni's multipart form
    files.py      a request's files: read_uri (data: URLs, multipart parts, http(s) under a
                  UrlPolicy: fetch_url), media_type, media_seconds

Step counts differ by format: ours and vLLM-Omni's num_inference_steps count forwards (DiT
evaluations); SGLang's H3 counts sigma points including the final 0, so its N is N - 1 forwards
(its default 50 is 49). VideoRequest.num_inference_steps always counts forwards.

A refusal is a RequestError (a ValueError) whose `path` is the field in the sender's own terms
("target.duration_seconds", "conditions[1].uri", "extra_params.frame_indices") and whose message
starts with it.
"""

from .files import (
    DATA_URL,
    UNKNOWN_MEDIA_TYPE,
    UrlPolicy,
    data_url_bytes,
    fetch_url,
    media_seconds,
    media_type,
    read_uri,
)
from .request import FORMATS, REFERENCE_INPUT, Keyframe, Reference, RequestError, VideoRequest, at_path, canvas
from .sglang import SGLANG_AUDIO_FLOW_SHIFT, SGLANG_FLOW_SHIFT, read_sglang
from .vllm_omni import read_vllm_omni

__all__ = [
    "DATA_URL",
    "FORMATS",
    "REFERENCE_INPUT",
    "SGLANG_AUDIO_FLOW_SHIFT",
    "SGLANG_FLOW_SHIFT",
    "UNKNOWN_MEDIA_TYPE",
    "Keyframe",
    "Reference",
    "RequestError",
    "UrlPolicy",
    "VideoRequest",
    "at_path",
    "canvas",
    "data_url_bytes",
    "fetch_url",
    "media_seconds",
    "media_type",
    "read_sglang",
    "read_uri",
    "read_vllm_omni",
]
