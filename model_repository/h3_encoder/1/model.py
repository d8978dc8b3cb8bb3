"""h3_encoder: PROMPT (+ KEYFRAMES or references) -> TEXT_EMBEDS, KEYFRAMES / references ->
CONDITION_LATENTS, the optional
inputs -> REQUEST JSON (an adapter over h3_core.model.encoder and h3_core.serving.encoder.conditioning).
Keyframe, guide and reference files are decoded, checked and sized before any model runs.
Decoupled: a request with files is decoded by one of `media_workers` threads apart from the text
encoder (never a second copy of it), within its decode budget, its id held in the registry so that
a cancel by id answers "cancelled" and stops it between files; a request without files is encoded
at once, so it never waits behind another's files. The models (text encoder, VAE encoders) run
one request at a time (a lock); each request gets one response, its final one.
The request parameters and the inputs' shapes are checked before the prompt
is encoded, so a malformed request costs no encoder time; when every h3_dit instance is full
(h3_core.serving.shared.registry) the request is refused with UNAVAILABLE before encoding. Each request
passed on to h3_dit is announced in the registry as its response is sent (Registry.announce), so
that an h3_dit execute taking several steps ends at its next step boundary and takes it in."""

import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from h3_core.config import get_config
from h3_core.diffusion.sampling import check_sigmas
from h3_core.inputs.references import Decoding
from h3_core.model.encoder import TextEncoder
from h3_core.protocol import (
    CONDITION_LATENTS,
    GUIDE_FRAMES,
    GUIDES,
    INT_INPUTS,
    KEYFRAME_INDICES,
    KEYFRAMES,
    LORA,
    PROMPT,
    REFERENCE_AUDIO,
    REFERENCE_IMAGES,
    REFERENCE_INPUTS,
    REFERENCE_VIDEOS,
    REFERENCES,
    REQUEST,
    SIGMA_INPUTS,
    TASK,
    TASKS,
    TEXT_EMBEDS,
    check_prompt_bytes,
    check_request_parameters,
    check_task,
    implied_task,
    lora_entries,
    lora_list,
)
from h3_core.serving.dit.scheduler import Overloaded
from h3_core.serving.encoder.conditioning import (
    Cancelled,
    keyframe_conditions,
    read_keyframes,
    read_references,
    reference_conditions,
    wire_conditions,
)
from h3_core.serving.shared.agreement import check_siblings
from h3_core.serving.shared.registry import Registry, server_folder
from h3_core.serving.shared.settings import EncoderSettings, check_served
from h3_core.serving.shared.triton import error_response, json_tensor, model_parameters, resolve_path, set_threads
from h3_core.weights.checkpoint import load_training_metadata, source_seed
from h3_core.weights.vae_hook import load_vaes

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
MEDIA_INPUTS = (KEYFRAMES, REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIO, GUIDES)  # inputs that hold files


def read_ints(request, name: str) -> list[int] | None:
    """The elements of an optional INT64 input, or None when it is absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else [int(value) for value in tensor.as_numpy().reshape(-1)]


def read_strings(request, name: str) -> list[bytes] | None:
    """The elements of an optional BYTES input, or None when it is absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else list(tensor.as_numpy().reshape(-1))


