"""python -m client.generate without a server, against FakeTriton (tests/test_client_api.py): its
flags refused before sending, every numbered output, WAV and preview written, Ctrl-C before, during
the steps, in the queue and during the decode, the same fl2va request as the API."""

import re
import threading

import numpy as np
import pytest

import client.generate as generate_module
from client.api import H3Client
from client.generate import main
from h3_core import protocol
from h3_core.media import encode_wav

from .test_client_api import FIRST_IMAGE, LAST_IMAGE, FakeTriton, results_script

# ---- python -m client.generate ------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--url", "http://127.0.0.1:8001"],
            "argument --url: url must be host:port without a scheme, got 'http://127.0.0.1:8001'",
        ),
        (["--idle-timeout", "-1"], "argument --idle-timeout: must be a number of seconds > 0, got '-1'"),
        (["--total-timeout", "0"], "argument --total-timeout: must be a number of seconds > 0, got '0'"),
        (["--deadline", "nan"], "argument --deadline: must be a number of seconds > 0, got 'nan'"),
        (["--steps", "-1"], "argument --steps: must be an integer >= 1, got '-1'"),
        (["--height", "2.5"], "argument --height: must be an integer >= 1, got '2.5'"),
        (["--num-outputs", "0"], "argument --num-outputs: must be an integer >= 1, got '0'"),
        (["--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
        (["--request-id", ""], "argument --request-id: must be a non-empty string, got ''"),
        (["--preview-every", "2"], "--preview-every needs --preview-dir"),
        (["--fit", "bad"], "argument --fit: invalid choice: 'bad' (choose from 'crop', 'pad', 'stretch')"),
        (["--task", "i2v"], "argument --task: invalid choice: 'i2v' (choose from 't2va', 'fl2va', 'ref2va')"),
        (["--flow-shift", "0"], "argument --flow-shift: must be a number from 0.01 to 100, got '0'"),
        (["--audio-flow-shift", "nan"], "argument --audio-flow-shift: must be a number from 0.01 to 100, got 'nan'"),
        (["--flow-shift", "101"], "argument --flow-shift: must be a number from 0.01 to 100, got '101'"),
        (["--cache-threshold", "-0.1"], "argument --cache-threshold: must be a finite number >= 0, got '-0.1'"),
        (["--first-frame", "/nonexistent/a.png"], "--first-frame /nonexistent/a.png: no such file"),
        (["--last-frame", "."], "--last-frame . is not a file; give an image file's path"),
        (["--out", "."], "--out . is a folder; give a file path"),
        (["--wav", "."], "--wav . is a folder; give a file path"),
        (["--out", "/sys/clip.mp4"], "--out /sys/clip.mp4: cannot write in /sys (Permission denied)"),
        (["--wav", "/sys/x/clip.wav"], "--wav /sys/x/clip.wav: cannot write in /sys (Permission denied)"),
    ],
)
def test_generate_cli_refuses_bad_flags_before_sending(flags, message, capsys):
    argv = ["--prompt", "a", "--out", "clip.mp4", "--url", "127.0.0.1:1", *flags]
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"python -m client.generate: error: {message}"
    assert "Traceback" not in err


def test_generate_cli_checks_every_numbered_output_and_the_preview_folder(tmp_path, capsys):
    (tmp_path / "clip-1.mp4").mkdir()
    (tmp_path / "file").write_text("")
    for flags, message in [
        (
            ["--out", f"{tmp_path}/clip.mp4", "--num-outputs", "2"],
            f"--out {tmp_path}/clip-1.mp4 is a folder; give a file path",
        ),
        (["--out", f"{tmp_path}/file/clip.mp4"], f"--out {tmp_path}/file/clip.mp4: {tmp_path}/file is not a folder"),
        (["--preview-dir", f"{tmp_path}/file"], f"--preview-dir {tmp_path}/file is a file; give a folder path"),
    ]:
        with pytest.raises(SystemExit) as raised:
            main(["--prompt", "a", "--out", f"{tmp_path}/ok.mp4", "--url", "127.0.0.1:1", *flags])
        assert raised.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"python -m client.generate: error: {message}"


