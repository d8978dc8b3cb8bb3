"""Helpers for the end-to-end tests: a model repository copy with overridden DiT settings."""

import threading
from pathlib import Path

from server.repository import plan, write_repository

ROOT = Path(__file__).resolve().parents[1]


def model_repository_copy(target: Path, dit_instances: int = 1, **dit_parameters) -> Path:
    """The CPU repository (tiny, checkpoints/tiny; nothing sized from this machine) written to
    `target` by server.repository, with `dit_instances` h3_dit instances and the given h3_dit
    parameters (values as strings); returns the new repository path. Raises ValueError for a
    parameter the settings refuse."""
    return write_repository(target, plan(dit_instances=dit_instances, overrides={"h3_dit": dit_parameters}))


def tensor(name: str, value, datatype: str):
    """A tritonclient InferInput holding the numpy array `value` as `datatype`."""
    import tritonclient.grpc as grpcclient

    result = grpcclient.InferInput(name, list(value.shape), datatype)
    result.set_data_from_numpy(value)
    return result


def raw_stream(
    url: str,
    inputs,
    *,
    model: str = "h3_pipeline",
    outputs=None,
    parameters=None,
    timeout_s: float = 60.0,
    **stream_kwargs,
):
    """Stream one request with plain tritonclient (stream_kwargs: request_id, sequence_id,
    sequence_start, sequence_end, ...). Returns (responses, error): error is the
    client.api.H3Error the stream ended with (an error response, or an INFO of kind "error"),
    or None. Raises TimeoutError when no response comes within timeout_s; the stream is then
    closed with cancel_requests=True, so a hung request never hangs the test."""
    import json
    import queue

    import tritonclient.grpc as grpcclient

    from client.api import H3Error

    responses, results, ended, ended_early = queue.Queue(), [], False, None
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, outputs=outputs, parameters=parameters, enable_empty_final_response=True, **stream_kwargs
        )
        while True:
            try:
                result, error = responses.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no response within {timeout_s} s") from None
            if error is not None:
                ended = True
                return results, H3Error.from_server(error)
            results.append(result)
            info = result.as_numpy("INFO")
            if info is not None and info.size and json.loads(info.reshape(-1)[0])["kind"] == "error":
                fields = json.loads(info.reshape(-1)[0])
                ended_early = H3Error(fields["code"], fields["message"])
            if result.get_response().parameters["triton_final_response"].bool_param:
                ended = True
                return results, ended_early
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()


def generate_in_thread(client, outcome: dict, key, **kwargs) -> threading.Thread:
    """Run client.generate(**kwargs) in a started thread; outcome[key] = its results or its
    H3Error."""
    from client.api import H3Error

    def run():
        try:
            outcome[key] = client.generate(**kwargs)
        except H3Error as error:
            outcome[key] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def idle_metrics(server, timeout_s: float = 60.0) -> dict:
    """server.h3_metrics() once h3_dit reports no active and no waiting request, or after
    timeout_s. h3_dit sets those gauges at the end of an execute(), after the final responses
    it sent there, so a client can see its stream end just before they change."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        metrics = server.h3_metrics()
        if (metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)
