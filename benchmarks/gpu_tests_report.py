"""The result of `make test-gpu` as a JSON document: the pytest run's junit XML plus the machine.

    python3 benchmarks/gpu_tests_report.py --junit OUT/gpu.xml --out benchmarks/results/gpu_tests_h200.json
        [--command "make test-gpu OUT=..."]

Writes {"date", "hardware", "device_count", "torch", "cuda", "python", "command", "summary":
{"tests", "passed", "failed", "errors", "skipped", "seconds"}, "tests": [{"name", "outcome",
"seconds", "message"}]}: outcome is passed, failed, error or skipped; message is the failure's,
the error's or the skip's (None for a pass). hardware is torch.cuda.get_device_name() of the
machine running this script (run it where the tests ran), or "CPU" without CUDA.
"""

import argparse
import datetime
import json
import platform
import xml.etree.ElementTree as ET
from pathlib import Path

OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}  # junit child element -> outcome


def read_junit(path: str | Path) -> list[dict]:
    """Every testcase of a pytest junit XML file: {"name": "<classname>::<name>", "outcome",
    "seconds", "message"}, in file order. Raises ET.ParseError for a file that is not XML and
    ValueError when it holds no testsuite."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{path} holds no junit <testsuite>")
    tests = []
    for case in (case for suite in suites for case in suite.iter("testcase")):
        outcome, message = "passed", None
        for child in case:
            if child.tag in OUTCOMES:
                outcome, message = OUTCOMES[child.tag], child.get("message")
                break
        name = f"{case.get('classname')}::{case.get('name')}"
        tests.append({"name": name, "outcome": outcome, "seconds": float(case.get("time", 0)), "message": message})
    return tests


def summary(tests: list[dict]) -> dict:
    """Counts per outcome and the seconds summed over the tests."""
    counts = {outcome: sum(t["outcome"] == outcome for t in tests) for outcome in ("passed", "failed", "error")}
    return {
        "tests": len(tests),
        "passed": counts["passed"],
        "failed": counts["failed"],
        "errors": counts["error"],
        "skipped": sum(t["outcome"] == "skipped" for t in tests),
        "seconds": round(sum(t["seconds"] for t in tests), 3),
    }


def machine() -> dict:
    """The GPU, their count, the torch and CUDA versions and Python of this process's machine."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "hardware": torch.cuda.get_device_name() if cuda else "CPU",
        "device_count": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", type=Path, required=True, help="pytest --junitxml file")
    parser.add_argument("--out", type=Path, required=True, help="the JSON document to write")
    parser.add_argument("--command", default="make test-gpu", help="the command that ran the tests")
    args = parser.parse_args()
    tests = read_junit(args.junit)
    document = {
        "date": datetime.date.today().isoformat(),
        **machine(),
        "command": args.command,
        "summary": summary(tests),
        "tests": tests,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    s = document["summary"]
    print(f"{args.out}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped")


if __name__ == "__main__":
    main()
