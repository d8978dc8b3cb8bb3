"""A small Python API over tritonclient.grpc streaming for the h3_pipeline model.

    client = H3Client("127.0.0.1:8001")
    results = client.generate("a red ball rolls to the left", num_inference_steps=4, seed=7)
    open("clip.mp4", "wb").write(results[0].video_mp4)

Every stream has a timeout: a response that does not arrive within `timeout_s` seconds raises
H3Error("TIMEOUT", ...), and the stream is closed.
"""
import json
import queue
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "h3_pipeline"
INT_INPUTS = {"height": "HEIGHT", "width": "WIDTH", "num_frames": "NUM_FRAMES",
              "num_inference_steps": "NUM_INFERENCE_STEPS", "seed": "SEED", "num_outputs": "NUM_OUTPUTS"}
ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")
CODE = re.compile(r"^(INVALID_ARG|UNAVAILABLE|CANCELLED|INTERNAL): ")


class H3Error(Exception):
    """A failed generation. `code` is the message's code word (INVALID_ARG, UNAVAILABLE,
    CANCELLED, INTERNAL; TIMEOUT when the client gave up; UNKNOWN otherwise)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    @classmethod
    def from_server(cls, error: InferenceServerException) -> "H3Error":
        text = ENSEMBLE_PREFIX.sub("", error.message() or str(error))
        match = CODE.match(text)
        return cls(match.group(1), text[match.end():]) if match else cls("UNKNOWN", text)


@dataclass
class GenerationResult:
    """One generated clip. frames: uint8 [T, H, W, 3] and audio: float32 [2, samples] only when
    asked for; info: the server's report (seed, num_frames, height, width,
    num_inference_steps, request_id, output_index, largest_pack, stage_seconds)."""

    video_mp4: bytes
    info: dict
    frames: np.ndarray | None = None
    audio: np.ndarray | None = None
    progress: list[tuple[int, int, int]] = field(default_factory=list)  # (step, total, queue position)


def _input(name: str, value, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1, 1], datatype)
    tensor.set_data_from_numpy(np.array([[value]], dtype=object if datatype == "BYTES" else np.int64))
    return tensor


class H3Client:
    """Streaming client for h3_pipeline at `url` (host:port of Triton's gRPC endpoint)."""

    def __init__(self, url: str = "127.0.0.1:8001", timeout_s: float = 600.0):
        self.url, self.timeout_s = url, timeout_s

    def generate(self, prompt: str | bytes, *, height: int | None = None, width: int | None = None,
                 num_frames: int | None = None, num_inference_steps: int | None = None,
                 seed: int | None = None, num_outputs: int | None = None, progress_every: int = 0,
                 return_frames: bool = False, return_audio: bool = False, request_id: str = "",
                 on_progress: Callable[[int, int, int], None] | None = None) -> list[GenerationResult]:
        """Generate num_outputs clips (None fields take the server's defaults).

        on_progress(step, total_steps, queue_position) is called for each progress response
        (progress_every > 0). Returns the results in output-index order.
        Raises H3Error with the server's code word, or TIMEOUT.
        """
        values = dict(height=height, width=width, num_frames=num_frames,
                      num_inference_steps=num_inference_steps, seed=seed, num_outputs=num_outputs)
        inputs = [_input("PROMPT", prompt.encode() if isinstance(prompt, str) else prompt, "BYTES")]
        inputs += [_input(INT_INPUTS[k], v, "INT64") for k, v in values.items() if v is not None]
        outputs = [grpcclient.InferRequestedOutput(name) for name in ("VIDEO_MP4", "PROGRESS", "INFO")]
        outputs += [grpcclient.InferRequestedOutput(name) for name, wanted in
                    (("FRAMES", return_frames), ("AUDIO", return_audio)) if wanted]
        parameters = {"progress_every": progress_every}
        if return_frames:
            parameters["return_frames"] = True
        if return_audio:
            parameters["return_audio"] = True
        return self._stream(inputs, outputs, parameters, request_id, on_progress)

    def _stream(self, inputs, outputs, parameters, request_id, on_progress) -> list[GenerationResult]:
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        progress, results = [], []
        try:
            client.start_stream(callback=lambda result, error: responses.put((result, error)))
            client.async_stream_infer(MODEL, inputs, outputs=outputs, request_id=request_id,
                                      parameters=parameters, enable_empty_final_response=True)
            while True:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise H3Error("TIMEOUT", f"no response from {self.url} within {self.timeout_s} s") from None
                if error is not None:
                    raise H3Error.from_server(error)
                results += self._read(result, progress, on_progress)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream()
            client.close()
        return sorted(results, key=lambda r: r.info["output_index"])

    @staticmethod
    def _read(result, progress, on_progress) -> list[GenerationResult]:
        info_tensor = result.as_numpy("INFO")
        if info_tensor is None or info_tensor.size == 0:
            return []  # the empty final response that closes the stream
        info = json.loads(info_tensor.reshape(-1)[0])
        step, total, position = (int(v) for v in result.as_numpy("PROGRESS").reshape(-1))
        if info["kind"] == "progress":
            progress.append((step, total, position))
            if on_progress:
                on_progress(step, total, position)
            return []
        frames, audio = result.as_numpy("FRAMES"), result.as_numpy("AUDIO")
        return [GenerationResult(
            video_mp4=bytes(result.as_numpy("VIDEO_MP4").reshape(-1)[0]), info=info,
            frames=frames[0] if frames is not None else None, audio=audio[0] if audio is not None else None,
            progress=list(progress),
        )]
