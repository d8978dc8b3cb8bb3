"""server.deploy_plan (`python -m server.repository --plan`): the official checkpoint planned for 1,
2, 4 and 8 H200s on the CPU, each GPU's free memory given to the sizing code; golden cells worked
out by hand, the measured step times read from their results file, and docs/deploy_h200.md holding
the command's output."""

from pathlib import Path

import pytest

from server import deploy_plan, repository

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- python -m server.repository --plan -->\n", "\n<!-- end of python -m server.repository --plan -->"


@pytest.fixture(scope="module")
def table() -> str:
    return deploy_plan.plan_table()


def cells(table: str) -> dict[tuple[str, str, str], list[str]]:
    """{(H200s, DiT, placement): the row's other cells}."""
    rows = {}
    for line in table.splitlines()[2:]:
        count, dit, placement, *rest = [cell.strip() for cell in line.strip("|").split("|")]
        rows[count, dit, placement] = rest
    return rows


def test_the_measured_steps_are_the_results_files():
    # benchmarks/results/fp8_h200.json, summary: the h3 DiT's 1 x and 4 x 16,384-row steps on one H200
    steps = deploy_plan.measured_steps()
    assert [round(value, 3) for value in steps["none"] + steps["fp8"]] == [1.756, 6.997, 1.394, 5.532]
    assert deploy_plan.step_seconds(1, (1.0, 4.0)) == 1.0 and deploy_plan.step_seconds(3, (1.0, 4.0)) == 3.0


def test_golden_cells(table):
    rows = cells(table)
    assert len(rows) == 2 * (2 + 3 * 3)  # bf16 and fp8; one GPU: shared and cpu; more: shared, own, cpu
    # one H200, bf16: 142,629 MiB - 63,209 MiB DiT - 592 MiB AdaLN table (64 values) - 2 x 14,402 MiB
    # decodes - 47,984 MiB Qwen3-VL = 2,040 MiB - 1,407 MiB of CUDA graph pool (4,096 x 67 x 5,376 B) = 633 MiB
    # / (67 x 5,376 B + 12 held requests x 768 B of step cache) = 1,796.8 -> 1,792 rows, under the 16,384-row
    # request
    assert rows["1", "bf16", "**shared** (default)"] == ["1 (GPU 0)", "GPU 0", "1,792 x 1", "1,792 (refuses it)"] + [
        "0 / 12",
        "0.00",
    ]
    # fp8: 142,629 - 44,847 - 592 (AdaLN table) - 28,804 - 47,984 - 1,302 (graph pool, 4,096 x 62 x 5,376 B)
    # = 19,100 MiB / (62 x 5,376 B + 12 x 768 B) = 58,470.6 -> 58,432; 3 requests a step of 1.394 +
    # (5.532 - 1.394) x 2 / 3 = 4.153 s: 60 x 3 / (30 x 4.153) = 1.44 a minute
    assert rows["1", "fp8", "**shared** (default)"] == ["1 (GPU 0)", "GPU 0", "58,432 x 1", "58,432", "3 / 12", "1.44"]
    # two H200s in bf16: the encoder and the VAEs on GPU 1, one full instance (60 x 4 / (30 x 6.997) = 1.14)
    assert rows["2", "bf16", "**own** (default)"] == ["1 (GPU 0)", "GPU 1", "65,536 x 1", "65,536", "4 / 12", "1.14"]
    assert rows["2", "bf16", "shared"][2:4] == ["65,536 x 1, 1,792 x 1", "1,792 (refuses it)"]
    assert rows["8", "fp8", "**shared** (default)"] == ["8 (GPU 0-7)", "GPU 0", "65,536 x 7, 58,432 x 1"] + [
        "58,432",
        "31 / 96",
        "11.57",
    ]
    assert rows["8", "bf16", "**own** (default)"][:2] == ["7 (GPU 0-6)", "GPU 7"]


def test_docs_deploy_h200_holds_the_commands_output(table):
    text = (ROOT / "docs" / "deploy_h200.md").read_text()
    assert text[text.index(START) + len(START) : text.index(END)] == table


def test_plan_takes_no_other_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        repository.main(["--plan", "--gpus", "0"])
    assert exit_.value.code == 2 and "--plan takes no other option" in capsys.readouterr().err
