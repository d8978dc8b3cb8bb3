"""h3_dit's admission safety net (no server): an unexpected exception while a request is
admitted ends that request with INTERNAL: and one line, never a traceback or a server path, and
the traceback goes to the server log.

No validated input reaches the net any more (the end-to-end cases are in test_bad_input.py), so
parse is replaced by one that raises what TEXT_EMBEDS [1, 3, 0] used to raise. The model module
is loaded in a fresh interpreter with the wheel's triton_python_backend_utils, to which the
test adds what the stub provides at run time (TritonError, InferenceResponse, Logger).
"""
import subprocess
import sys

from server.launch import find_tritonserver

from .serving import ROOT

SCRIPT = f"""
import importlib.util, sys, types
sys.path.insert(0, {str(find_tritonserver()[1] / "python")!r})
import triton_python_backend_utils as pb_utils

class TritonError(Exception):
    INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL"
    def __init__(self, message, code=None):
        self.message, self.code = message, code

class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self.error = error

logged = []
pb_utils.TritonError, pb_utils.InferenceResponse = TritonError, InferenceResponse
pb_utils.Logger = types.SimpleNamespace(log_error=logged.append)
spec = importlib.util.spec_from_file_location("h3_dit_model", "model_repository/h3_dit/1/model.py")
dit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dit)

class Counter:
    value = 0
    def increment(self, n):
        self.value += n

class Sender:
    sent = []
    def send(self, response, flags=0):
        self.sent.append((response, flags))

class Request:
    def get_response_sender(self):
        return Sender()
    def request_id(self):
        return ""

def parse(request, key, fields):
    raise RuntimeError("cannot reshape tensor of 0 elements into shape [-1, 0] because the unspecified dimension "
                       "size -1 can be any value and is ambiguous\\n\\nAt:\\n  /srv/repo/h3_dit/1/model.py(274): parse")

model = dit.TritonPythonModel.__new__(dit.TritonPythonModel)
model.metrics = types.SimpleNamespace(failures=Counter(), refusals=Counter())
model.draining, model.parse, model.jobs = False, parse, {{}}
print(model.admit(Request(), 7, {{}}), model.jobs, model.metrics.failures.value, model.metrics.refusals.value)
response, flags = Sender.sent[0]
print(len(Sender.sent), flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, response.error.code)
print(response.error.message)
print(len(logged), logged[0].splitlines()[0], "Traceback (most recent call last):" in logged[0], "/srv/repo" in logged[0])
"""


def test_an_unexpected_exception_while_admitting_ends_only_that_request_with_internal():
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "None {} 1 0",
        "1 True INTERNAL",
        "INTERNAL: the request could not be admitted (RuntimeError: cannot reshape tensor of 0 elements into shape "
        "[-1, 0] because the unspecified dimension size -1 can be any value and is ambiguous); see the server log",
        "1 h3_dit: request 7 could not be admitted: True True",
    ]
