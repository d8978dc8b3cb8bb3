"""The one model-repository writer. Every repository is written here: model_repository/ itself (the
shipped CPU repository, the writer's output for the defaults: tests/test_repository.py checks it
byte for byte), the demo repository (`make demo`), the tests' copies (tests/serving.py), the
benchmarks' copies (benchmarks/served_bench.py) and the GPU repositories (`make serve-gpu`).

    python -m server.repository TARGET [--config NAME] [--checkpoint DIR] [--device {cpu,cuda,auto}]
                                [--gpus all|0,1] [--placement shared|own|cpu] [--dit-instances N]
                                [--set MODEL.KEY=VALUE ...] [--unsized]
    python -m server.repository model_repository --unsized     # rewrites the shipped repository
    python -m server.repository --plan     # the official checkpoint on 1, 2, 4, 8 H200s (server.deploy_plan)

A repository is a `Repository`: the settings of h3_encoder, h3_dit and h3_vae (h3_core.serving.shared.settings;
each config.pbtxt gets every key of its model's `parameters`), each model's instance group
(`instance_groups`, the one function that places the models) and h3_dit's
max_sequence_idle_microseconds; h3_dit's max_batch_size is its sequence slots. `plan` builds one
from a config name, a checkpoint folder, a device, the GPUs, the number of CPU DiT instances and
explicit overrides, and sizes from a `server.sizing.Machine` what was not given (cpu_threads, on
cuda max_batch_rows and max_request_mb); without a machine (the tests' copies, the shipped
repository) the settings' defaults stay. On cuda it also raises h3_dit's canvas limits to the
config's default canvas, sets execute_budget_s to sizing.GPU_EXECUTE_BUDGET_S (1 s) and derives
the idle timeout from the longest step (server.sizing).
The parts: server.planner (Repository, plan, default_placement), server.placement (instance
groups), server.gpu_rows (h3_dit's rows per GPU), server.config_texts (`config_texts`: a
Repository as config.pbtxt texts, with their explanatory comments); here `write_repository`
writes a folder, `check_checkpoint` checks the weights first, and the CLI. The names
`from server.repository import ...` has always given (plan, Repository, config_texts, ...) stay.

Checkpoint paths: the models resolve a relative checkpoint_dir against the folder above their
repository (h3_core.serving.shared.triton.resolve_path), so a relative path is relative to the project root
(ROOT); model_repository/ keeps it relative, every other repository gets it absolute. The CLI
reads a relative --checkpoint against the current directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from h3_core.serving.shared.lora_control import lora_setting
from h3_core.serving.shared.settings import CONTROL_SLOTS, DitSettings, EncoderSettings, VaeSettings
from h3_core.weights.checkpoint import (
    AUDIO_VAE_FILE,
    DIT_FILE,
    TRANSFORMER_FOLDER,
    VIDEO_VAE_FILE,
    official_tensor_files,
    source_seed,
)
from h3_core.weights.official_checkpoint import is_official
from h3_core.weights.vae_hook import check_official_vaes, is_official_vae_folder

from . import sizing
from .config_texts import config_texts
from .options import add_arguments, given_options
from .placement import InstanceGroup
from .planner import DEMO_CONFIG, ROOT, SETTINGS, Repository, default_placement, plan, request_rows

__all__ = [
    "DEMO_WEIGHTS",
    "ROOT",
    "SETTINGS",
    "SHIPPED",
    "InstanceGroup",
    "Repository",
    "check_checkpoint",
    "checkpoint_for",
    "config_texts",
    "default_placement",
    "main",
    "parse_overrides",
    "plan",
    "request_rows",
    "write_repository",
]

SHIPPED = ROOT / "model_repository"
DEMO_WEIGHTS = ROOT / "weights" / DEMO_CONFIG


# ---- folders -------------------------------------------------------------------------------------


def checkpoint_for(checkpoint: str, target: Path) -> str:
    """checkpoint_dir as written into the repository at `target`: `random:SEED` unchanged (no
    path); a folder relative (to ROOT) only in model_repository/ itself, where the models resolve
    it against ROOT; absolute elsewhere. Raises ValueError for a malformed random:SEED."""
    if source_seed(checkpoint) is not None:
        return checkpoint
    path = Path(checkpoint) if Path(checkpoint).is_absolute() else ROOT / checkpoint
    if target.resolve() == SHIPPED and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(path)


def write_repository(target: str | Path, repository: Repository) -> Path:
    """Write `repository` to the folder `target` and return its path: model_repository/ itself gets
    its config.pbtxt files rewritten; any other target becomes a copy of model_repository/'s
    model code (without __pycache__) with the written config.pbtxt files, replacing an earlier
    repository there. Checkpoint paths as checkpoint_for says.
    Raises FileExistsError when `target` is a non-empty folder that holds no h3_dit/config.pbtxt
    (it is not replaced)."""
    target = Path(target).resolve()
    checkpoint = checkpoint_for(repository.dit.checkpoint_dir, target)
    repository = dataclasses.replace(
        repository,
        dit=dataclasses.replace(repository.dit, checkpoint_dir=checkpoint),
        vae=dataclasses.replace(repository.vae, checkpoint_dir=checkpoint_for(repository.vae.checkpoint_dir, target)),
        encoder=dataclasses.replace(
            repository.encoder, checkpoint_dir=checkpoint_for(repository.encoder.checkpoint_dir, target)
        ),
    )
    if target != SHIPPED:
        if target.exists():
            if any(target.iterdir()) and not (target / DitSettings.MODEL / "config.pbtxt").is_file():
                raise FileExistsError(f"{target} is not empty and holds no model repository; not replacing it")
            shutil.rmtree(target)
        shutil.copytree(SHIPPED, target, ignore=shutil.ignore_patterns("__pycache__", "config.pbtxt"))
    for model, text in config_texts(repository).items():
        (target / model / "config.pbtxt").write_text(text)
    return target


def check_checkpoint(dit: DitSettings, vae: VaeSettings, encoder: EncoderSettings) -> None:
    """Refuse, before a repository is written, what h3_dit, h3_vae or h3_encoder would refuse at
    load (weight sources: h3_core.weights.checkpoint's module docstring; a relative folder is relative to
    ROOT), so that the launcher stops in seconds with one line:
    - random:SEED: nothing to check (a malformed one raises ValueError naming the allowed form);
    - a folder that does not exist, or holds neither layout: FileNotFoundError saying so and naming
      both layouts and the commands that write each;
    - an official checkpoint folder: transformer/'s weights (one file or the index and its shards,
      headers readable), and video_vae/ and audio_vae/ following the hook contract with h3_vae's
      trust_remote_code (vae_hook.check_official_vaes); its config.json is checked by plan();
    - a native folder: FileNotFoundError naming the first missing of dit.safetensors (the DiT's
      folder), video_vae.safetensors and audio_vae.safetensors (the VAEs' folder), with the command
      that writes seeded random weights of the config there;
    - the text encoder and tokenizer folders h3_encoder names, when given: they must exist.
    Raises FileNotFoundError or ValueError with the message of the first problem."""

    def seeded(folder: Path) -> str:
        command = f"python -m h3_core.weights.checkpoint_setup --configs {dit.config_name} --root"
        if folder.name == dit.config_name:
            return f"seeded random weights: {command} {folder.parent}"
        return f"seeded random weights: {command} DIR writes them to DIR/{dit.config_name}"

    def folder_of(source: str) -> Path | None:
        if source_seed(source) is not None:
            return None
        folder = Path(source) if Path(source).is_absolute() else ROOT / source
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist; {seeded(folder)}")
        layouts = (is_official(folder), is_official_vae_folder(folder), (folder / DIT_FILE).is_file())
        if not any(layouts) and not (folder / VIDEO_VAE_FILE).is_file():
            raise FileNotFoundError(
                f"{folder} is not a checkpoint: it holds neither {DIT_FILE}, {VIDEO_VAE_FILE} and {AUDIO_VAE_FILE} "
                f"(python -m h3_core.weights.checkpoint_setup writes seeded random ones) nor an official MiniMax-H3 "
                f"checkpoint's transformer/, text_encoder/, tokenizer/, video_vae/ and audio_vae/ (python -m "
                f"h3_core.weights.official_checkpoint writes a synthetic one); or serve seeded random weights with "
                f"--checkpoint random:0"
            )
        return folder

    needed = []
    dit_folder, vae_folder = folder_of(dit.checkpoint_dir), folder_of(vae.checkpoint_dir)
    if dit_folder is not None and is_official(dit_folder):
        official_tensor_files(dit_folder / TRANSFORMER_FOLDER)
    elif dit_folder is not None:
        needed.append(dit_folder / DIT_FILE)
    if vae_folder is not None and is_official_vae_folder(vae_folder):
        check_official_vaes(vae_folder, vae.trust_remote_code)
    elif vae_folder is not None:
        needed += [vae_folder / VIDEO_VAE_FILE, vae_folder / AUDIO_VAE_FILE]
    for path in needed:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; {seeded(path.parent)}")
    for name, path in (("text encoder", encoder.encoder_path), ("tokenizer", encoder.tokenizer_path)):
        if path and not Path(path).is_dir():
            raise FileNotFoundError(f"h3_encoder's {name} folder {path} does not exist")


# ---- command line ------------------------------------------------------------------------------


def parse_overrides(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """{model: {key: value}} from MODEL.KEY=VALUE strings. Raises ValueError for another form."""
    overrides: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        model, dot, key = name.partition(".")
        if not (sep and dot and model and key):
            raise ValueError(f"--set {item!r} is not MODEL.KEY=VALUE (e.g. h3_dit.max_waiting=2)")
        overrides.setdefault(model, {})[key] = value
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring): write TARGET, print what was sized and why. Returns 0, or 2
    after printing the error for a bad option, setting, GPU or checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m server.repository", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "target", type=Path, nargs="?", help="repository folder to write (model_repository: the shipped one)"
    )
    add_arguments(parser)
    parser.add_argument(
        "--unsized",
        action="store_true",
        help="size nothing from this machine (how model_repository/ itself is written)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="write nothing: print what the official checkpoint gets on 1, 2, 4 and 8 H200s (server.deploy_plan)",
    )
    args = parser.parse_args(argv)
    if args.plan:
        if args.target is not None or given_options(args) or args.unsized:
            parser.error("--plan takes no other option")
        from .deploy_plan import plan_table

        print(plan_table())
        return 0
    if args.target is None:
        parser.error("the target folder is required (or --plan)")
    try:
        repository = _plan_from_args(args)
        check_checkpoint(repository.dit, repository.vae, repository.encoder)
        path = write_repository(args.target, repository)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"python -m server.repository: {error}", file=sys.stderr)
        return 2
    dit, groups = repository.dit, repository.groups
    checkpoint = dit.checkpoint_dir if source_seed(dit.checkpoint_dir) is not None else Path(ROOT, dit.checkpoint_dir)
    print(f"model repository {path}: config {dit.config_name}, checkpoint {checkpoint}, device {dit.device}")
    for model, group in groups.items():
        print(f"  {model}: {group.text()}")
    print(
        f"  h3_dit.max_batch_size {dit.sequence_slots}: max_num_seqs {dit.max_num_seqs} + max_waiting "
        f"{dit.max_waiting} + {CONTROL_SLOTS} control slots"
    )
    for note in repository.notes:
        print(f"  {note}")
    print(f"  h3_dit.max_sequence_idle_microseconds {repository.idle_microseconds}: {repository.idle_reason}")
    return 0


def _plan_from_args(args: argparse.Namespace) -> Repository:
    """plan() for parsed CLI options: device auto resolved, GPUs and the machine probed unless
    --unsized, a relative --checkpoint, encoder path or h3_dit loras path read against the current
    directory."""
    device, gpus = args.device or "cpu", []
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"--device auto: {device} ({torch.cuda.device_count()} CUDA GPUs visible)")
    if device == "cuda":
        import torch

        gpus = sizing.parse_gpus(args.gpus or "all", torch.cuda.device_count())
    elif args.gpus is not None and args.device != "auto":
        raise ValueError("--gpus needs --device cuda")
    checkpoint = args.checkpoint  # random:SEED is no path
    if checkpoint is not None and source_seed(checkpoint) is None:
        checkpoint = Path(checkpoint).resolve()
    overrides = parse_overrides(args.set or [])
    encoder = overrides.get(EncoderSettings.MODEL, {})
    for key in ("encoder_path", "tokenizer_path"):  # the h3_encoder stub reads them against its own directory
        if encoder.get(key):
            encoder[key] = str(Path(encoder[key]).resolve())
    dit = overrides.get(DitSettings.MODEL, {})
    if dit.get("loras"):  # the h3_dit stub reads a relative path against the folder above its repository
        dit["loras"] = ",".join(f"{name}={Path(path).resolve()}" for name, path in lora_setting(dit["loras"]).items())
    machine = None if args.unsized else sizing.probe(gpus)
    return plan(
        args.config or "tiny",
        checkpoint,
        device,
        gpus,
        args.dit_instances or 1,
        overrides,
        machine,
        placement=args.placement,
    )


if __name__ == "__main__":
    sys.exit(main())
