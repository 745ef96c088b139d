"""A collective made by some XLA ordinals only fails fast and says why, as on CPU/gloo
(collectives.py), instead of waiting inside XLA forever (on XLA:CPU, until XLA aborts the whole
host process after ~20 s with "Expected 4 threads to join the rendezvous").

4 XLA:CPU ordinals with the workaround of support.py (ENV, patched sync) for the collectives
that do complete.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import support

from nbtrain import WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(120)

ORDINALS = 4
XLA_ABORTS_AFTER = 20  # seconds: torch_xla's own rendezvous gives up (and kills the process)


@pytest.fixture
def workaround(monkeypatch):
    for name, value in support.ENV.items():
        monkeypatch.setenv(name, value)


def save_on_main_only(directory: str) -> None:
    from nbtrain import Accelerator

    support.install()
    accelerator = Accelerator()
    if accelerator.is_main_process:
        accelerator.save_state(directory)  # the Accelerate deadlock of acc #1171
    accelerator.wait_for_everyone()


def barrier_on_main_only() -> None:
    from nbtrain import Accelerator

    support.install()
    accelerator = Accelerator()
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()  # the others have returned: nobody will join


def barrier_while_peers_are_busy() -> None:
    from nbtrain import Accelerator
    from nbtrain.handlers import InitProcessGroupKwargs  # Accelerate's handler, same fields

    support.install()
    limit = InitProcessGroupKwargs(timeout=timedelta(seconds=3))
    accelerator = Accelerator(kwargs_handlers=[limit])
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
    else:
        time.sleep(60)  # alive, and never making the call


def test_ordinals_in_different_collectives_fail_together(workaround, tmp_path):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(
            save_on_main_only, (str(tmp_path / "ckpt"),), num_processes=ORDINALS, progress="off"
        )
    text = str(info.value)
    assert "Ranks made different collective calls" in text
    assert "save_state()" in text and "wait_for_everyone()" in text


def test_an_ordinal_left_alone_in_a_collective_fails_fast(workaround):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(barrier_on_main_only, num_processes=ORDINALS, progress="off")
    assert info.value.rank == 0
    assert type(info.value.original).__name__ == "PeerLostError"
    assert "wait_for_everyone() on rank 0" in str(info.value)
    assert "lost its peers" in str(info.value)
    assert time.monotonic() - started < XLA_ABORTS_AFTER


def test_a_collective_on_xla_times_out(workaround):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(barrier_while_peers_are_busy, num_processes=ORDINALS, progress="off")
    assert info.value.rank == 0
    assert type(info.value.original).__name__ == "CollectiveTimeoutError"
    assert "gave up after waiting" in str(info.value)
    assert time.monotonic() - started < XLA_ABORTS_AFTER
