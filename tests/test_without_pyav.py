"""A host without PyAV (no server): h3_core.media and everything importing it still import,
encode_mp4 refuses with RuntimeError, and h3_dit's parse refuses return_mp4=true at arrival.

Each test runs a fresh interpreter with sys.modules["av"] = None, which makes `import av`
raise ImportError as on such a host.
"""

import subprocess
import sys

from server.environment import find_tritonserver

from .serving import ROOT

HIDE_AV = 'import sys\nsys.modules["av"] = None\n'
MP4_REFUSAL = "encode_mp4 needs PyAV, which is not installed: `pip install av`, or on the server send return_mp4=false"
DIT_REFUSAL = (
    "return_mp4=true needs PyAV, which this server does not have: send return_mp4=false (with "
    "return_frames / return_audio for raw outputs) or install av"
)


def run_without_av(script: str) -> list[str]:
    """Run HIDE_AV + script with this interpreter in the repository root; returns its stdout lines."""
    run = subprocess.run(
        [sys.executable, "-c", HIDE_AV + script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_media_imports_and_encode_mp4_refuses_without_pyav(tmp_path):
    lines = run_without_av(f"""
import numpy as np
import client.generate, h3_core.demo  # modules that import h3_core.media
from h3_core import media
print(media.MP4_AVAILABLE)
print(len(media.encode_wav(np.zeros((2, 4), np.float32))))  # WAV needs no PyAV: 44-byte header + 16 bytes
for encode in (media.encode_mp4, lambda *args: media.write_mp4({str(tmp_path / "clip.mp4")!r}, *args)):
    try:
        encode(np.zeros((1, 32, 32, 3), np.uint8), None)
    except RuntimeError as error:
        print(error)
""")
    assert lines == ["False", "60", MP4_REFUSAL, MP4_REFUSAL]
    assert not (tmp_path / "clip.mp4").exists()


def test_h3_dit_refuses_return_mp4_true_before_any_dit_work_without_pyav():
    # the model modules import without av (h3_vae's from the wheel's triton_python_backend_utils);
    # the step loop's parse refuses return_mp4 before it touches the engine (there is none here)
    lines = run_without_av(f"""
import importlib.util, json
sys.path.insert(0, {str(find_tritonserver()[1] / "python")!r})
for name in ("h3_vae", "h3_dit"):
    spec = importlib.util.spec_from_file_location(name, f"model_repository/{{name}}/1/model.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
from h3_core.serving.dit.admission import parse
from h3_core.serving.dit.events import Arrival
from h3_core.serving.shared.settings import DitSettings
print(parse.__globals__["MP4_AVAILABLE"])
settings = DitSettings()
for parameters in ({{}}, {{"return_mp4": True}}, {{"return_mp4": False, "progress_every": -1}}):
    try:  # no engine: parse must refuse before using it
        parse(Arrival(handle=1, key=1, new=True, parameters_json=json.dumps(parameters)), {{}}, 0.0, None, settings)
    except ValueError as error:
        print(error)
""")
    # return_mp4=false passes the check; progress_every's range is checked with the other parameters
    assert lines == ["False", DIT_REFUSAL, DIT_REFUSAL, "progress_every=-1 is out of range: allowed >= 0"]
