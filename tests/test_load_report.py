"""h3_core.load_report: the encoder refuses when every DiT instance is full."""
import pytest

from h3_core.load_report import DitLoad, refusal, write_load
from h3_core.scheduler import Job, Overloaded, Scheduler
from h3_core.simulate import SimState


def test_refused_only_when_every_instance_is_full(tmp_path):
    assert refusal(tmp_path) is None  # nothing reported yet
    write_load(tmp_path, "h3_dit_0_0", DitLoad(held=5, max_num_seqs=4, max_waiting=1))
    assert refusal(tmp_path) == "the DiT holds 5 requests, its capacity max_num_seqs + max_waiting = 4 + 1; retry later"
    write_load(tmp_path, "h3_dit_1_0", DitLoad(held=4, max_num_seqs=4, max_waiting=1))
    assert refusal(tmp_path) is None
    write_load(tmp_path, "h3_dit_1_0", DitLoad(held=6, max_num_seqs=4, max_waiting=2))
    assert refusal(tmp_path) == "the DiT holds 5 requests, its capacity max_num_seqs + max_waiting = 4 + 1; retry later"
    (tmp_path / "dit-h3_dit_1_0.json").write_text("{")
    assert refusal(tmp_path) is None  # unreadable: the DiT decides


def test_the_scheduler_refuses_with_the_same_words():
    scheduler = Scheduler(max_num_seqs=1, max_batch_rows=100, max_waiting=0)
    scheduler.add(Job(key=1, request_id="a", states=[SimState(10, 3)]))
    with pytest.raises(Overloaded) as error:
        scheduler.add(Job(key=2, request_id="b", states=[SimState(10, 3)]))
    assert str(error.value) == DitLoad(1, 1, 0).message()
