"""A collective made by some XLA ordinals only fails fast and says why, as on CPU/gloo
(collectives.py), instead of waiting inside XLA forever (on XLA:CPU, until XLA aborts the whole
host process after ~20 s with "Expected 4 threads to join the rendezvous").

4 XLA:CPU ordinals with the workaround of support.py (ENV, patched sync) for the collectives
that do complete.
"""

from __future__ import annotations

import contextlib
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
    from nbtrain.accelerator.front.handlers import (
        InitProcessGroupKwargs,  # Accelerate's handler, same fields
    )

    support.install()
    limit = InitProcessGroupKwargs(timeout=timedelta(seconds=3))
    accelerator = Accelerator(kwargs_handlers=[limit])
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
    else:
        time.sleep(60)  # alive, and never making the call


def leave_right_after_a_barrier(slow: float) -> str:
    """Every ordinal meets in a barrier; the others then end at once, while ordinal 0's helper
    thread is still finishing its side of the gather (its syncs made slow, as on a loaded
    host)."""
    import threading

    from nbtrain import Accelerator
    from nbtrain.accelerator.devices import xla_collectives as xla_accel

    support.install()
    accelerator = Accelerator()
    if accelerator.process_index == 0:
        real = xla_accel.sync

        def slow_sync() -> None:
            real()
            if threading.current_thread().name == "nbtrain-xla-gather-0":
                time.sleep(slow)

        xla_accel.sync = slow_sync  # the gather's syncs, around the meeting point
    accelerator.wait_for_everyone()
    return "done"


def catch_the_lost_collective(then: str) -> str:
    import torch

    from nbtrain import Accelerator

    support.install()
    accelerator = Accelerator()
    if accelerator.is_main_process:
        # The others have returned: nobody joins. The error is caught (as `except Exception`
        # would), and the all-gather stays pending inside XLA.
        with contextlib.suppress(Exception):
            accelerator.wait_for_everyone()
        if then == "reduce":
            try:
                accelerator.reduce(torch.ones(1, device=accelerator.device))
            except Exception:
                return "caught twice"
    return "went on"


def test_peers_that_complete_a_collective_and_end_are_not_lost(workaround):
    # Longer than the fixed 2 s nbtrain once granted a slow gather after a peer had ended.
    results = notebook_launcher(
        leave_right_after_a_barrier,
        (4.0,),
        num_processes=ORDINALS,
        progress="off",
        return_all=True,
    )
    assert results == ["done"] * ORDINALS


@pytest.mark.parametrize(
    ("then", "says"), [("return", "returned"), ("reduce", "went on to more XLA work")]
)
def test_an_ordinal_that_catches_a_lost_collective_still_fails(workaround, then, says):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(
            catch_the_lost_collective, (then,), num_processes=ORDINALS, progress="off"
        )
    assert info.value.rank == 0
    # Not an Exception, so the second except clause could not swallow it either.
    assert type(info.value.original).__name__ == "XlaCollectiveAbandoned"
    assert not isinstance(info.value.original, Exception)
    assert f"ordinal 0 {says} after giving up on a collective" in str(info.value)


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
