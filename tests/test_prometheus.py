"""deploy/k8s/monitoring against the real tools (Debian's prometheus package: promtool and
prometheus): the PrometheusRule's rules through `promtool check rules` and `promtool test rules`
(prometheus-rules.test.yaml), a real Prometheus scraping the session's tritonserver under load
(the recording rule's value, the refusal count the alert divides), every dashboard query parsed
by that Prometheus and naming only metrics the server exports or the rules record, and the
prometheus-adapter values' names (the adapter and Grafana cannot be installed here)."""

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from client.api import H3Client, H3Error
from server.environment import pick_free_ports
from tests.serving import generate_in_thread

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "monitoring"
INSTALL = "install Debian's prometheus package (apt-get install prometheus; scripts/setup.sh does)"
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def tool(name: str) -> str:
    """The path of promtool or prometheus; fails the test, naming the package, when absent."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL}")
    return path


def rule_spec() -> dict:
    """spec of the PrometheusRule (groups, as a Prometheus rule file holds them)."""
    rule = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    return rule["spec"]


def recorded_names() -> set[str]:
    return {rule["record"] for group in rule_spec()["groups"] for rule in group["rules"] if "record" in rule}


def write_rules(folder: Path) -> Path:
    """The PrometheusRule's spec as the rule file prometheus-rules.test.yaml names."""
    path = folder / "prometheus-rules.spec.yaml"
    path.write_text(yaml.safe_dump(rule_spec()))
    return path


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (as Prometheus formats it) selects: identifiers outside
    strings, label matchers, ranges, numbers, durations and by / without / on / ignoring /
    group_left / group_right lists, that are neither called (functions, aggregations) nor
    keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\b\d[\w.]*", " ", text)  # numbers and durations (0.95, 1e9, offset 5m)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if not text[match.end() :].lstrip().startswith("(") and match.group() not in PROMQL_KEYWORDS:
            names.add(match.group())
    return names


def test_metric_names_of_an_expression():
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(h3_step_seconds_bucket{model="h3_dit"}[1m]))) '
        "/ on (pod) group_left () clamp_min(h3:queue_to_compute:ratio offset 5m, 1) > bool 2 "
        'and time() - max without (instance) (h3_heartbeat_timestamp_seconds{x="a{b}"})'
    )
    assert metric_names(expr) == {
        "h3_step_seconds_bucket",
        "h3:queue_to_compute:ratio",
        "h3_heartbeat_timestamp_seconds",
    }


def test_promtool_checks_the_rules(tmp_path):
    run = subprocess.run(
        [tool("promtool"), "check", "rules", str(write_rules(tmp_path))], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.strip() for line in run.stdout.splitlines() if line.strip()][-1] == "SUCCESS: 5 rules found"


