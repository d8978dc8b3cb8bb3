"""Jobs of the Videos API: each runs H3Client.generate on its own thread against Triton, its state
in the Store (SQLite), its files under `<data_dir>/videos/<id>/`:

    <k>.mp4   output k (seed + k): H.264 + AAC, as VIDEO_MP4 came from the server
    <k>.wav   its audio, 16-bit PCM stereo 32 kHz (h3_core.media.encode_wav)
    <k>.png   its thumbnail: the MP4's first frame
    <k>_spritesheet.jpg  its spritesheet (content.py), made at the first download
    preview.png  the latest preview image (p px per latent cell, PreviewMap) while it runs
    inputs/<variant>_<k>  the request's files as sent (variant first_frame, last_frame,
             reference_image, reference_video, reference_audio: fields.MEDIA_FIELDS), kept for
             resubmissions and downloads until the job is removed

Submission: a job is sent to h3_pipeline, its files given to H3Client.generate by their paths,
under the Triton request id `<job id>-<attempt>`, with progress after every step and previews
every `preview_every` steps. Creating a job waits for the request's first answer from Triton (a
progress response, a refusal or a result) or `accept_wait_s`, whichever comes first: a refusal
then (INVALID_ARG, UNAVAILABLE) removes the job and its files and is raised to the caller; any
later error fails the job. The creator waits on the event loop (an asyncio.Event the job's thread
sets), holding no thread of a pool.

Who may see a job: `Caller.sees` (auth); another caller's job is 404 like a missing one.

Restart rule (`recover`, at start-up): every job still queued or in_progress was
running when the previous front end stopped. The rule waits for Triton's h3_pipeline to be
ready, at most `wait_s` (`--recover-wait`): a Triton started beside the front end may still be
loading.
Its last Triton request is cancelled by id first; if that cancel fails (Triton still
unreachable) the job is failed with the cancel's error. Otherwise a job submitted
fewer than `max_attempts` times is submitted again under a new request id with the same request,
seed and files, so it gives the same output; one submitted `max_attempts` times is failed with
INTERNAL: "the front end stopped while this job ran (submissions: N; --max-attempts M)".

Retention: an ended job (completed, failed, cancelled) and its files are removed `retention_s`
after it ended (`purge`, run every PURGE_INTERVAL_S by the app), as are folders of no job.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from PIL import Image

from client.api import H3Client, H3Error
from h3_core.media import encode_wav

from .auth import Caller
from .content import spritesheet_bytes
from .fields import MEDIA_FIELDS, ApiError, error_from_server
from .store import ACTIVE, Store

log = logging.getLogger("videos_api")
PURGE_INTERVAL_S = 60.0
RECOVER_POLL_S = 0.5  # how often the restart rule asks whether Triton is ready
SEED_LIMIT = 2**31  # seeds the front end draws lie in 0..SEED_LIMIT - 1
INPUTS = "inputs"  # the folder of a job's files as sent
# content variant -> (H3Client.generate's argument, whether it takes a list)
GENERATE_ARGUMENT = {variant: (argument, repeatable) for variant, argument, repeatable in MEDIA_FIELDS.values()}


def png_bytes(image: np.ndarray) -> bytes:
    """A PNG file of a uint8 [H, W, 3] RGB image (Pillow)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return buffer.getvalue()


