"""server.sizing: what a repository sizes from the machine, with golden numbers worked out by hand in
the comments (injected core counts and free GPU memory; no GPU needed)."""

import json
import os
from pathlib import Path

import pytest

from h3_core.config import get_config
from h3_core.serving.shared.settings import MIN_EXECUTE_STEPS
from server import sizing

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


@pytest.mark.parametrize(
    "cores, processes, threads", [(2, 3, 1), (2, 4, 1), (16, 4, 4), (17, 4, 4), (16, 3, 5), (1, 1, 1), (64, 4, 16)]
)
def test_cpu_threads_divide_the_cores_among_the_model_processes(cores, processes, threads):
    assert sizing.cpu_threads(cores, processes) == threads


def test_cpu_threads_refuse_no_cores_or_no_processes():
    with pytest.raises(ValueError, match="cpu_threads needs cores >= 1 and processes >= 1, got 0 and 3"):
        sizing.cpu_threads(0, 3)
    with pytest.raises(ValueError, match="got 2 and 0"):
        sizing.cpu_threads(2, 0)


def test_the_machine_is_read_through_injectable_probes():
    free = {0: (5 * GIB, 141 * GIB), 1: (7 * GIB, 141 * GIB)}
    assert sizing.probe([0, 1], mem_get_info=free.__getitem__, cores=3) == sizing.Machine(3, {0: 5 * GIB, 1: 7 * GIB})
    assert sizing.probe() == sizing.Machine(len(os.sched_getaffinity(0)), {})
    assert sizing.available_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, count, gpus", [("all", 2, [0, 1]), ("all", 1, [0]), ("1,0", 2, [1, 0]), ("3", 4, [3])])
def test_gpus_are_all_or_a_list(text, count, gpus):
    assert sizing.parse_gpus(text, count) == gpus


@pytest.mark.parametrize(
    "text, count, message",
    [
        ("all", 0, r"no CUDA GPU is visible \(torch.cuda.device_count\(\) == 0\); use --device cpu"),
        ("0,0", 2, r"--gpus '0,0': each index must appear once and lie in 0..1 \(2 GPUs visible\)"),
        ("2", 2, r"--gpus '2': each index must appear once and lie in 0..1"),
        ("-1", 2, r"--gpus '-1': each index"),
        ("0;1", 2, r"--gpus '0;1' is not 'all' or a comma list of GPU indices such as 0,1"),
    ],
)
def test_bad_gpus_are_refused(text, count, message):
    with pytest.raises(ValueError, match=message):
        sizing.parse_gpus(text, count)


def test_weights_and_the_gpu_activation_constant():
    # every parameter and buffer in its dtype: bench has 6,008,975,616 parameters, most in bf16
    assert sizing.dit_weight_bytes(get_config("bench")) == 12_052_395_520
    assert sizing.dit_weight_bytes(get_config("h3")) == 66_280_430_080
    assert sizing.dit_weight_bytes(get_config("tiny")) == 3_050_176
    # the H200 bf16 measurement (67 bytes per row and unit of hidden_size) x dtype bytes / 2
    assert sizing.gpu_bytes_per_row_and_width(get_config("bench")) == 67
    assert sizing.gpu_bytes_per_row_and_width(get_config("demo")) == 134


def test_the_decode_reserve_is_the_largest_decode_per_worker():
    # 160 bytes x 672 x 672 px x 209 frames (already 17n + 5) = 15,100,968,960 B -> 14,402 MiB, x 2 workers
    assert sizing.decode_reserve_bytes(672, 672, 209, 2) == 28_804 * 2**20
    # 160 x 256 x 256 x 124 (121 aligned up to 17n + 5) = 1,300,234,240 B -> 1,240 MiB
    assert sizing.decode_reserve_bytes(256, 256, 121, 1) == 1_240 * 2**20


def test_gpu_rows_from_free_memory():
    weights, reserve = 12_052_395_520, 28_804 * 2**20
    # (42,949,672,960 - 12,052,395,520 - 30,203,183,104) B / (48 x 5376 B a row) = 2,689.8 -> 2,688
    assert sizing.gpu_max_batch_rows(40 * GIB, weights, reserve, 5376, 48) == 2_688
    # without the reserve: 119,734 rows, capped
    assert sizing.gpu_max_batch_rows(40 * GIB, weights, 0, 5376, 48) == 65_536
    # with the CPU constant: 30,897,277,440 B / (96 x 5376) = 59,867.1 -> 59,840
    assert sizing.gpu_max_batch_rows(40 * GIB, weights, 0, 5376, 96) == 59_840
    with pytest.raises(
        ValueError,
        match=r"the DiT does not fit: 12,288 MiB free - 11,494 MiB of weights - "
        r"28,804 MiB reserve leaves -28,010 MiB, under 64 rows",
    ):
        sizing.gpu_max_batch_rows(12 * GIB, weights, reserve, 5376, 48)


