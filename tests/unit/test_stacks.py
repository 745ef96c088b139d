"""Reading a rank's faulthandler dump: the user's innermost frames, nothing of nbtrain's."""

from nbtrain.shared.stacks import describe, user_frames

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
    assert user_frames(DUMP) == [
        "torch/distributed/distributed_c10d.py:5356 in barrier",
        "/tmp/ipykernel_1/123.py:7 in train",
    ]


def test_no_user_frames_when_the_rank_was_outside_the_function():
    after_return = [line for line in DUMP if "barrier" not in line and "123.py" not in line]
    assert user_frames(after_return) == []
    assert user_frames([]) == []
    assert describe({0: [], 1: []}) == ""


def test_describe_names_each_rank():
    text = describe({1: ["a.py:3 in f"], 0: ["b.py:9 in g", "c.py:1 in h"]})
    assert text.splitlines() == [
        "rank 0 was in b.py:9 in g <- c.py:1 in h",
        "rank 1 was in a.py:3 in f",
    ]


def test_deep_stacks_keep_the_innermost_frames_and_the_users_function():
    deep = [
        "Current thread 0x00007f0000000002 (most recent call first):",
        *[f'  File "/lib/site-packages/torch/m.py", line {n} in f{n}' for n in range(10)],
        '  File "/tmp/ipykernel_1/9.py", line 3 in train',
        '  File "/v/site-packages/nbtrain/rank/worker.py", line 83 in call_and_report',
    ]
    frames = user_frames(deep)
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
    frames = user_frames(dump)
    assert frames[-1] == "/work/hang.py:6 in <module>"
    assert frames[-2] == "..."
    assert not any("runpy" in frame or "script.py" in frame for frame in frames)