def first_frame(mp4: bytes) -> np.ndarray:
    """The first video frame of an MP4 file as uint8 [H, W, 3] RGB (PyAV). Raises
    av.error.FFmpegError for bytes that are not a video, StopIteration for one without frames."""
    with av.open(io.BytesIO(mp4)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def _write(path: Path, data: bytes) -> None:
    """Write `data` to `path` at once: a reader sees the whole file or none."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    temporary.replace(path)


@dataclass
class _Submission:
    """The creator's view of a submission until its first answer. `loop`: the creator's event
    loop, whose `answered` the job's thread sets at the first answer (None: nobody waits, a
    resubmission). `accepted`: a refusal after this point fails the job instead of being raised
    to the creator."""

    loop: asyncio.AbstractEventLoop | None = None
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: bool = False
    refusal: H3Error | None = None
    notified: bool = False

    def answer(self) -> None:
        """Wake the creator (from the job's thread), once."""
        with self.lock:
            if self.notified or self.loop is None:
                return
            self.notified = True
        with contextlib.suppress(RuntimeError):  # the loop closed: the front end stopped, nobody waits
            self.loop.call_soon_threadsafe(self.answered.set)


class Jobs:
    """The jobs of one front end: `store` (SQLite), files under `data_dir`, generation through
    `client`. Times are unix seconds; retention_s, accept_wait_s in seconds."""

    def __init__(
        self,
        store: Store,
        data_dir: Path,
        client: H3Client,
        *,
        retention_s: float,
        max_attempts: int,
        accept_wait_s: float,
    ):
        self.store, self.client = store, client
        self.videos = Path(data_dir) / "videos"
        self.videos.mkdir(parents=True, exist_ok=True)
        self.retention_s, self.max_attempts, self.accept_wait_s = retention_s, max_attempts, accept_wait_s

    def folder(self, job_id: str) -> Path:
        """The folder of a job's files."""
        return self.videos / job_id

    def input_path(self, job_id: str, variant: str, index: int) -> Path:
        """The path of a job's file `index` of content variant `variant` (as sent)."""
        return self.folder(job_id) / INPUTS / f"{variant}_{index}"

    def spritesheet(self, job_id: str, index: int) -> Path:
        """The path of output `index`'s spritesheet (content.spritesheet_bytes), made from its MP4
        at the first ask and kept with the job. Raises FileNotFoundError when the MP4 is gone (the
        job deleted or expired meanwhile)."""
        path = self.folder(job_id) / f"{index}_spritesheet.jpg"
        if not path.is_file():
            sheet = spritesheet_bytes((self.folder(job_id) / f"{index}.mp4").read_bytes())
            temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # two asks at once
            temporary.write_bytes(sheet)
            temporary.replace(path)
        return path

    def get(self, job_id: str, caller: Caller) -> dict:
        """The job with this id; ApiError 404 NOT_FOUND when there is none or `caller` may not
        see it."""
        job = self.store.get(job_id)
        if job is None or not caller.sees(job):
            raise ApiError(404, "NOT_FOUND", f"no video with id {job_id!r}")
        return job

    async def create(self, request: dict, media: dict[str, list[bytes]], owner: str | None) -> dict:
        """Store and submit a new job of `owner` (auth.Caller.owner) for `request` and its files
        `media` (fields.parse_create's; a missing seed is drawn here and the files are written to
        the job's inputs/ folder, so a resubmission gives the same output); returns the job once
        Triton answered or accept_wait_s passed, waiting on the running event loop (the database
        and the files on a worker thread). Raises ApiError (fields.error_from_server) when Triton
        refused the request then; the job and its files are removed."""
        if request["seed"] is None:
            request = dict(request, seed=secrets.randbelow(SEED_LIMIT))
        job_id = f"video_{secrets.token_hex(16)}"
        submission = _Submission(loop=asyncio.get_running_loop())
        await asyncio.to_thread(self._start, job_id, request, media, owner, submission)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(submission.answered.wait(), self.accept_wait_s)
        with submission.lock:
            submission.accepted = submission.refusal is None
        if submission.refusal is not None:
            await asyncio.to_thread(self.store.delete, job_id, int(time.time()))
            await asyncio.to_thread(shutil.rmtree, self.folder(job_id), ignore_errors=True)
            raise error_from_server(submission.refusal.code, submission.refusal.message, request)
        return await asyncio.to_thread(self.store.get, job_id)

    def cancel(self, job_id: str, caller: Caller) -> dict:
        """Cancel an active job: it becomes `cancelled` at once, its Triton request is cancelled by
        id and its outputs are removed when its thread ends (its inputs stay until it expires).
        Raises ApiError 404 for no such job (or one `caller` may not see), 409 CONFLICT for a job
        that already ended."""
        job = self.get(job_id, caller)
        now = int(time.time())
        if job["status"] not in ACTIVE or not self.store.end(job_id, "cancelled", now, self._expiry(now)):
            raise ApiError(
                409, "CONFLICT", f"video {job_id} is {job['status']}; only queued or in_progress ones cancel"
            )
        self._cancel_in_triton(job["triton_request_id"])
        return self.store.get(job_id)

    def delete(self, job_id: str, caller: Caller) -> None:
        """Remove a job and its files; an active one is cancelled in Triton by id first. Raises
        ApiError 404 for no such job (or one `caller` may not see)."""
        self.get(job_id, caller)
        job = self.store.delete(job_id, int(time.time()))
        if job is None:
            raise ApiError(404, "NOT_FOUND", f"no video with id {job_id!r}")
        if job["status"] in ACTIVE:
            self._cancel_in_triton(job["triton_request_id"])
        shutil.rmtree(self.folder(job_id), ignore_errors=True)

    def recover(self, wait_s: float) -> None:
        """Apply the restart rule (module docstring) to every job left active by the previous run,
        once Triton's h3_pipeline is ready: asked every RECOVER_POLL_S for at most `wait_s`
        seconds (a Triton started beside the front end may still be loading), then the rule runs
        anyway. Without such jobs it returns at once."""
        if not self.store.active():
            return
        deadline = time.monotonic() + wait_s
        while not self.client.ready():
            if time.monotonic() >= deadline:
                log.warning("Triton is not ready after %g s: the restart rule runs anyway", wait_s)
                break
            time.sleep(RECOVER_POLL_S)
        for job in self.store.active():
            now = int(time.time())
            try:
                answer = self.client.cancel(job["triton_request_id"])
            except H3Error as error:
                message = f"{error.code}: the front end restarted and could not cancel this job's Triton request: "
                message += error.message
                self.store.end(job["id"], "failed", now, self._expiry(now), error=(error.code, message))
                continue
            if job["attempts"] >= self.max_attempts:
                message = (
                    f"INTERNAL: the front end stopped while this job ran (submissions: {job['attempts']}; "
                    f"--max-attempts {self.max_attempts})"
                )
                self.store.end(job["id"], "failed", now, self._expiry(now), error=("INTERNAL", message))
                continue
            log.info("%s: Triton request %s cancelled (%s); resubmitting", job["id"], job["triton_request_id"], answer)
            self._remove_outputs(job["id"])
            submission = _Submission(accepted=True)
            self._submit(job["id"], job["attempts"] + 1, job["request"], submission)

    def purge(self, now: float) -> list[str]:
        """Remove the jobs that expired at unix time `now` with their files, and folders of no job;
        returns the removed jobs' ids."""
        removed = []
        for job_id in self.store.expired(int(now)):
            if self.store.delete(job_id, int(now)) is not None:
                removed.append(job_id)
            shutil.rmtree(self.folder(job_id), ignore_errors=True)
        self.store.forget(int(now) - round(self.retention_s))
        # the folders first, then the ids: a job adds its row before it makes its folder, so a
        # folder listed here that has no row then is of no job (a job created meanwhile is not listed)
        folders = list(self.videos.iterdir())
        known = self.store.ids()
        for folder in folders:
            if folder.name not in known:
                shutil.rmtree(folder, ignore_errors=True)
        return removed

    # ---- internals --------------------------------------------------------------------------
    def _expiry(self, now: int) -> int:
        return now + round(self.retention_s)

    def _remove_outputs(self, job_id: str) -> None:
        """Remove a job's outputs (everything in its folder but inputs/); the whole folder when the
        job is gone (deleted meanwhile)."""
        folder = self.folder(job_id)
        if self.store.get(job_id) is None:
            shutil.rmtree(folder, ignore_errors=True)
            return
        for path in folder.glob("*"):
            if path.is_dir() and path.name != INPUTS:
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_file():
                path.unlink(missing_ok=True)

    def _cancel_in_triton(self, request_id: str) -> None:
        try:
            self.client.cancel(request_id)
        except H3Error as error:  # the request's stream then ends by itself, or with Triton
            log.warning("could not cancel Triton request %s: %s", request_id, error)

    def _start(
        self, job_id: str, request: dict, media: dict[str, list[bytes]], owner: str | None, submission: _Submission
    ) -> None:
        self.store.add(job_id, int(time.time()), request, owner)
        for variant, files in media.items():
            for index, data in enumerate(files):
                path = self.input_path(job_id, variant, index)
                path.parent.mkdir(parents=True, exist_ok=True)
                _write(path, data)
        self._submit(job_id, 1, request, submission)

    def _submit(self, job_id: str, attempt: int, request: dict, submission: _Submission) -> None:
        request_id = f"{job_id}-{attempt}"
        self.store.submitted(job_id, request_id)
        thread = threading.Thread(target=self._run, args=(job_id, request_id, request, submission), daemon=True)
        thread.start()

    def _run(self, job_id: str, request_id: str, request: dict, submission: _Submission) -> None:
        folder = self.folder(job_id)

        def on_progress(step: int, total: int, position: int) -> None:
            with submission.lock:
                submission.accepted = True  # the request runs: a later error fails the job
            status = "in_progress" if step else "queued"
            self.store.progress(job_id, status=status, step=step, total_steps=total, queue_position=position)
            submission.answer()  # after the write: the creator answers with this state

        def on_preview(step: int, image: np.ndarray) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            _write(folder / "preview.png", png_bytes(image))
            self.store.progress(job_id, preview_step=step)

        files = {}  # generate's file arguments: the paths of the job's inputs
        for variant, kinds in request["inputs"].items():
            argument, repeatable = GENERATE_ARGUMENT[variant]
            paths = [self.input_path(job_id, variant, index) for index in range(len(kinds))]
            files[argument] = paths if repeatable else paths[0]
        try:
            results = self.client.generate(
                request["prompt"],
                height=request["height"],
                width=request["width"],
                num_frames=request["num_frames"],
                num_inference_steps=request["num_inference_steps"],
                seed=request["seed"],
                num_outputs=request["num_outputs"],
                progress_every=1,
                preview_every=request["preview_every"],
                return_audio=True,
                request_id=request_id,
                on_progress=on_progress,
                on_preview=on_preview,
                task=request["task"],
                fit=request["fit"],
                flow_shift=request.get("flow_shift"),
                audio_flow_shift=request.get("audio_flow_shift"),
                references=request.get("references"),
                lora=request.get("lora"),
                **files,
            )
            folder.mkdir(parents=True, exist_ok=True)
            for k, result in enumerate(results):
                _write(folder / f"{k}.mp4", result.video_mp4)
                _write(folder / f"{k}.wav", encode_wav(result.audio))
                _write(folder / f"{k}.png", png_bytes(first_frame(result.video_mp4)))
            now = int(time.time())
            if not self.store.end(job_id, "completed", now, self._expiry(now), outputs=[r.info for r in results]):
                self._remove_outputs(job_id)  # cancelled or deleted meanwhile
        except H3Error as error:
            with submission.lock:
                if not submission.accepted:
                    submission.refusal = error
            if submission.refusal is None:
                self._fail(job_id, error.code, f"{error.code}: {error.message}")
        except Exception as error:  # writing the files failed (disk full, ...): the job fails, not the front end
            log.exception("job %s failed", job_id)
            self._fail(job_id, "INTERNAL", f"INTERNAL: {type(error).__name__}: {error}")
        finally:
            submission.answer()

    def _fail(self, job_id: str, code: str, message: str) -> None:
        now = int(time.time())
        if not self.store.end(job_id, "failed", now, self._expiry(now), error=(code, message)):
            self._remove_outputs(job_id)  # cancelled or deleted meanwhile
