"""Post-mortem of a failed rank in a real Jupyter kernel: %ranks_debug after a failed warm cell,
notebook_launcher(..., debug=True); the (Pdb) prompt answered as a frontend answers it."""

from __future__ import annotations

import time

import pytest
from kernelutil import running_kernel
from test_debugger_kernel import SETUP, assert_users_frames_only, converse  # prompt helpers

pytestmark = pytest.mark.timeout(300)

FAILING_CELL = """%%ranks
import os
rank = int(os.environ["RANK"])
def share(total, parts):
    each = total / parts
    return each
value = share(10, rank)
"""

FAILING_LAUNCH = """
def train():
    dist.init_process_group("gloo")
    lr = 0.25 * (dist.get_rank() + 1)
    if dist.get_rank() == 1:
        raise RuntimeError("diverged")
    dist.barrier()  # rank 0 waits for rank 1 here: it is stopped

notebook_launcher(train, num_processes=NUM, progress="text", debug=True)
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def test_post_mortem_of_a_failed_warm_cell(kernel):
    out = kernel.run("ranks = nbtrain.start_ranks(2, progress='text')")
    assert out.error is None, out.traceback_text
    try:
        out = kernel.run("%ranks_debug")
        assert out.error["ename"] == "SessionError" and "no failure to debug" in out.error[
            "evalue"], out.error
        failed = converse(kernel, FAILING_CELL, [])
        assert failed.error["ename"] == "WorkerError", failed
        assert failed.prompts == []  # no prompt unless asked for

        talk = converse(kernel, "%ranks_debug", ["p total, parts", "up", "p rank", "w", "up",
                                                 "c"])
        assert talk.error is None, talk
        assert talk.prompts == ["(Pdb) rank 0> "] * 6
        assert "post-mortem of rank 0: ZeroDivisionError" in talk.seen[0]
        assert "each = total / parts" in talk.seen[0]  # the failing frame first
        assert "(10, 0)" in talk.seen[1]  # its locals
        assert "value = share(10, rank)" in talk.seen[2]  # up: the cell's own frame
        assert talk.seen[3].rstrip().endswith("0")
        assert_users_frames_only(talk.seen[4][len(talk.seen[3]):], "<module>()")  # the cell
        assert "Oldest frame" in talk.seen[5][len(talk.seen[4]):]
        # The rank stayed warm: its names are there, and it runs the next cell.
        assert kernel.value("ranks.pull('rank')") == [0, 1]

        # Bad input: each message names the value and the ranks there are to debug.
        which = "With a failure to debug: rank 0 (ZeroDivisionError: division by zero)"
        for line, says in [
            ("%ranks_debug 1", f"rank 1 has no failure to debug (its commands succeeded "
                               f"since the ranks started). {which}"),
            ("%ranks_debug 5", f"there is no rank 5; the 2 warm ranks are 0-1. {which}"),
            ("%ranks_debug x", "give one rank number, e.g. %ranks_debug 1"),
        ]:
            out = kernel.run(line)
            assert out.error and out.error["ename"] == "SessionError", (line, out)
            assert says in out.error["evalue"], out.error["evalue"]
        out = kernel.collect(kernel.client.execute("%ranks_debug", allow_stdin=False))
        assert out.error and "no input to type pdb commands in" in out.error["evalue"], out
        # ... where commands given in advance still run (as a notebook run by nbclient can)
        code = "ranks.debug(commands=['p parts', 'up', 'p rank'])"
        out = kernel.collect(kernel.client.execute(code, allow_stdin=False))
        assert out.error is None, out.traceback_text
        assert "(Pdb) rank 0> p parts\n0\n(Pdb) rank 0> up\n" in out.stdout, out.stdout
        assert "(Pdb) rank 0> p rank\n0\n(Pdb) rank 0> c" in out.stdout, out.stdout
    finally:
        kernel.run("ranks.stop()")


def test_debug_true_opens_the_failing_rank_before_the_error(kernel):
    talk = converse(kernel, FAILING_LAUNCH.replace("NUM", "2"), ["p lr", "w", "up", "c"])
    assert talk.prompts == ["(Pdb) rank 1> "] * 4
    assert "post-mortem of rank 1: RuntimeError: diverged" in talk.seen[0]
    assert 'raise RuntimeError("diverged")' in talk.seen[0]
    assert "0.5" in talk.seen[1]
    assert_users_frames_only(talk.seen[2][len(talk.seen[1]):], "train()")
    assert "Oldest frame" in talk.seen[3][len(talk.seen[2]):]
    # Then the error, as without debug=True; the other rank was stopped, nothing is left.
    assert talk.error["ename"] == "WorkerError" and "rank 1" in talk.error["evalue"], talk
    assert "[rank 0] stopped" in talk.stdout
    assert kernel.live_children() == []


def test_debug_true_in_the_kernels_own_process(kernel):
    # num_processes=1 runs train here: the prompt is the kernel's pdb, on the same frames.
    code = FAILING_LAUNCH.replace("NUM", "1").replace('dist.init_process_group("gloo")', "")
    code = code.replace("dist.get_rank()", "1").replace("dist.barrier()", "pass")
    talk = converse(kernel, code, ["p lr", "c"])
    assert talk.prompts == ["(Pdb) rank 0> "] * 2
    assert "post-mortem of rank 0: RuntimeError: diverged" in talk.seen[0]
    assert "0.5" in talk.seen[1]
    assert talk.error["ename"] == "WorkerError", talk


def test_debug_true_without_an_input_box_fails_before_any_rank_starts(kernel):
    code = FAILING_LAUNCH.replace("NUM", "2")
    out = kernel.collect(kernel.client.execute(code, allow_stdin=False))  # as nbclient runs it
    assert out.error and out.error["ename"] == "ValueError", out
    assert "debug=True: this run has no input to type pdb commands in" in out.error["evalue"]
    assert "[rank" not in out.stdout  # nothing started


def test_debug_true_when_every_rank_fails_opens_one_prompt(kernel):
    code = """
