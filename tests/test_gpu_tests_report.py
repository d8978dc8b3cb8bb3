"""benchmarks/gpu_tests_report.py: a pytest junit XML -> the make test-gpu JSON summary."""

import json
import subprocess
import sys

import pytest

from .serving import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_tests_report import read_junit, summary  # noqa: E402 - after the sys.path set-up above

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
errors="1" failures="1" skipped="1" tests="4" time="3.5">
<testcase classname="tests.test_gpu" name="test_a" time="1.25" />
<testcase classname="tests.test_gpu" name="test_b[tiny]" time="2.0"><failure message="AssertionError: 1 != 2">
trace</failure></testcase>
<testcase classname="tests.test_gpu" name="test_c" time="0.003"><skipped type="pytest.skip"
message="needs 2 GPUs (not lent)">tests/test_gpu.py:299: needs 2 GPUs (not lent)</skipped></testcase>
<testcase classname="tests.test_gpu" name="test_d" time="0.25"><error message="failed on setup">x</error></testcase>
</testsuite></testsuites>"""


def test_testcases_and_their_summary(tmp_path):
    path = tmp_path / "gpu.xml"
    path.write_text(JUNIT)
    tests = read_junit(path)
    assert tests == [
        {"name": "tests.test_gpu::test_a", "outcome": "passed", "seconds": 1.25, "message": None},
        {
            "name": "tests.test_gpu::test_b[tiny]",
            "outcome": "failed",
            "seconds": 2.0,
            "message": "AssertionError: 1 != 2",
        },
        {
            "name": "tests.test_gpu::test_c",
            "outcome": "skipped",
            "seconds": 0.003,
            "message": "needs 2 GPUs (not lent)",
        },
        {"name": "tests.test_gpu::test_d", "outcome": "error", "seconds": 0.25, "message": "failed on setup"},
    ]
    assert summary(tests) == {"tests": 4, "passed": 1, "failed": 1, "errors": 1, "skipped": 1, "seconds": 3.503}


def test_the_script_writes_the_document(tmp_path):
    (tmp_path / "gpu.xml").write_text(JUNIT)
    out = tmp_path / "results" / "gpu_tests.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_tests_report.py", "--junit", str(tmp_path / "gpu.xml"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"{out}: 1 passed, 1 failed, 1 errors, 1 skipped\n"
    document = json.loads(out.read_text())
    assert list(document) == [
        "date",
        "hardware",
        "device_count",
        "torch",
        "cuda",
        "python",
        "command",
        "summary",
        "tests",
    ]
    assert document["command"] == "make test-gpu"
    assert document["summary"]["failed"] == 1 and len(document["tests"]) == 4


def test_a_file_without_a_testsuite_is_refused(tmp_path):
    path = tmp_path / "empty.xml"
    path.write_text("<testsuites />")
    with pytest.raises(ValueError, match="holds no junit <testsuite>"):
        read_junit(path)