def test_generate_cli_shows_no_progress_bar_when_the_connection_fails(tmp_path, capsys):
    assert main(["--prompt", "a", "--out", str(tmp_path / "clip.mp4"), "--url", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: UNAVAILABLE: ")
    assert not (tmp_path / "clip.mp4").exists()


def test_generate_cli_writes_every_output_wav_and_preview(monkeypatch, tmp_path, capsys):
    preview = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    fake = FakeTriton(results_script(2, preview)).install(monkeypatch)
    status = main(
        [
            "--prompt",
            "a",
            "--out",
            str(tmp_path / "clip.mp4"),
            "--wav",
            str(tmp_path / "clip.wav"),
            "--num-outputs",
            "2",
            "--preview-dir",
            str(tmp_path / "previews"),
            "--deadline",
            "9",
            "--priority",
            "2",
            "--request-id",
            "cli-test",
            "--steps",
            "2",
            "--url",
            "fake:1",
        ]
    )
    assert status == 0
    (request,) = fake.requests
    assert request.request_id == "cli-test"
    assert request.inputs == ["PROMPT", "NUM_INFERENCE_STEPS", "NUM_OUTPUTS"]
    assert request.parameters == {
        "progress_every": 1,
        "preview_every": 1,
        "deadline_s": 9.0,
        "request_priority": 2,
        "return_audio": True,
    }
    assert [(tmp_path / f"clip-{k}.mp4").read_bytes() for k in (0, 1)] == [b"mp4-0", b"mp4-1"]
    assert (tmp_path / "clip-1.wav").read_bytes() == encode_wav(np.full((2, 640), 0.25, np.float32))
    assert sorted(p.name for p in (tmp_path / "previews").iterdir()) == ["step-001.npy"]
    saved = np.load(tmp_path / "previews" / "step-001.npy")  # no pickle: numpy's default refuses object arrays
    assert np.array_equal(saved, preview)
    (line,) = capsys.readouterr().out.splitlines()
    written = ", ".join(
        [
            *(f"{tmp_path}/clip-{k}.{ext}" for ext in ("mp4", "wav") for k in (0, 1)),
            f"1 previews in {tmp_path}/previews",
        ]
    )
    assert re.fullmatch(rf"wrote {re.escape(written)} \(22 frames 96x64, 2 steps\) in \d+\.\d\d s, seeds 7, 8", line)


@pytest.mark.parametrize("url", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "host:port"])
def test_a_url_without_a_valid_port_is_refused(url):
    with pytest.raises(ValueError, match=r"^url must be host:port with a port in 1\.\.65535, got "):
        H3Client(url)


# ---- Ctrl-C in python -m client.generate (tests/test_cli_ctrl_c.py: the program, SIGINT) --------

CLI_FLAGS = ["--prompt", "a", "--request-id", "cli-test", "--url", "fake:1"]


def test_ctrl_c_before_the_request_is_sent_sends_nothing(monkeypatch, tmp_path, capsys):
    fake = FakeTriton(results_script()).install(monkeypatch)
    pressed = threading.Event()
    pressed.set()
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4")], interrupted=pressed) == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted before the request was sent"]
    assert (fake.requests, fake.made, list(tmp_path.iterdir())) == ([], 0, [])


def test_ctrl_c_during_the_steps_cancels_on_the_server(monkeypatch, tmp_path, capsys):
    pressed = threading.Event()
    progress, _, result, final = results_script()  # progress after steps 1 and 2, the result, the final response
    fake = FakeTriton([progress, (0, pressed), (60, result[1]), final]).install(monkeypatch)  # 60 s: until the cancel
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4")], interrupted=pressed) == 130
    messages = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("denois")]
    assert messages == ["cancelled on the server: request cli-test cancelled by request at step 1 of 2"]
    assert [(r.model, r.request_id) for r in fake.requests] == [
        (protocol.PIPELINE_MODEL, "cli-test"),
        (protocol.CANCEL_MODEL, ""),
    ]
    assert fake.made == fake.closed == 2 and list(tmp_path.iterdir()) == []


