"""Reading a rank's faulthandler dump: the user's innermost frames, nothing of nbtrain's."""

import os

import nbtrain
from nbtrain.shared.stacks import (
    Frame,
    RankStack,
    describe,
    is_dump_line,
    rank_stack,
    user_frames,
    waited_for,
)

NBTRAIN = os.path.dirname(nbtrain.__file__)


def frame_texts(dump: list[str]) -> list[str]:
    picture = {0: RankStack(tuple(user_frames(dump)))}
    return describe(picture).removeprefix("rank 0 was in ").split(" <- ")

DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 973 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier
  File "/tmp/ipykernel_1/123.py", line 7 in train
  File "/v/site-packages/nbtrain/rank/worker.py", line 83 in call_and_report
  File "/v/site-packages/nbtrain/rank/worker.py", line 198 in rank_main
""".splitlines()


def test_frames_of_the_thread_running_the_function_innermost_first():
    assert frame_texts(DUMP) == [
        "torch/distributed/distributed_c10d.py:5356 in barrier",
        "/tmp/ipykernel_1/123.py:7 in train",
    ]


def test_no_user_frames_when_the_rank_was_outside_the_function():
    after_return = [line for line in DUMP if "barrier" not in line and "123.py" not in line]
    assert user_frames(after_return) == []
    assert user_frames([]) == []
    assert describe({0: RankStack(), 1: RankStack()}) == ""


def test_describe_names_each_rank():
    text = describe({
        1: RankStack((Frame("a.py", 3, "f"),)),
        0: RankStack((Frame("b.py", 9, "g"), Frame("c.py", 1, "h"))),
    })
    assert text.splitlines() == [
        "rank 0 was in b.py:9 in g <- c.py:1 in h",
        "rank 1 was in a.py:3 in f",
    ]


def test_the_collective_a_rank_is_in_comes_from_its_frames():
    assert rank_stack(DUMP).collective == "barrier"
    wrapped = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 9 in all_gather',
        '  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper',
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3 in _helper',
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 5 in '
        "all_gather_object",
        '  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper',
        '  File "/tmp/ipykernel_1/123.py", line 7 in train',
        '  File "/v/site-packages/nbtrain/rank/worker.py", line 83 in call_and_report',
    ]
    assert rank_stack(wrapped).collective == "all_gather_object"  # what the user called
    not_in_one = [line for line in DUMP if "distributed_c10d" not in line]
    assert rank_stack(not_in_one).collective is None


REDUCE = Frame("torch/distributed/distributed_c10d.py", 1, "all_reduce")


def test_the_picture_names_the_rank_the_others_wait_for():
    picture = {
        0: RankStack((REDUCE, Frame("c.py", 4, "f")),
                     "all_reduce"),
        1: RankStack((Frame("time.py", 1, "sleep"), Frame("c.py", 2, "f"))),
        2: RankStack((REDUCE, Frame("c.py", 4, "f")),
                     "all_reduce"),
        3: RankStack(note="exited"),
    }
    assert waited_for(picture) is not None and waited_for(picture)[0] == [1, 3]
    text = describe(picture, live=True)
    assert "rank 1 is in time.py:1 in sleep <- c.py:2 in f" in text
    assert "rank 3: exited" in text
    assert text.splitlines()[-1] == (
        "ranks 0, 2 wait in all_reduce; ranks 1, 3 have not entered it: the others wait for "
        "ranks 1, 3."
    )
    assert "rank 3" not in describe(picture).splitlines()[2]  # stopped ranks: frames only


def test_a_mismatched_collective_is_said():
    at = (Frame("x", 1, "f"),)
    picture = {0: RankStack(at, "all_reduce"), 1: RankStack(at, "barrier"),
               2: RankStack(at, "all_reduce")}
    assert waited_for(picture) == ([1], "ranks 0, 2 wait in all_reduce; rank 1 has not entered "
                                   "it (rank 1 is in barrier instead: a mismatched collective?): "
                                   "the others wait for rank 1.")
    assert waited_for({0: RankStack(at), 1: RankStack(at)}) is None


def test_dump_lines_are_told_from_the_ranks_own_stderr():
    assert all(is_dump_line(line) for line in DUMP)
    assert not is_dump_line("loss 0.3")
    assert not is_dump_line('  File "a.py", line 3, in f')  # a traceback's frame, not a dump's


def test_a_rank_waiting_in_nbtrain_names_the_call_not_nbtrains_internals():
    dump = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        '  File "/v/lib/python3.12/site-packages/torch/distributed/c10d.py", line 9 in barrier',
        f'  File "{NBTRAIN}/accelerator/backends.py", line 88 in wait',
        f'  File "{NBTRAIN}/accelerator/collectives.py", line 143 in _wait',
        f'  File "{NBTRAIN}/accelerator/front_processes.py", line 80 in wait_for_everyone',
        '  File "/tmp/ipykernel_1/5.py", line 5 in train',
        '  File "/tmp/ipykernel_1/6.py", line 2 in main',
        f'  File "{NBTRAIN}/rank/worker.py", line 83 in call_and_report',
    ]
    cells = {"/tmp/ipykernel_1/5.py": "Cell In[5]", "/tmp/ipykernel_1/6.py": "Cell In[6]"}

    def place(file: str, line: int) -> str:
        return f"{cells[file]}, line {line}"

    assert describe({1: rank_stack(dump)}, place) == (
        "rank 1 was waiting in wait_for_everyone(), called from Cell In[5], line 5 in train "
        "<- Cell In[6], line 2 in main"
    )


def test_the_users_code_that_nbtrain_called_back_is_kept():
    # A dataset's __getitem__ stuck under nbtrain's loader: the user's frame is the innermost.
    dump = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        '  File "/work/data.py", line 12 in __getitem__',
        '  File "/v/lib/python3.12/site-packages/torch/utils/data/fetch.py", line 5 in fetch',
        f'  File "{NBTRAIN}/accelerator/loaders.py", line 40 in __iter__',
        '  File "/work/train.py", line 7 in train',
        f'  File "{NBTRAIN}/rank/worker.py", line 83 in call_and_report',
    ]
    assert describe({0: rank_stack(dump)}) == (
        "rank 0 was in /work/data.py:12 in __getitem__ <- __iter__() <- /work/train.py:7 in train"
    )


def test_deep_stacks_keep_the_innermost_frames_and_the_users_function():
    deep = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        *[f'  File "/lib/site-packages/torch/m.py", line {n} in f{n}' for n in range(10)],
        '  File "/tmp/ipykernel_1/9.py", line 3 in train',
        '  File "/v/site-packages/nbtrain/rank/worker.py", line 83 in call_and_report',
    ]
    frames = frame_texts(deep)
    assert frames[:4] == [f"torch/m.py:{n} in f{n}" for n in range(4)]
    assert frames[4:] == ["...", "/tmp/ipykernel_1/9.py:3 in train"]


def test_a_script_run_by_nbtrain_launch_ends_at_the_scripts_own_frame():
    # Eight frames deep, so the middle is elided: the outermost kept is the script's line, not
    # nbtrain launch's way into it (cli.run_script, runpy).
    inner = [f'  File "/work/lib.py", line {n} in helper{n}' for n in range(6)]
    dump = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        *inner,
        '  File "/work/hang.py", line 6 in <module>',
        '  File "<frozen runpy>", line 88 in _run_code',
        '  File "<frozen runpy>", line 291 in run_path',
        '  File "/v/site-packages/nbtrain/rank/script.py", line 14 in run_script',
        '  File "/v/site-packages/nbtrain/rank/worker.py", line 83 in call_and_report',
    ]
    frames = frame_texts(dump)
    assert frames[-1] == "/work/hang.py:6 in <module>"
    assert frames[-2] == "..."
    assert not any("runpy" in frame or "script.py" in frame for frame in frames)


def accelerator_dump(call: str, inner: list[str]) -> list[str]:
    """A rank waiting in the Accelerator's ``call``: the transport polls an async all_gather,
    so no torch collective is on the stack (``inner``: what runs below the handshake)."""
    return [
        "Current thread 0x00007f0000000002 (most recent call first):",
        *inner,
        f'  File "{NBTRAIN}/accelerator/comm/backends.py", line 61 in wait',
        f'  File "{NBTRAIN}/accelerator/comm/collectives.py", line 150 in _wait',
        f'  File "{NBTRAIN}/accelerator/comm/collectives.py", line 89 in handshake',
        f'  File "{NBTRAIN}/accelerator/comm/collectives.py", line 181 in barrier',
        f'  File "{NBTRAIN}/accelerator/front/processes.py", line 77 in {call}',
        '  File "/tmp/ipykernel_1/5.py", line 7 in train',
        f'  File "{NBTRAIN}/rank/worker.py", line 83 in call_and_report',
    ]


def test_the_accelerators_own_collectives_are_recognised():
    polling = accelerator_dump("wait_for_everyone", [])
    assert rank_stack(polling).collective == "wait_for_everyone"
    # Past the handshake, inside torch's all_gather: still the call the user made.
    c10d = '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 9 in all_gather'
    assert rank_stack(accelerator_dump("gather_for_metrics", [c10d])).collective == (
        "gather_for_metrics"
    )
    late = [line for line in DUMP if "distributed_c10d" not in line]
    picture = {0: rank_stack(polling), 1: rank_stack(late)}
    assert waited_for(picture) == ([1], "rank 0 waits in wait_for_everyone; rank 1 has not "
                                   "entered it: the others wait for rank 1.")


def test_ranks_at_the_same_place_share_a_line():
    reduce_at = RankStack((REDUCE, Frame("c.py", 4, "f")), "all_reduce")
    picture = {rank: reduce_at for rank in range(63)}
    picture[63] = RankStack((Frame("c.py", 12, "f"),))
    picture[64] = RankStack(note="exited")
    picture[65] = reduce_at
    assert describe(picture, live=True).splitlines() == [
        "ranks 0-62, 65 are in torch/distributed/distributed_c10d.py:1 in all_reduce <- c.py:4 "
        "in f",
        "rank 63 is in c.py:12 in f",
        "rank 64: exited",
        "ranks 0-62, 65 wait in all_reduce; ranks 63, 64 have not entered it: the others wait "
        "for ranks 63, 64.",
    ]
    # two or three ranks keep a line each
    assert describe({0: reduce_at, 1: reduce_at}).splitlines()[:2] == [
        "rank 0 was in torch/distributed/distributed_c10d.py:1 in all_reduce <- c.py:4 in f",
        "rank 1 was in torch/distributed/distributed_c10d.py:1 in all_reduce <- c.py:4 in f",
    ]
