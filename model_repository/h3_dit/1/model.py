"""h3_dit: the decoupled iterative DiT model, an adapter over h3_core.serving.dit.step_loop.StepLoop.

Each execute() receives every live sequence (Triton's iterative sequence batcher). The adapter
turns each request into an h3_core.serving.dit.events.Arrival, runs one StepLoop.iterate (in step mode as many
steps as execute_budget_s allows), sends the events it produces as they come and reschedules the
requests still running. The step loop (admission, cancel by id, deadlines, the pack, the packed
forward and its retry, results) is in h3_core/serving/dit/step_loop.py and runs without Triton.

With sp_degree > 1 the engine's DiT runs in worker processes this instance starts, on the CPU
or on its GPU and the next ones (h3_core.parallel.workers); finalize() stops them.

LoRA adapters (docs/lora.md §"Serving"): h3_core.serving.dit.adapters.ServedAdapters loads the
`loras` setting's at start and follows the registry's adapter table, before each execute's
arrivals and, while no execute runs, from a thread every lora_control.ADAPTER_POLL_S (a lock keeps
the two apart), so a run-time load reaches an idle instance too.

SIGUSR1 (sent by server.launch before it stops the server) starts draining: at the next step
boundary every job ends with CANCELLED and newcomers are refused with UNAVAILABLE:.
"""

import json
import logging
import signal
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from h3_core.factory import load_engine
from h3_core.parallel.workers import SP_TIMEOUT_FRACTION
from h3_core.protocol import AUDIO_LATENT, CONDITION_LATENTS, REQUEST, TEXT_EMBEDS, VIDEO_LATENT, cancel_info
from h3_core.serving.dit.adapters import ServedAdapters
from h3_core.serving.dit.events import Arrival, CancelAnswer, Ended, Heartbeat, Progress, Refused, Result
from h3_core.serving.dit.metrics import METRICS
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared.agreement import check_siblings
from h3_core.serving.shared.gpu_turns import TURN_WAIT_FRACTION, GpuTurns
from h3_core.serving.shared.lora_control import ADAPTER_POLL_S
from h3_core.serving.shared.registry import Registry, server_folder
from h3_core.serving.shared.settings import DitSettings
from h3_core.serving.shared.triton import error_response, json_tensor, model_parameters, resolve_path, set_threads
from h3_core.weights.checkpoint import load_training_metadata, source_seed
from h3_core.weights.lora_formats import read_lora

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
EMPTY_VIDEO = np.zeros((1, 0, 0, 0, 0), dtype=np.float32)
EMPTY_AUDIO = np.zeros((1, 0, 0, 0), dtype=np.float32)
EMPTY_PREVIEW = np.zeros((1, 0, 0, 3), dtype=np.uint8)


class TritonMetrics:
    """The step loop's metrics (h3_core.serving.dit.metrics.METRICS) published on Triton's /metrics endpoint, one
    series per DiT instance (`labels`: model, instance, and gpu on a GPU instance): sum over
    the series for the server's totals."""

    def __init__(self, labels: dict[str, str]):
        kinds = {
            "gauge": pb_utils.MetricFamily.GAUGE,
            "counter": pb_utils.MetricFamily.COUNTER,
            "histogram": pb_utils.MetricFamily.HISTOGRAM,
        }
        self.families, self.metrics = [], {}  # Triton requires the families to stay referenced
        for name, (kind, description, buckets) in METRICS.items():
            family = pb_utils.MetricFamily(name=name, description=description, kind=kinds[kind])
            self.families.append(family)
            self.metrics[name] = (
                family.Metric(labels=labels, buckets=buckets) if buckets else family.Metric(labels=labels)
            )

    def increment(self, name: str, amount: float = 1) -> None:
        self.metrics[name].increment(amount)

    def set(self, name: str, value: float) -> None:
        self.metrics[name].set(value)

    def observe(self, name: str, value: float) -> None:
        self.metrics[name].observe(value)


class TritonLogHandler(logging.Handler):
    """Python logging -> Triton's log."""

    def emit(self, record: logging.LogRecord) -> None:
        write = pb_utils.Logger.log_error if record.levelno >= logging.ERROR else pb_utils.Logger.log_info
        write(f"h3_dit: {self.format(record)}")


