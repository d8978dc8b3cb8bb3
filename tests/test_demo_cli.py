"""python -m h3_core.demo: defaults, the shipped demo weights, and bad flags (exit status 2, one line)."""

import re

import pytest

from h3_core.demo import TRAINED, checkpoint_folder, main

from .serving import ROOT

PROG = "python -m h3_core.demo: error: "


def refused(argv: list[str], capsys) -> str:
    """The last stderr line of main(argv), which must exit with status 2 and no traceback."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_an_unknown_config_is_refused(tmp_path, capsys):
    assert refused(["--config", "nonsense", "--prompt", "a", "--out", str(tmp_path)], capsys) == (
        PROG + "config 'nonsense' is unknown; choose one of ['bench', 'demo', 'h3', 'small', 'tiny']"
    )


def test_a_missing_checkpoint_folder_is_refused(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert refused(["--checkpoint", str(missing), "--prompt", "a", "--out", str(tmp_path)], capsys) == (
        PROG + f"--checkpoint {missing} is not a folder"
    )


def test_a_checkpoint_folder_without_weights_is_refused(tmp_path, capsys):
    assert refused(["--checkpoint", str(tmp_path), "--prompt", "a", "--out", str(tmp_path)], capsys) == (
        PROG + f"cannot load config 'tiny' from {tmp_path}: weights file {tmp_path}/dit.safetensors not found"
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--height", "0"], "height=0 is out of range: allowed multiples of 32 in 32..256"),  # not the default
        (["--steps", "0"], "num_inference_steps=0 is out of range: allowed 1..50"),
        (["--seed", "-1"], "seed=-1 is out of range: allowed 0..9223372036854775807"),
    ],
)
def test_zero_and_negative_values_are_refused_not_replaced(flags, message, tmp_path, capsys):
    assert refused(["--config", "demo", "--prompt", "a", "--out", str(tmp_path), *flags], capsys) == PROG + message
    assert list(tmp_path.iterdir()) == []


def test_the_demo_config_uses_the_shipped_weights(tmp_path, capsys):
    assert checkpoint_folder("demo", None) == TRAINED["demo"] == ROOT / "weights" / "demo"
    assert checkpoint_folder("demo", tmp_path) == tmp_path
    main(
        [
            "--config",
            "demo",
            "--prompt",
            "a red ball rolls to the left",
            "--out",
            str(tmp_path),
            "--steps",
            "1",
            "--height",
            "32",
            "--width",
            "32",
            "--num-frames",
            "1",
            "--seed",
            "3",
        ]
    )
    (line,) = capsys.readouterr().out.splitlines()
    path = tmp_path / "a-red-ball-rolls-to-the-left-3.mp4"
    expected = f"wrote {path} (5 frames 32x32, 6667 audio samples, seed 3, weights {ROOT}/weights/demo)"
    assert re.fullmatch(re.escape(expected) + r" in \d+\.\d\d s", line)
    assert path.stat().st_size > 0
