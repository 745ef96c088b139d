"""How a watch ends (kernel/group/ending.py), as the Supervisor reports it: one value in a fixed
order of reasons, instead of flags read on a live Supervisor. The watches themselves run in
tests/multiprocess (launches) and tests/kernel (warm commands)."""

import time

from nbtrain.kernel.group.cell import CellSupervisor
from nbtrain.kernel.group.ending import How
from nbtrain.kernel.group.supervisor import Supervisor


def _nothing(event):
    pass


def test_the_first_reason_that_applies_is_how_it_ended():
    failed = [False]
    supervisor = Supervisor([], _nothing, failed=lambda: failed[0], grace=1.0)
    assert supervisor.ending().how is How.SUCCEEDED and not supervisor.running
    failed[0] = True
    assert supervisor.ending().how is How.FAILED
    assert supervisor.ask_to_stop() and not supervisor.ask_to_stop()  # asked once
    assert supervisor.ending().how is How.STOPPED  # (a stop's failure is no root cause)
    assert supervisor.interrupt() and not supervisor.interrupt()
    assert supervisor.ending().how is How.INTERRUPTED
    assert not supervisor.ask_to_stop()  # interrupted: nothing left to ask
    ending = supervisor.ending()
    assert not ending.broken and not ending.stuck and dict(ending.stacks) == {}


def test_a_warm_command_that_times_out_is_interrupted_and_ends_as_timed_out():
    supervisor = CellSupervisor([], _nothing, failed=lambda: False, grace=1.0)
    supervisor.begin_cell(set(), _nothing, lambda: False)
    ending = supervisor.turn(time.monotonic() - 1.0, lambda: None)  # the deadline passed
    assert ending is not None and ending.how is How.TIMED_OUT and not ending.broken
    supervisor.begin_cell(set(), _nothing, lambda: False)  # the next command starts afresh
    ending = supervisor.turn(None, lambda: None)
    assert ending is not None and ending.how is How.SUCCEEDED