def train():
    import signal
    rank = int(os.environ["RANK"])
    mine = rank + 100
    if rank == 0:  # fails too, after the launcher asked it to stop (it ignores SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(1)
    raise ValueError("the same bug on every rank")

notebook_launcher(train, num_processes=2, progress="text", debug=True)
"""
    talk = converse(kernel, code, ["p mine", "c"])
    # The first rank to fail has the prompt; the later one is told q and exits as usual.
    assert talk.prompts == ["(Pdb) rank 1> "] * 2, talk.prompts
    assert "101" in talk.seen[1]
    assert talk.error["ename"] == "WorkerError" and "rank 1" in talk.error["evalue"], talk
    assert kernel.live_children() == []


def test_post_mortem_after_an_interrupted_warm_cell_opens_in_the_users_frame(kernel):
    # Ctrl-C in a %%ranks cell raises KeyboardInterrupt from the rank's SIGINT handler:
    # %ranks_debug opens at the line it interrupted, not in nbtrain's handler.
    out = kernel.run("ranks = nbtrain.start_ranks(2, progress='text')")
    assert out.error is None, out.traceback_text
    try:
        cell = kernel.start("%%ranks\nimport time\nfor step in range(100000):\n"
                            "    print('looping', flush=True) if step == 0 else None\n"
                            "    time.sleep(0.01)\n")
        kernel.collect(cell, until="looping")
        time.sleep(0.5)
        kernel.manager.interrupt_kernel()
        kernel.collect(cell)
        talk = converse(kernel, "%ranks_debug", ["p step > 0", "c"])
        # Both ranks were interrupted by the same Ctrl-C: the prompt is the one whose
        # KeyboardInterrupt came first (either; the load decides), in the user's frame.
        assert talk.prompts[:1] in (["(Pdb) rank 0> "], ["(Pdb) rank 1> "]), talk
        assert "time.sleep(0.01)" in talk.seen[0], talk.seen[0]
        assert "_on_sigint" not in talk.seen[0] and "session.py" not in talk.seen[0]
        assert "True" in talk.seen[1][len(talk.seen[0]):]
    finally:
        kernel.run("ranks.stop()")