def test_ctrl_c_during_the_decode_writes_the_result_that_arrives(monkeypatch, tmp_path, capsys):
    pressed = threading.Event()
    first, second, result, final = results_script()
    script = [first, second, (0, pressed), (60, result[1]), final]  # the result comes after the cancel's answer
    fake = FakeTriton(script, cancel_state="finished").install(monkeypatch)
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4")], interrupted=pressed) == 0
    captured = capsys.readouterr()
    assert [line for line in captured.err.splitlines() if line and not line.startswith("denois")] == []
    (line,) = captured.out.splitlines()
    wrote = rf"wrote {re.escape(str(tmp_path))}/x\.mp4 \(22 frames 96x64, 2 steps\) in \d+\.\d\d s, seed 7"
    assert re.fullmatch(f"the result arrived; {wrote}", line)
    assert (tmp_path / "x.mp4").read_bytes() == b"mp4-0"
    assert [r.model for r in fake.requests] == [protocol.PIPELINE_MODEL, protocol.CANCEL_MODEL]
    assert fake.made == fake.closed == 2


def test_generate_cli_sends_the_same_fl2va_request_as_the_api(monkeypatch, tmp_path):
    (tmp_path / "a.png").write_bytes(FIRST_IMAGE)
    (tmp_path / "b.jpg").write_bytes(LAST_IMAGE)
    fake = FakeTriton(results_script() * 2).install(monkeypatch)
    flags = ["--fit", "stretch", "--flow-shift", "5", "--audio-flow-shift", "3.5", "--task", "fl2va"]
    keyframes = ["--first-frame", str(tmp_path / "a.png"), "--last-frame", str(tmp_path / "b.jpg")]
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4"), *keyframes, *flags]) == 0
    H3Client("fake:1").generate(
        b"a",
        first_frame=tmp_path / "a.png",
        last_frame=LAST_IMAGE,
        fit="stretch",
        flow_shift=5.0,
        audio_flow_shift=3.5,
        task="fl2va",
        num_outputs=1,
        progress_every=1,
        request_id="cli-test",
    )
    cli, api_call = fake.requests
    assert vars(cli) == vars(api_call)
    assert cli.tensors["KEYFRAMES"] == ("BYTES", [1, 2], [FIRST_IMAGE, LAST_IMAGE])
    assert cli.tensors["KEYFRAME_INDICES"] == ("INT64", [1, 2], [0, -1])
    assert cli.parameters == {
        "progress_every": 1,
        "fit": "stretch",
        "flow_shift": 5.0,
        "audio_flow_shift": 3.5,
    }


def test_ctrl_c_while_queued_before_the_dit_ends_at_once(monkeypatch, tmp_path, capsys):
    # the cancel answers "unknown" (queued behind a request-mode generation): the server ends the
    # request with CANCELLED when it reaches the DiT, so the program does not wait STOP_WAIT_S
    pressed = threading.Event()
    script = [(0, pressed), (600, results_script()[3][1])]  # no response until the cancel
    fake = FakeTriton(script, cancel_state="unknown").install(monkeypatch)
    monkeypatch.setattr(generate_module, "STOP_WAIT_S", 5.0)  # before the fix: 5 s, then "no final response"
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4")], interrupted=pressed) == 130
    messages = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("denois")]
    assert messages == [
        "cancelled before it started: request cli-test had not reached the DiT; the server remembers the id for "
        "600 s and ends it with CANCELLED when it does"
    ]
    assert [r.model for r in fake.requests] == [protocol.PIPELINE_MODEL, protocol.CANCEL_MODEL]


def test_generate_cli_reports_a_failure_of_the_client_itself(monkeypatch, tmp_path, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("out of file descriptors")

    monkeypatch.setattr(H3Client, "generate", fail)
    assert main([*CLI_FLAGS, "--out", str(tmp_path / "x.mp4")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: UNKNOWN: the client failed: RuntimeError: out of file descriptors"
    ]
    assert list(tmp_path.iterdir()) == []