def test_step_seconds_scale_the_recorded_h200_step_by_rows_and_layers():
    assert sizing.step_seconds(16_384, 8) == 0.355
    assert sizing.step_seconds(65_536, 50) == pytest.approx(8.875)
    assert sizing.step_seconds(4_096, 8) == pytest.approx(0.08875)


def test_the_step_constant_is_the_recorded_h200_figure():
    recorded = json.loads((ROOT / "benchmarks" / "results" / "h200.json").read_text())
    one = recorded["measurements"]["engine_bench"]["e_packing_curve"]["16384"]
    assert one["used_rows"] == 16_329 and round(one["one_s"], 3) == sizing.H200_STEP_S


@pytest.mark.parametrize(
    "device, mode, rows, layers, steps, sp_degree, microseconds",
    [
        ("cpu", "step", 4_096, 2, 50, 1, 60_000_000),
        ("cpu", "request", 4_096, 2, 100, 1, 60_000_000),  # 100 x 0.2 s x 1.5 = 30 s < 60 s
        ("cpu", "request", 4_096, 2, 400, 1, 120_000_000),  # 400 x 0.2 s x 1.5: no longer 60 s whatever max_steps
        ("cpu", "request", 8_192, 4, 50, 1, 60_000_000),  # 50 x 0.8 s x 1.5
        ("cpu", "step", 4_096, 2, 50, 2, 60_000_000),  # a restart of 2 tiny workers: 0.2 s there
        ("cuda", "step", 65_536, 50, 50, 1, 60_000_000),  # 5 x 8.875 s = 44.4 s < 60 s
        ("cuda", "step", 65_536, 80, 50, 1, 71_000_000),  # 5 x 14.2 s
        ("cuda", "request", 65_536, 50, 50, 1, 665_625_000),  # 50 x 8.875 s x 1.5
        ("cuda", "request", 65_536, 8, 30, 1, 63_900_000),  # 30 x 1.42 s x 1.5
        ("cuda", "request", 4_096, 8, 50, 1, 60_000_000),  # 50 x 0.089 s x 1.5 = 6.7 s < 60 s
        # sequence parallelism: at least 2 x (before + 11.3 s x layers / 8 of restart + 2 x 2 s)
        ("cuda", "step", 65_536, 8, 50, 2, 60_000_000),  # 2 x (1 + 11.3 + 4) = 32.6 s < 60 s
        ("cuda", "step", 65_536, 50, 50, 2, 151_250_000),  # 2 x (1 + 70.625 + 4)
        ("cuda", "request", 65_536, 50, 50, 2, 1_036_750_000),  # 2 x (50 x 8.875 + 70.625 + 4) > 665.6 s
        ("cuda", "request", 4_096, 8, 30, 2, 60_000_000),  # 2 x (30 x 0.089 + 11.3 + 4) < 60 s
    ],
)
def test_idle_timeout(device, mode, rows, layers, steps, sp_degree, microseconds):
    assert sizing.idle_timeout(device, mode, rows, layers, steps, sp_degree)[0] == microseconds


def test_the_sequence_parallel_restart_constant_is_the_recorded_h200_figure():
    recorded = json.loads((ROOT / "benchmarks" / "results" / "h200x2_sequence_parallel.json").read_text())
    assert round(recorded["in_process"]["sp2"]["restart_s"], 1) == sizing.H200_SP_RESTART_S
    assert sizing.SP_IDLE_FACTOR == 2  # two tries of a step, each up to a quarter of the idle timeout


def test_idle_timeout_covers_a_lost_worker_and_says_why():
    idle_us, why = sizing.idle_timeout("cuda", "step", 65_536, 50, 50, sp_degree=2)
    assert why == (
        "on cuda, step mode: max(60 s, 5 x 8.875 s, 2 x (1 s of execute budget + 70.625 s of restart + 2 x 2 s)) = "
        "151.2 s, a step of 65,536 rows of the 50-layer DiT estimated as 0.355 s x 65,536 / 16,384 rows x 50 / 8 "
        "layers = 8.875 s (the bench DiT on the H200, benchmarks/results/h200.json); a lost sequence-parallel worker "
        "costs the execute two tries of its step, each within the step timeout (this / 4), the steps before and one "
        "restart of the workers estimated as 11.3 s x 50 / 8 layers = 70.625 s "
        "(benchmarks/results/h200x2_sequence_parallel.json)."
    )
    # the worst such execute: 1 s of steps, two tries of 151.25 s / 4 + 2 s each, and the restart
    assert 1 + 2 * (idle_us / 1e6 / 4 + 2) + 70.625 <= idle_us / 1e6