class TritonPythonModel:
    def initialize(self, args):
        self.settings = EncoderSettings.from_parameters(model_parameters(args))
        check_siblings(args["model_repository"], EncoderSettings.MODEL, model_parameters(args))
        set_threads(self.settings.cpu_threads)
        settings = self.settings
        self.encoder = TextEncoder(
            settings.encoder_path or None,
            settings.hidden_layer,
            settings.max_tokens,
            settings.device,
            settings.tokenizer_path or None,
            settings.encoder_weights,
        )
        self.encoder.encode("warm up")  # first-call set-up is not paid by the first client
        source = settings.checkpoint_dir  # random:SEED is no path
        source = source if source_seed(source) is not None else resolve_path(args, source)
        self.video_vae, self.audio_vae = load_vaes(source, settings.device, settings.trust_remote_code)
        self.training = load_training_metadata(source)  # the prompt's words are checked here: h3_dit sees none
        self.cfg = get_config(settings.config_name)
        self.canvas_area = self.cfg.default_height * self.cfg.default_width
        self.registry = Registry(server_folder())
        self.models = threading.Lock()  # the text encoder and the VAEs: one request at a time
        self.media = ThreadPoolExecutor(settings.media_workers, thread_name_prefix="h3-media")

    def execute(self, requests):
        """Answer each request through its response sender: one with files goes to a media
        worker (its id held in the registry while it waits and decodes), one without is encoded
        here at once. Returns None (decoupled)."""
        for request in requests:
            files = any(pb_utils.get_input_tensor_by_name(request, name) is not None for name in MEDIA_INPUTS)
            request_id = request.request_id()
            if files and request_id and self.registry.hold(request_id):
                self.respond(
                    request, error=("CANCELLED", f"request {request_id} cancelled by request before it started")
                )
            elif files:
                self.media.submit(self.respond, request, held=bool(request_id))
            else:
                self.respond(request)
        return None

    def respond(self, request, error: tuple[str, str] | None = None, held: bool = False) -> None:
        """Encode `request` (unless `error`, (code, message), ends it) and send its one, final
        response, whatever fails: the encoded tensors, or an error response (INVALID_ARG for a
        ValueError, UNAVAILABLE for Overloaded, CANCELLED, or INTERNAL for any other failure: a VAE
        out of memory, PyAV, the registry's database; its traceback in the server log). A held id
        is released first. A request passed on is announced to the DiT before its response is sent
        (the DiT's execute then matches the announcement with its arrival); a failed announcement is
        logged and fails nothing (the request reaches h3_dit all the same, at its next execute)."""
        request_id = "(no id)"
        response = None
        try:
            request_id = request.request_id() or request_id
            if error is None:
                response = self.encode(request, self.decoding(request, held))
        except (ValueError, Overloaded) as refusal:
            error = ("INVALID_ARG" if isinstance(refusal, ValueError) else "UNAVAILABLE", str(refusal))
        except Cancelled as cancelled:
            error = (
                "CANCELLED",
                f"request {request_id} cancelled by request while its media were decoded ({cancelled})",
            )
        except Exception as failure:  # noqa: BLE001 - this request fails alone; every request is answered
            pb_utils.Logger.log_error(
                f"h3_encoder: request {request_id} failed:\n{''.join(traceback.format_exception(failure))}"
            )
            message = f"encoding request {request_id} failed ({type(failure).__name__}: {failure}); see the server log"
            error = ("INTERNAL", message)
        if held:
            try:
                self.registry.release(request.request_id(), ended=error is not None)
            except Exception as failure:  # noqa: BLE001 - the response goes out all the same
                pb_utils.Logger.log_error(
                    f"h3_encoder: request {request_id}: the registry could not release it: {failure!r}"
                )
        if error is not None:
            pb_utils.Logger.log_info(f"h3_encoder: request {request_id} refused: {error[0]}: {error[1]}")
            response = error_response(*error)
        if error is None:  # announced before it is sent: it reaches h3_dit's queue a few ms after this
            try:
                if self.fault(request) == "announce_raise":
                    raise RuntimeError("injected fault in the registry's announcement")
                self.registry.announce(1)
            except Exception as failure:  # noqa: BLE001 - unannounced, it waits for h3_dit's next execute
                pb_utils.Logger.log_error(f"h3_encoder: request {request_id} could not be announced: {failure}")
        request.get_response_sender().send(response, flags=FINAL)

    def fault(self, request) -> str | None:
        """The request's inject_fault when this model allows fault injection (tests only), else
        None."""
        if not self.settings.allow_fault_injection:
            return None
        return check_request_parameters(request.parameters()).get("inject_fault")

    def decoding(self, request, held: bool) -> Decoding:
        """A request's Decoding: its decode budget and, for a held id, a check before each file
        that ends it (Cancelled) once a cancel by id flagged it. Each file's start is logged, with
        what Triton's request.is_cancelled() says (logged only: README, "Scheduling, cancellation
        and metrics", says what it was found to do for the ensemble's first step)."""
        request_id = request.request_id()

        def between_files(field: str) -> None:
            if held and self.registry.held_cancelled(request_id):
                raise Cancelled(f"before {field}")
            pb_utils.Logger.log_info(
                f"h3_encoder: request {request_id or '(no id)'} decoding {field} "
                f"(is_cancelled {request.is_cancelled()})"
            )

        return Decoding(self.settings.decode_budget(), between_files)

    def finalize(self):
        self.media.shutdown(wait=True)

    def encode(self, request, decoding: Decoding):
        """One request -> TEXT_EMBEDS float32 [1, L, text_dim] + CONDITION_LATENTS float32
        [1, N] + REQUEST; its files decoded by `decoding` (budget, check between files) before
        the models run (under self.models). Raises ValueError naming the input or parameter for a
        malformed request (keyframes included: decoded and checked before any model runs) or a
        decode budget passed, Overloaded when every h3_dit instance is full
        (h3_core.serving.shared.registry), Cancelled when its id was cancelled between two files."""
        start, received = time.perf_counter(), time.time()
        parameters = check_request_parameters(request.parameters())
        if self.fault(request) == "encode_raise":
            raise RuntimeError("injected fault in the encoder")
        tensor = pb_utils.get_input_tensor_by_name(request, PROMPT)
        if tensor is None:
            raise ValueError(f"{PROMPT} is required")
        raw = tensor.as_numpy().reshape(-1)
        if raw.size != 1:
            raise ValueError(f"{PROMPT} must hold exactly one string, got {raw.size}")
        value = raw[0]
        check_prompt_bytes(len(value), self.settings.max_prompt_bytes)
        try:
            prompt = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as error:
            raise ValueError(f"prompt is not valid UTF-8 ({error.reason} at byte {error.start})") from None
        fields = {}
        for name, field in INT_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                values = tensor.as_numpy().reshape(-1)
                if values.size != 1:
                    raise ValueError(f"{name} must hold exactly one INT64 value, got {values.size}")
                fields[field] = int(values[0])
        for name, field in SIGMA_INPUTS.items():  # the point count against max_steps: h3_dit's check
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                fields[field] = [float(value) for value in tensor.as_numpy().reshape(-1)]
                check_sigmas(name, fields[field])
        lora = read_strings(request, LORA)
        if lora is not None:  # h3_dit checks that the adapters are loaded
            if len(lora) != 1:
                raise ValueError(f"{LORA} must hold exactly one JSON array, got {len(lora)} elements")
            fields["lora"] = lora_entries(lora_list(lora[0]))
        task = read_strings(request, TASK)
        if task is not None and len(task) != 1:
            raise ValueError(f"{TASK} must hold exactly one string, got {len(task)}")
        files = read_strings(request, KEYFRAMES) or []
        indices = read_ints(request, KEYFRAME_INDICES)
        references = {name: [bytes(data) for data in read_strings(request, name) or []] for name in REFERENCE_INPUTS}
        guide_frames = read_ints(request, GUIDE_FRAMES)
        order = read_strings(request, REFERENCES)
        if order is not None and len(order) != 1:
            raise ValueError(f"{REFERENCES} must hold exactly one JSON array, got {len(order)} elements")
        order = None if order is None else order[0]
        has_references = any(references.values()) or guide_frames is not None or order is not None
        if files and has_references:
            raise ValueError(
                f"{KEYFRAMES} cannot be mixed with references or guides: send the first and last frames as {GUIDES} "
                f"with {GUIDE_FRAMES} 0 and NUM_FRAMES - 1"
            )
        if task is None:  # the task follows the inputs
            task = implied_task(bool(files), has_references)
        else:
            task = task[0].decode("utf-8", "replace") if isinstance(task[0], bytes) else str(task[0])
        if task in TASKS:  # another is refused by check_task, naming TASK
            check_served(task, self.settings.served_tasks())
        keyframes = read_keyframes(
            [bytes(data) for data in files],
            indices,
            fields.get("height"),
            fields.get("width"),
            parameters.get("fit"),
            self.settings,
            self.canvas_area,
            fields.get("num_frames", self.cfg.default_num_frames),
            decoding,
            max(1, fields.get("num_outputs", 1)),
        )
        refs = None
        if has_references:
            refs = read_references(
                references,
                guide_frames,
                fields.get("height"),
                fields.get("width"),
                fields.get("num_frames", self.cfg.default_num_frames),
                max(1, fields.get("num_outputs", 1)),
                parameters.get("fit"),
                self.settings,
                (self.cfg.default_height, self.cfg.default_width),
                order,
                decoding,
            )
        check_task(task, ["keyframe"] * len(files) + (refs.kinds if refs else []))
        full = self.registry.refusal()
        if full is not None:
            raise Overloaded(full)
        conditions, spans = [], []
        with self.models:  # the text encoder and the VAEs: one request at a time
            if keyframes.images:
                embeds, spans = self.encoder.encode_presentation(prompt, keyframes.images)
                conditions = keyframe_conditions(self.video_vae, keyframes)
                fields.update(height=keyframes.height, width=keyframes.width, geometry=keyframes.geometry)
            elif refs is not None:
                embeds, spans = self.encoder.encode_references(prompt, *refs.presentation())
                conditions = reference_conditions(self.video_vae, self.audio_vae, refs)
                fields.update(height=refs.height, width=refs.width, geometry=refs.geometry)
            else:
                embeds = self.encoder.encode(prompt)
        latents, entries = wire_conditions(conditions, refs.sources() if refs is not None else None)
        if conditions:
            fields.update(task=task, conditions=entries, vision_spans=[list(span) for span in spans])
        words = [] if self.training is None else self.training.outside_words(prompt)
        if words:
            fields["outside_training"] = words
        fields.update(encode_seconds=time.perf_counter() - start, received_unix_s=received)
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor(TEXT_EMBEDS, embeds[None].cpu().numpy()),
                pb_utils.Tensor(CONDITION_LATENTS, latents),
                json_tensor(REQUEST, fields),
            ]
        )
