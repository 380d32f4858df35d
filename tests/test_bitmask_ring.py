"""The step bitmask's host buffers (grammarserve/engine/bitmask_ring.py), without CUDA: the
rotation and the reuse rule are checked with a stand-in device ("meta": a copy that is not
CPU) and stand-in events; on CPU the one buffer is the bitmask itself."""

from __future__ import annotations

import pytest
import torch

from grammarserve.engine.bitmask_ring import BitmaskRing

ROWS, WIDTH = 5, 3


def _allocate() -> torch.Tensor:
    return torch.full((ROWS, WIDTH), -1, dtype=torch.int32)


class FakeEvent:
    """Records calls; ``done`` says whether the copy before it has run (``lag``: a recorded
    copy stays in flight until waited on)."""

    def __init__(self, lag: bool = False) -> None:
        self.records = 0
        self.syncs = 0
        self.done = True
        self.lag = lag

    def record(self) -> None:
        self.records += 1
        self.done = not self.lag

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.syncs += 1
        self.done = True


class Events:
    """A ``new_event`` factory that keeps what it made."""

    def __init__(self, lag: bool = False) -> None:
        self.made: list[FakeEvent] = []
        self.lag = lag

    def __call__(self) -> FakeEvent:
        self.made.append(FakeEvent(self.lag))
        return self.made[-1]


def test_cpu_has_one_buffer_and_sends_it_without_a_copy() -> None:
    ring = BitmaskRing(_allocate, torch.device("cpu"))
    assert ring.depth == 1 and not ring.pinned
    first = ring.current
    first[0].fill_(7)
    sent = ring.send(2)
    assert sent.data_ptr() == first.data_ptr() and sent.shape == (2, WIDTH)
    assert ring.current is first  # the same object every step (matchers check it once)
    assert ring.stats.sends == 1 and ring.stats.waits == 0


def test_copies_rotate_two_buffers_and_record_an_event_after_each_copy() -> None:
    events = Events()
    ring = BitmaskRing(_allocate, torch.device("meta"), pin=False, new_event=events)
    assert ring.depth == 2
    a = ring.current
    out = ring.send(3)
    assert out.device.type == "meta" and out.shape == (3, WIDTH)
    b = ring.current
    assert b is not a  # step N+1 fills another buffer than the one step N's copy reads
    ring.send(1)
    assert ring.current is a  # and back
    assert [e.records for e in events.made] == [1, 1]
    assert ring.stats.waits == 0 and all(e.syncs == 0 for e in events.made)
    assert (ring.words == 0xFFFFFFFF).all()  # the uint32 view of the current buffer


def test_a_buffer_whose_copy_is_still_in_flight_is_waited_for_before_reuse() -> None:
    events = Events()
    ring = BitmaskRing(_allocate, torch.device("meta"), pin=False, new_event=events)
    ring.send(1)  # buffer 0's copy
    ring.send(1)  # buffer 1's; buffer 0 current again, its copy done: no wait
    assert ring.stats.waits == 0
    events.made[1].done = False  # buffer 1's copy has not run yet
    ring.send(1)  # buffer 0 sent; buffer 1 becomes current: must wait
    assert ring.stats.waits == 1 and events.made[1].syncs == 1
    ring.send(1)
    assert ring.stats.waits == 1 and len(events.made) == 2  # events are reused


def test_one_buffer_with_copies_waits_for_its_own_copy() -> None:
    events = Events(lag=True)  # every copy still in flight when the buffer is reused
    ring = BitmaskRing(_allocate, torch.device("meta"), pin=False, depth=1, new_event=events)
    made = ring.current
    ring.send(1)
    ring.send(1)
    assert ring.current is made and ring.stats.waits == 2 and events.made[0].syncs == 2


def test_the_scratch_row_is_never_sent_and_depth_is_checked() -> None:
    ring = BitmaskRing(_allocate, torch.device("cpu"))
    with pytest.raises(ValueError, match="scratch"):
        ring.send(ROWS)
    with pytest.raises(ValueError, match="scratch"):
        ring.send(0)
    with pytest.raises(ValueError, match="depth"):
        BitmaskRing(_allocate, torch.device("cpu"), depth=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned memory)")
def test_cuda_buffers_are_pinned_and_sends_match_the_host() -> None:
    ring = BitmaskRing(_allocate, torch.device("cuda"))
    assert ring.pinned and ring.current.is_pinned() and ring.depth == 2
    ring.current[1].fill_(5)
    out = ring.send(2)
    torch.cuda.synchronize()
    assert out.device.type == "cuda" and out[1].tolist() == [5] * WIDTH
