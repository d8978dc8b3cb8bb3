"""Shared pieces of the training loops: time-budgeted, resumable, logged.

A run trains until its share of a total time budget is spent (`seconds` this run; the learning
rate follows a warm-up + cosine schedule over `total_seconds` of training, counted across
resumed runs) and saves its state (state.py) every `save_every` seconds and at the end. The
loss log is a CSV `<name>_loss.csv` (step, seconds, lr, loss columns) appended across runs.
"""

import csv
import math
import time
from pathlib import Path

import torch

from .state import load_state, save_state


def lr_at(progress: float, peak: float, warmup: float = 0.03, floor: float = 0.05) -> float:
    """Warm-up for the first `warmup` of training, then cosine from peak to floor * peak."""
    if progress < warmup:
        return peak * max(progress / warmup, 0.01)
    p = min((progress - warmup) / (1 - warmup), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


class Run:
    """Bookkeeping of one resumable run of `name` in `work` (state prefix, loss CSV, clock)."""

    def __init__(
        self,
        name: str,
        work: Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        seconds: float,
        total_seconds: float,
        peak_lr: float,
        save_every: float = 60.0,
        moment_dtype: torch.dtype = torch.float32,
        log_every: int = 50,
    ):
        self.name, self.work, self.model, self.optimizer = name, Path(work), model, optimizer
        self.seconds, self.total_seconds, self.peak_lr = seconds, total_seconds, peak_lr
        self.save_every, self.moment_dtype, self.log_every = save_every, moment_dtype, log_every
        self.work.mkdir(parents=True, exist_ok=True)
        meta = load_state(self.prefix, model, optimizer) or {}
        self.step, self.trained = int(meta.get("step", 0)), float(meta.get("seconds", 0.0))
        self.extra = meta.get("extra", {})
        self.resumed = bool(meta)
        self.start = time.monotonic()
        self.trained_at_start = self.trained
        self.last_save = self.start
        self.sums: dict[str, float] = {}
        self.count = 0

    @property
    def prefix(self) -> Path:
        return self.work / f"{self.name}_state"

    @property
    def csv_path(self) -> Path:
        return self.work / f"{self.name}_loss.csv"

    def running(self) -> bool:
        """True while this run's seconds and the total budget both last; sets the step's lr."""
        now = time.monotonic()
        self.trained = self.trained_at_start + (now - self.start)
        if now - self.start >= self.seconds or self.trained >= self.total_seconds:
            return False
        lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return True

    @property
    def lr(self) -> float:
        return lr_at(self.trained / self.total_seconds, self.peak_lr)

    def record(self, steps: int = 1, **losses: float) -> None:
        """Count `steps` optimizer steps whose mean losses are `losses` (floats); log means every
        log_every steps, save every save_every seconds."""
        self.step += steps
        self.count += steps
        for key, value in losses.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * steps
        if self.count >= self.log_every:
            self.flush()
        if time.monotonic() - self.last_save >= self.save_every:
            self.save()

    def flush(self) -> None:
        if not self.count:
            return
        row = {"step": self.step, "seconds": round(self.trained, 2), "lr": f"{self.lr:.3e}"}
        row.update({k: f"{v / self.count:.5f}" for k, v in self.sums.items()})
        new = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        print(f"[{self.name}] " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        self.sums, self.count = {}, 0

    def save(self) -> None:
        self.flush()
        meta = {"step": self.step, "seconds": self.trained, "extra": self.extra}
        save_state(self.prefix, self.model, self.optimizer, meta, self.moment_dtype)
        self.last_save = time.monotonic()


def read_loss_csv(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return list(csv.DictReader(f))
