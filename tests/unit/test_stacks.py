"""Reading a rank's faulthandler dump: the user's innermost frames, nothing of nbtrain's."""

import os

import nbtrain
from nbtrain.shared.stacks import Frame, describe, user_frames

NBTRAIN = os.path.dirname(nbtrain.__file__)


def frame_texts(dump: list[str]) -> list[str]:
    return describe({0: user_frames(dump)}).removeprefix("rank 0 was in ").split(" <- ")

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
    assert describe({0: [], 1: []}) == ""


def test_describe_names_each_rank():
    text = describe({1: [Frame("a.py", 3, "f")], 0: [Frame("b.py", 9, "g"), Frame("c.py", 1, "h")]})
    assert text.splitlines() == [
        "rank 0 was in b.py:9 in g <- c.py:1 in h",
        "rank 1 was in a.py:3 in f",
    ]


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

    assert describe({1: user_frames(dump)}, place) == (
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
    assert describe({0: user_frames(dump)}) == (
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