def response(video, audio, progress, preview, info: dict) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(
        [
            pb_utils.Tensor(VIDEO_LATENT, video),
            pb_utils.Tensor(AUDIO_LATENT, audio),
            pb_utils.Tensor("PROGRESS", np.array([progress], dtype=np.int32)),
            pb_utils.Tensor("PREVIEW", preview),
            json_tensor("INFO", info),
        ]
    )


def to_response(event) -> tuple["pb_utils.InferenceResponse", int]:
    """A step-loop event -> (Triton response, send flags). Every response but a refusal carries
    all four outputs (empty where not used): through the ensemble each reaches h3_vae. Started
    requests that end early get a normal final response with INFO {"kind": "error"}, not an
    error response: an error response that arrives while h3_vae still handles one of the
    request's progress responses leaves Triton 2.51 counting the ensemble request in flight."""
    if isinstance(event, Refused):
        return error_response(event.code, event.message), FINAL
    if isinstance(event, Progress):
        preview = EMPTY_PREVIEW if event.preview is None else event.preview[None].numpy()
        info = {"kind": "progress", "request_id": event.request_id}
        return response(EMPTY_VIDEO, EMPTY_AUDIO, [event.step, event.total, event.queue_position], preview, info), 0
    if isinstance(event, Result):
        return response(
            event.video_latent[None].numpy(),
            event.audio_latent[None].numpy(),
            [event.info["num_inference_steps"]] * 2 + [0],
            EMPTY_PREVIEW,
            event.info,
        ), FINAL if event.final else 0
    if isinstance(event, Ended):
        info = {"kind": "error", "request_id": event.request_id, "code": event.code, "message": event.message}
        return response(EMPTY_VIDEO, EMPTY_AUDIO, [event.step, event.total, 0], EMPTY_PREVIEW, info), FINAL
    if isinstance(event, Heartbeat):
        info = {"kind": "heartbeat", "request_id": event.request_id}
        return response(EMPTY_VIDEO, EMPTY_AUDIO, [0, 0, 0], EMPTY_PREVIEW, info), 0
    assert isinstance(event, CancelAnswer)
    info = cancel_info(event.request_id, event.state)
    return response(EMPTY_VIDEO, EMPTY_AUDIO, [0, 0, 0], EMPTY_PREVIEW, info), FINAL


