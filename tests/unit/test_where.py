"""Hang detection's clock: a human at a rank's pdb prompt is not a hang."""

from nbtrain.kernel.group.supervisor import Supervisor
from nbtrain.kernel.run.where import HangWatch


def _nothing(event):
    pass


def test_idle_time_leaves_out_the_time_spent_at_a_pdb_prompt():
    supervisor = Supervisor([], _nothing, failed=lambda: False, grace=1.0)
    supervisor.active_at -= 10.0  # nothing from any rank for 10 s...
    supervisor.prompts.paused_for += 8.0  # ...8 of them with a human at the pdb prompt
    assert 1.9 < supervisor.idle_for() < 3.0


def test_hang_detection_fires_once_and_not_when_off():
    watch = HangWatch(5.0)
    assert not watch.due(4.9)
    assert watch.due(5.0)
    assert not watch.due(60.0)  # said once per run
    assert not HangWatch(None).due(1e9)
