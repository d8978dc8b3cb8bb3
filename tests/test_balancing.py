"""Client-side balancing over several servers (client.api): the targets H3Client accepts, the
channels it keeps, cancels sent to every server, and two real tritonservers on 127.0.0.1 and
127.0.0.2 behind one ipv4: target (the form a dns:/// name of a headless Service resolves to)."""

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client import api
from client.api import H3Client, H3Error, channel_args, check_url, server_addresses
from h3_core import protocol
from server.environment import pick_free_ports
from server.process import TritonServer
from tests.serving import generate_in_thread

LIMITS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


def test_targets_of_several_servers_are_accepted():
    for url in ("dns:///h3-triton-headless.h3.svc.cluster.local:8001", "ipv4:127.0.0.1:8001,127.0.0.2:8001"):
        assert check_url(url) == url
    for url in ("dns:///h3-triton-headless", "ipv4:127.0.0.1:8001,127.0.0.2", "ipv6:[::1]:0"):
        with pytest.raises(ValueError) as error:
            check_url(url)
        assert str(error.value) == f"url must be host:port with a port in 1..65535, got {url!r}"


def test_server_addresses():
    assert server_addresses("localhost:8001") == ["localhost:8001"]  # one server: not resolved
    assert server_addresses("ipv4:127.0.0.1:8001,127.0.0.2:9001") == ["127.0.0.1:8001", "127.0.0.2:9001"]
    assert server_addresses("ipv6:[::1]:8001") == ["[::1]:8001"]
    assert server_addresses("dns:///127.0.0.2:8001") == ["127.0.0.2:8001"]
    assert server_addresses("dns:///[::1]:8001") == ["[::1]:8001"]


def test_round_robin_only_for_several_servers():
    assert channel_args("127.0.0.1:8001") == LIMITS
    assert channel_args("dns:///h3:8001") == [*LIMITS, ("grpc.lb_policy_name", "round_robin")]
    assert channel_args("ipv4:127.0.0.1:8001,127.0.0.2:8001") == [*LIMITS, ("grpc.lb_policy_name", "round_robin")]


class Connection:
    """Stands in for tritonclient.grpc.InferenceServerClient: answers a cancel with the state
    `answers[url]`, or with an error when that is an InferenceServerException."""

    def __init__(self, made: list, answers: dict, url: str, channel_args: list):
        self.url, self.channel_args, self.answers, self.closed, self.streams = url, channel_args, answers, False, 0
        made.append(self)

    def start_stream(self, callback):
        self.callback, self.streams = callback, self.streams + 1

    def async_stream_infer(self, model, inputs, outputs, request_id, parameters, enable_empty_final_response):
        assert model == protocol.CANCEL_MODEL
        answer = self.answers[self.url]
        if isinstance(answer, InferenceServerException):
            self.callback(None, answer)
            return
        info = np.array([json.dumps({"kind": "cancel", "state": answer}).encode()], dtype=object)
        final = SimpleNamespace(parameters={"triton_final_response": SimpleNamespace(bool_param=True)})
        self.callback(SimpleNamespace(as_numpy=lambda name: info, get_response=lambda: final), None)

    def stop_stream(self, cancel_requests):
        pass

    def close(self):
        self.closed = True


def fake_servers(monkeypatch, answers: dict) -> list:
    made = []
    monkeypatch.setattr(
        api.grpcclient, "InferenceServerClient", lambda url, channel_args: Connection(made, answers, url, channel_args)
    )
    return made


GONE = InferenceServerException("failed to connect to all addresses; last error: connection refused")


@pytest.mark.parametrize(
    ("first", "second", "answer"),
    [
        ("unknown", "cancelled", "cancelled"),
        ("finished", "unknown", "finished"),
        ("unknown", "unknown", "unknown"),
        (GONE, "cancelled", "cancelled"),
        (GONE, "finished", "finished"),
    ],
)
def test_a_cancel_goes_to_every_server(monkeypatch, first, second, answer):
    made = fake_servers(monkeypatch, {"127.0.0.1:8001": first, "127.0.0.2:8001": second})
    assert H3Client("ipv4:127.0.0.1:8001,127.0.0.2:8001").cancel("r") == answer
    assert [connection.url for connection in made] == ["127.0.0.1:8001", "127.0.0.2:8001"]
    assert all(connection.channel_args == LIMITS for connection in made)  # one server each


