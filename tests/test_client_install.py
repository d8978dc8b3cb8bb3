"""`pip install "h3-triton[client]"` into a fresh venv gives a working client without torch or PyAV.

The project is copied to a temporary folder first (the installed files are the same): building it
in place would leave build/ and h3_triton.egg-info/ in the checkout. The fresh venv gets no pip of
its own (that saves ensurepip's seconds); this interpreter's pip installs into it (`pip --python`),
with the declared dependencies, from the configured index.
"""

import os
import shutil
import subprocess
import sys
import venv

from .serving import ROOT

BUILD_LEFTOVERS = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build")  # anywhere
NOT_PACKAGED = {"checkpoints", "out", "weights", "docs", "tests", "benchmarks", "model_repository"}  # top level only


def not_packaged(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore: build leftovers anywhere, and the top-level folders the package does not
    hold (h3_core/weights/ is packaged; the top-level weights/ is not)."""
    return BUILD_LEFTOVERS(folder, names) | (NOT_PACKAGED & set(names) if folder == str(ROOT) else set())


def test_the_client_extra_installs_and_runs_without_torch(tmp_path):
    source, env_dir = tmp_path / "h3-triton", tmp_path / "venv"
    shutil.copytree(ROOT, source, ignore=not_packaged)
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", f"{source}[client]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr

    check = subprocess.run(
        [
            python,
            "-c",
            """
import importlib.util, client, h3_core.protocol, sys
print(client.__file__.startswith(sys.prefix), h3_core.protocol.PIPELINE_MODEL)
print([name for name in ("torch", "av", "matplotlib") if importlib.util.find_spec(name)])
""",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.splitlines() == ["True h3_pipeline", "[]"]

    helped = subprocess.run(
        [python, "-m", "client.generate", "--help"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: python -m client.generate ")