def arrival(request, sender) -> Arrival:
    """A Triton request -> the step loop's Arrival (sender(request): its response sender)."""
    flags = request.flags()
    text = pb_utils.get_input_tensor_by_name(request, TEXT_EMBEDS)
    conditions = pb_utils.get_input_tensor_by_name(request, CONDITION_LATENTS)
    return Arrival(
        handle=request,
        key=request.correlation_id(),
        request_id=request.request_id(),
        new=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
        sequence_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
        request_json=list(pb_utils.get_input_tensor_by_name(request, REQUEST).as_numpy().reshape(-1)),
        text_embeds=None if text is None else text.as_numpy(),
        condition_latents=None if conditions is None else conditions.as_numpy(),
        parameters_json=request.parameters(),
        is_cancelled=lambda: request.is_cancelled() or sender(request).is_cancelled(),
    )


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        idle_s = int(config["sequence_batching"]["max_sequence_idle_microseconds"]) / 1e6
        settings = DitSettings.from_parameters(model_parameters(args), config["max_batch_size"], idle_s)
        check_siblings(args["model_repository"], DitSettings.MODEL, model_parameters(args))
        set_threads(settings.cpu_threads)
        logging.getLogger("h3_dit").addHandler(TritonLogHandler())
        logging.getLogger("h3_dit").setLevel(logging.INFO)
        instance, device = args["model_instance_name"], settings.device
        labels = {"model": "h3_dit"}
        if args["model_instance_kind"] == "GPU":  # one instance per GPU of instance_group's gpus
            device = f"cuda:{args['model_instance_device_id']}"
            settings = settings.for_gpu(int(args["model_instance_device_id"]))  # its GPU's max_batch_rows
            labels["gpu"] = args["model_instance_device_id"]
            instance += f"_gpu{args['model_instance_device_id']}"  # Triton names them alike on every GPU
        labels["instance"] = instance
        source = settings.checkpoint_dir  # random:SEED is no path
        source = source if source_seed(source) is not None else resolve_path(args, source)
        engine = load_engine(
            settings.config_name,
            source,
            device,
            settings.attention_backend,
            with_encoder=False,
            with_vaes=False,
            limits=settings.limits(),
            sp_degree=settings.sp_degree,
            sp_timeout_s=idle_s / SP_TIMEOUT_FRACTION,  # a hung worker is replaced well within the idle timeout
            quantization=settings.quantization,
            adaln_table_values=settings.adaln_table_values,
            adaln_weights=settings.adaln_weights,
        )
        seconds = engine.warm_up()
        table = getattr(engine.dit, "adaln_table", None)  # None also for sequence parallelism
        pb_utils.Logger.log_info(
            f"h3_dit {instance}: warm-up step on {device} in {seconds:.1f} s"
            + (" (compiles the DiT blocks)" if device.startswith("cuda") and settings.sp_degree == 1 else "")
            + (f" over {settings.sp_degree} sequence-parallel workers" if settings.sp_degree > 1 else "")
            + (f", block linears in {settings.quantization}" if settings.quantization != "none" else "")
            + (", AdaLN weights in host memory" if getattr(table, "host", False) else "")
            + f"; up to {settings.max_batch_rows:,} rows a step"
            + ("; each step takes the GPU's turn (gpu_turns)" if settings.gpu_turns else "")
        )
        folder = server_folder()
        self.loop = StepLoop(
            engine,
            settings,
            Registry(folder, instance),
            TritonMetrics(labels),
            training=load_training_metadata(source),
            # a step waits for its turn at most a part of the idle timeout (server.sizing counts it)
            turns=GpuTurns.on_device(folder, device, wait_limit_s=idle_s / TURN_WAIT_FRACTION)
            if settings.gpu_turns
            else None,
        )
        self.adapters = ServedAdapters(
            engine, self.loop.registry, settings, lambda path: resolve_path(args, path), read_lora
        )
        self.adapters.start()
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.poller = threading.Thread(target=self.poll_adapters, name="h3_dit-adapters", daemon=True)
        self.poller.start()
        signal.signal(signal.SIGUSR1, lambda signum, frame: self.loop.start_draining())

    def poll_adapters(self) -> None:
        """While no execute runs, follow the registry's adapter table every ADAPTER_POLL_S."""
        while not self.stopped.wait(ADAPTER_POLL_S):
            if self.lock.acquire(blocking=False):
                try:
                    self.adapters.sync()
                except Exception as error:  # noqa: BLE001 - logged; the next poll or execute tries again
                    logging.getLogger("h3_dit").error("the LoRA adapters could not follow the registry: %s", error)
                finally:
                    self.lock.release()

    def execute(self, requests):
        with self.lock:
            self.adapters.sync()  # before the arrivals: a request sent after a load's answer finds it
            return self.iterate(requests)

    def iterate(self, requests):
        """One execute's work: the arrivals, one StepLoop.iterate, the reschedules."""
        senders = {}

        def sender(request):
            return senders.setdefault(id(request), request.get_response_sender())

        arrivals = []
        for request in requests:
            try:
                arrivals.append(arrival(request, sender))
            except Exception as error:  # noqa: BLE001 - this request fails alone, with its final response
                try:
                    named = request.request_id() or "(no id)"
                    pb_utils.Logger.log_error(f"h3_dit: request {named} unreadable: {error}")
                    message = error_response("INTERNAL", f"the request could not be read: {error}")
                    sender(request).send(message, flags=FINAL)
                except Exception as failed:  # noqa: BLE001 - nothing more reaches it; the others go on
                    logging.getLogger("h3_dit").error("an unreadable request's error could not be sent: %s", failed)

        def send(event) -> None:
            message, flags = to_response(event)
            sender(event.handle).send(message, flags=flags)

        for request in self.loop.iterate(arrivals, send):
            try:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            except Exception as error:  # noqa: BLE001 - Triton no longer delivers it; dropped as vanished
                logging.getLogger("h3_dit").error("request %s not rescheduled: %s", request.request_id(), error)
        return None

    def finalize(self):
        self.stopped.set()
        self.poller.join()
        if self.loop.turns is not None:
            self.loop.turns.stop()
        self.loop.registry.leave()
        self.loop.engine.close()