def test_a_cancel_that_may_have_missed_the_holder_raises(monkeypatch):
    fake_servers(monkeypatch, {"127.0.0.1:8001": GONE, "127.0.0.2:8001": "unknown"})
    with pytest.raises(H3Error) as raised:
        H3Client("ipv4:127.0.0.1:8001,127.0.0.2:8001").cancel("r")
    assert (raised.value.code, raised.value.message) == (
        "UNAVAILABLE",
        "failed to connect to all addresses; last error: connection refused",
    )


def test_channels_are_kept_for_the_next_call_then_renewed(monkeypatch):
    made = fake_servers(monkeypatch, {"127.0.0.1:8001": "unknown"})
    client = H3Client("127.0.0.1:8001")
    for _ in range(3):
        client.cancel("r")
    assert [(connection.streams, connection.closed) for connection in made] == [(3, False)]
    monkeypatch.setattr(api, "CHANNEL_MAX_AGE_S", 0.0)  # every kept channel is too old now
    client.cancel("r")
    assert [(connection.streams, connection.closed) for connection in made] == [(3, True), (1, False)]
    client.close()
    assert made[1].closed


def test_a_channel_whose_call_failed_is_closed(monkeypatch):
    made = fake_servers(monkeypatch, {"127.0.0.1:8001": GONE})
    client = H3Client("127.0.0.1:8001")
    for _ in range(2):
        with pytest.raises(H3Error):
            client.cancel("r")
    assert [(connection.streams, connection.closed) for connection in made] == [(1, True), (1, True)]


# -- two real servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_servers(server, tmp_path_factory):
    """The session's server (127.0.0.1) and a second one on 127.0.0.2 at the same gRPC port,
    serving the same repository: one ipv4: target names both."""
    http_port, metrics_port = pick_free_ports(2, "127.0.0.2")
    second = TritonServer(
        server.model_repository,
        host="127.0.0.2",
        grpc_port=server.grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        log_file=tmp_path_factory.mktemp("second") / "server.log",
    )
    with second:
        yield server, second


def holders(servers, request_id: str, outcome: str) -> list[int]:
    """The indices of the servers whose log has `request ID <outcome>`. A model's end line reaches
    the server log through the python backend's log channel, which may lag the response the
    client already has: the logs are read until some server has the line, for a minute at most."""
    found = []
    for _ in range(1200):
        found = [k for k, srv in enumerate(servers) if f"request {request_id} {outcome}" in srv.log_text()]
        if found:
            break
        time.sleep(0.05)
    return found


def test_each_request_goes_to_the_next_server(two_servers):
    port = two_servers[0].grpc_port
    client = H3Client(f"ipv4:127.0.0.1:{port},127.0.0.2:{port}", idle_timeout_s=120)
    client.generate("warm-up", num_inference_steps=1, return_mp4=False)  # both connections ready after it
    for k in range(4):
        client.generate("spread", num_inference_steps=1, request_id=f"spread-{k}", return_mp4=False)
    placed = [holders(two_servers, f"spread-{k}", "completed") for k in range(4)]
    assert placed in ([[0], [1], [0], [1]], [[1], [0], [1], [0]])
    client.close()


def test_a_cancel_by_id_reaches_the_server_holding_the_request(two_servers):
    port = two_servers[0].grpc_port
    client, outcome, started = (
        H3Client(f"ipv4:127.0.0.1:{port},127.0.0.2:{port}", idle_timeout_s=120),
        {},
        threading.Event(),
    )
    thread = generate_in_thread(
        client,
        outcome,
        "long",
        prompt="long",
        num_inference_steps=400,
        request_id="held-1",
        progress_every=1,
        return_mp4=False,
        on_progress=lambda step, total, position: started.set(),
    )
    assert started.wait(60)
    assert client.cancel("held-1") == "cancelled"
    thread.join(60)
    assert outcome["long"].code == "CANCELLED"
    assert outcome["long"].message.startswith("request held-1 cancelled by request at step ")
    (holder,) = holders(two_servers, "held-1", "ended CANCELLED")
    # asked one by one: the holder finished it, the other never saw it (and remembers the id)
    answers = [H3Client(srv.grpc_url).cancel("held-1") for srv in two_servers]
    assert answers[holder] == "finished" and answers[1 - holder] == "unknown"