def test_the_step_mode_idle_timeout_covers_an_execute_of_its_least_steps():
    # an execute takes at least MIN_EXECUTE_STEPS (2) steps while nothing is announced, however
    # long they are: the idle timeout is 2.5 times that wherever it exceeds the 60 s floor
    assert MIN_EXECUTE_STEPS == 2 and sizing.STEP_IDLE_FACTOR == 5.0
    step = sizing.step_seconds(65_536, 80)
    assert sizing.idle_timeout("cuda", "step", 65_536, 80, 50)[0] == round(2.5 * MIN_EXECUTE_STEPS * step * 1e6)


def test_idle_timeout_says_why():
    assert sizing.idle_timeout("cuda", "request", 65_536, 50, 50)[1] == (
        "on cuda, request mode: max(60 s, 50 steps x 8.875 s x 1.5) = 665.6 s, a step of 65,536 rows of the "
        "50-layer DiT estimated as 0.355 s x 65,536 / 16,384 rows x 50 / 8 layers = 8.875 s (the bench DiT on the "
        "H200, benchmarks/results/h200.json)."
    )
    with pytest.raises(ValueError, match=r"device 'tpu' is not one of \('cpu', 'cuda'\)"):
        sizing.idle_timeout("tpu", "step", 64, 8, 50)


@pytest.mark.parametrize(
    "mode, rows, layers, steps, microseconds",
    [
        ("step", 65_536, 50, 50, 124_250_000),  # 5 x 8.875 s x 2.8 = 124.25 s (60 s without turns)
        ("step", 4_096, 8, 50, 60_000_000),  # 5 x 0.089 s x 2.8 < 60 s
        ("request", 65_536, 8, 30, 178_920_000),  # 30 x 1.42 s x 1.5 x 2.8 (63.9 s without turns)
    ],
)
def test_the_idle_timeout_counts_a_wait_for_the_gpu_turn(mode, rows, layers, steps, microseconds):
    """Issue 43 item 1: with GPU turns an execute may hold one wait for its turn (a quarter of the
    idle timeout, h3_dit's wait limit) and steps time-sliced with a stuck decode (2.1x): the idle
    timeout still holds the execute's steps with the old margin in the other three quarters."""
    assert sizing.TURNS_IDLE_FACTOR == pytest.approx(2.8) and sizing.TURN_WAIT_FRACTION == 4
    idle_us, why = sizing.idle_timeout("cuda", mode, rows, layers, steps, gpu_turns=True)
    assert idle_us == microseconds
    factor = sizing.STEP_IDLE_FACTOR if mode == "step" else steps * sizing.REQUEST_IDLE_FACTOR
    idle_s, step = idle_us / 1e6, sizing.step_seconds(rows, layers)
    assert idle_s / 4 + factor * step * sizing.TIME_SLICED_SLOWDOWN <= idle_s + 1e-6
    assert " x 2.8 (GPU turns)" in why


def test_every_cache_has_a_term_in_the_gpu_rows():
    """Issue 43 item 3: the step caches of the held requests (768 B a row each, 12 held: 9,216 B,
    2.5 % of an H3 row of 67 x 5,376 = 360,192 B) and the CUDA graph pool (4,096 rows of
    activations: 1,407 MiB for H3 in bf16) come off a GPU's rows."""
    assert sizing.held_cache_bytes_per_row(4 + 8, step_cache=True) == 9_216
    assert sizing.held_cache_bytes_per_row(4 + 8, step_cache=False) == 0
    assert sizing.graph_pool_bytes(5376, 67) == 4096 * 67 * 5376 == 1_475_346_432  # 1,407 MiB
    free, weights = 40 * 2**30, 20 * 2**30
    assert sizing.gpu_max_batch_rows(free, weights, 0, 5376, 67) == 59_584  # 21,474,836,480 / 360,192 = 59,620.3
    # (21,474,836,480 - 1,475,346,432) / 369,408 = 54,139.6 -> 54,080
    assert sizing.gpu_max_batch_rows(free, weights, sizing.graph_pool_bytes(5376, 67), 5376, 67, 9_216) == 54_080