def test_promtool_unit_tests_cover_every_rule(tmp_path):
    write_rules(tmp_path)
    shutil.copy(MONITORING / "prometheus-rules.test.yaml", tmp_path)
    run = subprocess.run(
        [tool("promtool"), "test", "rules", "prometheus-rules.test.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["Unit", "Testing:", "prometheus-rules.test.yaml", "SUCCESS"]
    tests = yaml.safe_load((MONITORING / "prometheus-rules.test.yaml").read_text())["tests"]
    alerts = {rule["alert"] for group in rule_spec()["groups"] for rule in group["rules"] if "alert" in rule}
    assert alerts == {"H3HeartbeatStalled", "H3RefusalsRising", "H3TimeToFirstStepP95High", "H3GpuMemoryNearBudget"}
    fired = {check["alertname"] for test in tests for check in test.get("alert_rule_test", []) if check["exp_alerts"]}
    assert fired == alerts  # each alert is shown firing (and, in its test, not firing before)
    assert {
        name for test in tests for check in test.get("promql_expr_test", []) for name in metric_names(check["expr"])
    } == (recorded_names())


def test_the_adapter_exposes_the_recorded_ratio():
    values = yaml.safe_load((MONITORING / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert metric_names(rule["seriesQuery"]) == recorded_names() == {"h3:queue_to_compute:ratio"}
    assert rule["name"] == {"matches": "^h3:queue_to_compute:ratio$", "as": "h3_queue_to_compute_ratio"}
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    hpa = yaml.safe_load((MONITORING / "hpa.yaml").read_text())
    assert [metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]] == ["h3_queue_to_compute_ratio"]


# -- a real Prometheus scraping a real tritonserver -----------------------------------------------


class Prometheus:
    """A prometheus process scraping one tritonserver's /metrics every second (job h3, with the
    target labels namespace="ci" and pod="h3-triton-0" that the PodMonitor's targets carry) and
    evaluating the PrometheusRule's rules every second."""

    def __init__(self, folder: Path, metrics_url: str):
        target = urllib.parse.urlparse(metrics_url).netloc
        (self.port,) = pick_free_ports(1, "127.0.0.1")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(write_rules(folder))],
            "scrape_configs": [
                {
                    "job_name": "h3",
                    "static_configs": [{"targets": [target], "labels": {"namespace": "ci", "pod": "h3-triton-0"}}],
                }
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(folder / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.wait(lambda: self.query("up") == {(): 1.0}, 60, "the first scrape")

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400 for a query that does not parse
            if error.code == 503:  # "Service Unavailable" (plain text) while it starts: wait() asks again
                raise
            return json.load(error)

    def query(self, expr: str, by: tuple = ()) -> dict:
        """{values of the labels `by`: value} of an instant query; fails on an error answer."""
        answer = self.api("query", query=expr)
        assert answer["status"] == "success", answer
        return {tuple(s["metric"].get(name) for name in by): float(s["value"][1]) for s in answer["data"]["result"]}

    def wait(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                pytest.fail(
                    f"prometheus exited with {self.process.returncode}: {Path(self.log.name).read_text()[-2000:]}"
                )
            try:
                if condition():
                    return
            except OSError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus: no {what} within {timeout_s} s")
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    instance = Prometheus(tmp_path_factory.mktemp("prometheus"), server.metrics_url)
    yield instance
    instance.stop()


def test_the_recording_rule_follows_the_load(server, prometheus):
    """6 requests of 400 steps on the session's server (max_num_seqs 4, every one fits a pack):
    4 in the pack and 2 waiting, so 2 / 4 = 0.5 requests wait per request computing; 0 once
    they are cancelled."""
    client, outcome, started = H3Client(server.grpc_url, idle_timeout_s=120), {}, [threading.Event() for _ in range(6)]
    threads = [
        generate_in_thread(
            client,
            outcome,
            k,
            prompt=f"load {k}",
            num_inference_steps=400,
            request_id=f"load-{k}",
            progress_every=1,
            return_mp4=False,
            on_progress=lambda step, total, position, k=k: started[k].set(),
        )
        for k in range(6)
    ]
    assert all(event.wait(60) for event in started)
    ratio = 'h3:queue_to_compute:ratio{namespace="ci", pod="h3-triton-0"}'
    prometheus.wait(lambda: prometheus.query(ratio) == {(): 0.5}, 30, "ratio of 0.5 under the load")
    assert prometheus.query("sum(h3_waiting_requests)") == {(): 2.0}
    assert prometheus.query("sum(h3_active_requests)") == {(): 4.0}
    assert [client.cancel(f"load-{k}") for k in range(6)] == ["cancelled"] * 6
    for thread in threads:
        thread.join(60)
    assert sorted(outcome[k].code for k in range(6)) == ["CANCELLED"] * 6
    prometheus.wait(lambda: prometheus.query(ratio) == {(): 0.0}, 30, "ratio of 0 after the load")


def test_a_refused_request_counts_twice_as_the_refusal_alert_assumes(server, prometheus):
    failures = 'sum(nv_inference_request_failure{model="h3_pipeline"})'
    before = prometheus.query(failures)[()]
    client = H3Client(server.grpc_url, idle_timeout_s=60)
    for _ in range(2):
        with pytest.raises(H3Error) as refused:
            client.generate("", num_inference_steps=1)
        assert refused.value.code == "INVALID_ARG"
    prometheus.wait(lambda: prometheus.query(failures)[()] == before + 4, 30, "count of 2 x 2 failures")


def test_the_dit_device_memory_gauge_is_the_stub_resident_set(server, prometheus):
    (value,) = prometheus.query("h3_device_memory_bytes", by=("exported_instance",)).items()
    (pid,) = server.dit_stubs
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert value[0] == ("h3_dit_0_0",)
    assert 0.8 * resident <= value[1] <= 1.2 * resident  # set at the end of the DiT's last execute


def test_every_dashboard_query_parses_and_names_exported_metrics(prometheus):
    dashboard = json.loads((MONITORING / "h3-triton-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) == 19
    exported = {name for (name,) in prometheus.query('count by (__name__) ({job="h3"})', by=("__name__",))}
    assert {"h3_device_memory_bytes", "nv_inference_pending_request_count"} <= exported
    for expr in exprs:
        query = expr.replace("$__rate_interval", "1m")  # what Grafana puts there
        formatted = prometheus.api("format_query", query=query)
        assert formatted["status"] == "success", (expr, formatted)
        assert metric_names(formatted["data"]) <= exported | recorded_names(), expr
        assert prometheus.api("query", query=query)["status"] == "success", expr
    assert prometheus.api("format_query", query="sum(rate(h3_step_seconds_count[1m])")["errorType"] == "bad_data"
