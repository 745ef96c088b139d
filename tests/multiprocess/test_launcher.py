"""notebook_launcher with real ranks (gloo on CPU) under every start method."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from procguard import ProcessWatch

from nbtrain import WorkerError, debug_launcher, notebook_launcher
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Event, Status

pytestmark = pytest.mark.timeout(180)

QUIET = {"progress": "off", "output": "none"}


def all_reduce_sum(scale):
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t * scale


def test_results_from_rank_zero_and_from_all(method, monkeypatch):
    phases: list[tuple[int, str]] = []
    apply = RunState.apply

    def recorded(state: RunState, event: Event) -> None:
        if isinstance(event, Status):
            phases.append((event.rank, event.text))
        apply(state, event)

    monkeypatch.setattr(RunState, "apply", recorded)
    assert torch.equal(
        notebook_launcher(all_reduce_sum, (2.0,), num_processes=2, start_method=method, **QUIET),
        torch.tensor([6.0]),
    )
    if method == "spawn":  # the start-up phases a fresh Python goes through, for every rank
        for rank in (0, 1):
            said = [text for r, text in phases if r == rank]
            assert said[:2] == ["starting Python", "importing torch"], phases
    values = notebook_launcher(
        all_reduce_sum, (1.0,), num_processes=3, start_method=method, return_all=True, **QUIET
    )
    assert [v.item() for v in values] == [6.0, 6.0, 6.0]


def test_notebook_style_objects_travel(method):
    """Lambdas, closures and locally defined classes: what a notebook cell defines."""
    offset = 10

    class Box:
        def __init__(self, value):
            self.value = value

    def make(rank_scale):
        return Box(int(os.environ["RANK"]) * rank_scale + offset)

    boxes = notebook_launcher(
        make, (100,), num_processes=2, start_method=method, return_all=True, **QUIET
    )
    assert [b.value for b in boxes] == [10, 110]
    assert type(boxes[0]).__name__ == "Box"
    doubled = notebook_launcher(
        lambda x: x * 2, ("ab",), num_processes=2, start_method=method, **QUIET
    )
    assert doubled == "abab"


def read_env():
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    import multiprocessing

    env = {k: os.environ[k] for k in keys}
    env["threads"] = f"{os.environ.get('OMP_NUM_THREADS')} {torch.get_num_threads()}"
    return env, multiprocessing.current_process().daemon


def test_rank_environment_and_fresh_port_per_launch(method):
    first = notebook_launcher(
        read_env, num_processes=2, start_method=method, return_all=True, **QUIET
    )
    second = notebook_launcher(read_env, num_processes=2, start_method=method, **QUIET)
    envs = [env for env, _ in first]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert envs[0]["MASTER_PORT"] != "29500"
    assert second[0]["MASTER_PORT"] != envs[0]["MASTER_PORT"]
    assert not any(daemon for _, daemon in first), "ranks must not be daemonic"
    # The kernel sets no OMP_NUM_THREADS: each rank gets its share of the cores, in torch and
    # in the variable libraries read (HF Accelerate would otherwise force 1 thread).
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert {e["threads"] for e in envs} == {f"{share} {share}"}


def loader_with_workers():
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(32.0))
    loader = DataLoader(data, batch_size=4, num_workers=2)
    return sum(batch[0].sum().item() for batch in loader)


def test_dataloader_workers_inside_a_rank(method):
    assert notebook_launcher(
        loader_with_workers, num_processes=2, start_method=method, **QUIET
    ) == sum(range(32))


def raise_on_rank_one_while_peer_waits():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0 is already blocked in all_reduce
        raise ValueError("boom on rank 1")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t


def test_root_cause_is_the_rank_that_raised_not_the_waiting_peer(method, capsys):
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        notebook_launcher(
            raise_on_rank_one_while_peer_waits,
            num_processes=2,
            start_method=method,
            progress="text",
        )
    err = info.value
    assert err.rank == 1
    assert isinstance(err.original, ValueError) and str(err.original) == "boom on rank 1"
    assert "rank 1" in str(err) and "ValueError" in str(err) and "boom on rank 1" in str(err)
    assert "raise ValueError" in err.remote_traceback
    # The rank's traceback starts at the user's function: no launcher frame above it.
    first_frame = err.remote_traceback.splitlines()[1]
    assert first_frame.startswith(f'  File "{__file__}"'), err.remote_traceback
    assert "in raise_on_rank_one_while_peer_waits" in first_frame
    assert err.exitcode == 1 and err.signal is None
    assert isinstance(err.__cause__, Exception) and "boom on rank 1" in str(err.__cause__)
    assert time.monotonic() - t0 < 60


class Unreachable(Exception):
    """Its constructor signature breaks unpickling: the kernel cannot rebuild it."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")


def raise_unpicklable():
    raise Unreachable(7, "cannot come back")


def test_exception_that_cannot_be_unpickled_still_reports_text(method):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(raise_unpicklable, num_processes=2, start_method=method, **QUIET)
    err = info.value
    assert err.original is None
    assert err.type_name == "Unreachable"
    assert "code 7: cannot come back" in str(err)
    assert "raise Unreachable" in err.remote_traceback


# A launch that should take a second, given a timeout well inside the test's: should it hang
# (a fork child deadlocked, seen once in CI's whole-suite run and once locally, never alone), it
# fails with where every rank was instead of pytest-timeout's stack of the launcher's own loop.
HANG_DIAGNOSIS = 100


def exit_on_last_rank(how):
    dist.init_process_group("gloo")
    if dist.get_rank() == dist.get_world_size() - 1:
        print("about to exit", flush=False)
        import ctypes

        ctypes.CDLL(None).printf(b"printed by C just before\n")  # never flushed by hand
        if how == "sys.exit":
            sys.exit(3)
        if how == "os._exit":
            sys.stdout.flush()
            os._exit(3)
        if how == "SIGSEGV":
            import ctypes

            ctypes.string_at(0)
        os.kill(os.getpid(), getattr(signal, how))
    t = torch.ones(1)
    dist.all_reduce(t)
    return t


@pytest.mark.parametrize(
    ("how", "exitcode", "signal_name"),
    [
        ("sys.exit", 3, None),
        ("os._exit", 3, None),
        ("SIGSEGV", -11, "SIGSEGV"),
        ("SIGKILL", -9, "SIGKILL"),
    ],
)
def test_hard_exits_and_signals_name_the_right_rank(
    method, how, exitcode, signal_name, capsys, monkeypatch
):
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # spawned ranks: C stdout buffered
    with pytest.raises(WorkerError) as info:
        notebook_launcher(  # (timeout: a hang says where each rank was; CI hung here once)
            exit_on_last_rank, (how,), num_processes=3, start_method=method, progress="off",
            timeout=HANG_DIAGNOSIS,
        )
    err = info.value
    assert err.rank == 2, str(err)
    assert err.exitcode == exitcode
    assert err.signal == signal_name
    if signal_name:
        assert signal_name in str(err)
    if how == "SIGSEGV":
        assert "Segmentation fault" in err.remote_traceback
        assert "exit_on_last_rank" in err.remote_traceback
    out = capsys.readouterr().out
    assert "[rank 2] about to exit" in out, "a line printed just before the crash was lost"
    assert "[rank 2] printed by C just before" in out, "C's stdout lost its last line"


CRASH_AFTER_ANOTHER_HANDLER = """
import ctypes, faulthandler, signal
import torch, torch.distributed as dist
from nbtrain import WorkerError, notebook_launcher

faulthandler.enable()
signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # as Ray's ray.init does: its own crash handler

def crash():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        ctypes.string_at(0)
    dist.all_reduce(torch.ones(1))

try:
    notebook_launcher(crash, num_processes=2, start_method="fork", progress="off")
except WorkerError as err:
    print("segfault stack:", "Segmentation fault" in err.remote_traceback)
"""


def test_a_fork_rank_crash_keeps_its_stack_when_the_kernel_replaced_the_handler():
    # faulthandler enabled in the kernel and then displaced by another library: a forked rank
    # inherits "enabled", so a bare enable() would not reinstall the handler (found with Ray).
    done = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_ANOTHER_HANDLER],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert "segfault stack: True" in done.stdout, done.stdout + done.stderr[-2000:]


def test_rank_zero_failure_is_root_cause_too(method):
    def fail_rank_zero():
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            raise KeyError("rank zero broke")
        dist.barrier()

    with pytest.raises(WorkerError) as info:
        notebook_launcher(fail_rank_zero, num_processes=2, start_method=method, **QUIET)
    assert info.value.rank == 0 and info.value.type_name == "KeyError"


def dies_after_its_peer_complains():
    """Rank 1's death becomes visible only after rank 0's lost-connection error (as when a big
    process is still tearing down while its sockets are already closed)."""
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop request must not be its cause
        dist.barrier()
        time.sleep(0.5)
        os._exit(3)
    dist.barrier()
    raise RuntimeError("Connection reset by peer [127.0.0.1]:4242")


def test_a_rank_that_exits_by_itself_after_a_stop_request_is_still_the_root_cause(method):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(dies_after_its_peer_complains, num_processes=2, start_method=method,
                          **QUIET)
    assert info.value.rank == 1 and info.value.exitcode == 3, str(info.value)
    # Rank 0 only lost its peer: it ended because of rank 1, counted as stopped, its line kept.
    assert 0 in info.value.lost_peer and info.value.stopped == 1, str(info.value)
    assert info.value.other_failures == {}

def read_environment():
    return os.environ.get("NBTRAIN_TEST_SET_LATER"), os.environ.get("NBTRAIN_TEST_UNSET_LATER")


def test_ranks_see_the_environment_of_the_kernel_now_not_at_first_launch(method, monkeypatch):
    """A variable set in a cell after the first launch (forkserver already warm) arrives, and
    one deleted since is gone."""
    monkeypatch.setenv("NBTRAIN_TEST_UNSET_LATER", "stale")
    notebook_launcher(read_environment, num_processes=2, start_method=method, **QUIET)
    monkeypatch.setenv("NBTRAIN_TEST_SET_LATER", "fresh")
    monkeypatch.delenv("NBTRAIN_TEST_UNSET_LATER")
    values = notebook_launcher(
        read_environment, num_processes=2, start_method=method, return_all=True, **QUIET
    )
    assert values == [("fresh", None), ("fresh", None)]

def hang_and_record(directory):
    with open(os.path.join(directory, os.environ["RANK"]), "w") as handle:
        handle.write(f"{os.getpid()} {psutil.Process().create_time()}")
    time.sleep(600)


def test_timeout_stops_every_rank(method, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"timeout={HANG_TIMEOUT[method]:g}\b"):
        notebook_launcher(hang_and_record, (str(tmp_path),), num_processes=2,
                          start_method=method, timeout=HANG_TIMEOUT[method], **QUIET)
    assert time.monotonic() - t0 < HANG_TIMEOUT[method] + 30
    ranks = [path.read_text().split() for path in sorted(tmp_path.iterdir())]
    assert len(ranks) == 2, "a rank never started: the timeout came too early"
    for pid, created in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank = psutil.Process(int(pid))
            assert rank.create_time() != float(created) or rank.status() == psutil.STATUS_ZOMBIE, (
                f"rank pid {pid} still runs after the timeout"
            )


def stuck_in_barrier():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        dist.barrier()  # rank 0 never joins
    time.sleep(600)


def test_timeout_names_the_line_each_rank_was_stuck_on(method, capsys):
    # Hang detection first (hang_after=2: no rank says anything), once, then the timeout: the
    # same picture, naming the rank the other waits for.
    with pytest.raises(TimeoutError) as info:
        notebook_launcher(
            stuck_in_barrier, num_processes=2, start_method=method,
            timeout=max(8.0, HANG_TIMEOUT[method]), progress="off", hang_after=2
        )
    named = "rank 1 waits in barrier; rank 0 has not entered it: the others wait for rank 0."
    hang = capsys.readouterr().err
    if method == "fork":  # (spawned ranks may still import the test module on a busy machine)
        assert hang.count("no rank has made progress for 2s (hang_after=2)") == 1, hang
        assert named in hang and "rank 0 is in " in hang, hang
        assert named in str(info.value)
    lines = str(info.value).splitlines()
    rank0 = next(line for line in lines if line.startswith("rank 0 was in "))
    rank1 = next(line for line in lines if line.startswith("rank 1 was in "))
    here = stuck_in_barrier.__code__
    assert rank0.endswith(f"test_launcher.py:{here.co_firstlineno + 4} in stuck_in_barrier")
    assert "in barrier <- " in rank1
    assert f"test_launcher.py:{here.co_firstlineno + 3} in stuck_in_barrier" in rank1

def chatty(lines):
    import ctypes

    rank = int(os.environ["RANK"])
    for i in range(lines):
        print(f"r{rank}-line{i:04d}-" + "x" * 200)
        if i % 50 == 0:
            sys.stderr.write(f"r{rank}-err{i}\n")
    os.write(1, f"r{rank}-raw-fd-write\n".encode())
    libc = ctypes.CDLL(None)
    # No fflush: the rank ends with os._exit (as multiprocessing does), which flushes no C
    # buffer, so the line arrives only because ranks line-buffer C's stdout.
    libc.printf(f"r{rank}-from-c-printf\n".encode())
    return rank


def test_output_arrives_in_whole_prefixed_lines(method, capsys, monkeypatch):
    # C's stdout on a pipe is fully buffered unless Python runs unbuffered: make the printf
    # check below mean something in spawned ranks even where PYTHONUNBUFFERED is set.
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    notebook_launcher(chatty, (300,), num_processes=2, start_method=method, progress="off")
    captured = capsys.readouterr()
    out_lines = captured.out.splitlines()
    for rank in (0, 1):
        mine = [line for line in out_lines if line.startswith(f"[rank {rank}] r{rank}-line")]
        assert len(mine) == 300
        assert all(line.endswith("x" * 200) for line in mine), "a line was cut or interleaved"
        assert mine == sorted(mine), "lines of one rank arrived out of order"
        assert f"[rank {rank}] r{rank}-raw-fd-write" in out_lines
        assert f"[rank {rank}] r{rank}-from-c-printf" in out_lines
        assert f"[rank {rank}] r{rank}-err0" in captured.err.splitlines()
    stray = [line for line in out_lines if not line.startswith("[rank ")]
    assert stray == []


def test_output_modes(method, capsys):
    notebook_launcher(chatty, (3,), num_processes=2, start_method=method, output="main",
                      progress="off")
    out = capsys.readouterr().out
    assert "[rank 0] r0-line0000" in out and "[rank 1]" not in out
    notebook_launcher(chatty, (3,), num_processes=2, start_method=method, output="none",
                      progress="off")
    assert "r0-line" not in capsys.readouterr().out


def live_ranks(me):
    """Live descendants other than the long-lived forkserver and resource tracker themselves
    (a forkserver launch's ranks count: see tests/procguard.py)."""
    return sorted(ProcessWatch(me.pid).alive())


def _own_state():
    me = psutil.Process()
    return len(live_ranks(me)), me.num_fds(), threading.active_count()


def test_relaunch_after_success_failure_and_timeout_leaks_nothing(method):
    def maybe_fail(kind):
        if kind == "fail" and os.environ["RANK"] == "1":
            raise RuntimeError("planned")
        if kind == "hang":
            time.sleep(600)
        return kind

    run = {"num_processes": 2, "start_method": method, **QUIET}
    notebook_launcher(maybe_fail, ("ok",), **run)  # warm up imports (and the forkserver)
    before = _own_state()
    for _ in range(4 if method == "fork" else 2):  # spawn costs seconds per launch
        assert notebook_launcher(maybe_fail, ("ok",), **run) == "ok"
        with pytest.raises(WorkerError):
            notebook_launcher(maybe_fail, ("fail",), **run)
        with pytest.raises(TimeoutError):
            notebook_launcher(maybe_fail, ("hang",), timeout=HANG_TIMEOUT[method] / 2, **run)
    after = _own_state()
    assert after == before, f"(children, fds, threads) grew from {before} to {after}"


@contextlib.contextmanager
def ctrl_c_once_both_ranks_recorded(directory, met: list | None = None):
    """Ctrl-C (SIGINT to this process) once both ranks of hang_and_record wrote their files;
    ``met``: the SIGINT handler the press met."""

    def press():
        deadline = time.monotonic() + 60
        while len(list(directory.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        if met is not None:
            met.append(signal.getsignal(signal.SIGINT))
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=press)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        thread.join()


def test_keyboard_interrupt_stops_every_rank(method, tmp_path):
    me = psutil.Process()
    with ctrl_c_once_both_ranks_recorded(tmp_path):
        notebook_launcher(hang_and_record, (str(tmp_path),), num_processes=2,
                          start_method=method, **QUIET)
    assert live_ranks(me) == []
    for pid, created in (path.read_text().split() for path in tmp_path.iterdir()):
        with contextlib.suppress(psutil.NoSuchProcess):
            assert psutil.Process(int(pid)).create_time() != float(created), "a rank survived"
    assert notebook_launcher(lambda: "again", num_processes=2, start_method=method,
                             **QUIET) == "again"


def test_ctrl_c_in_an_elastic_launch_meets_the_groups_policy(tmp_path):
    """max_restarts > 0 runs through torch's elastic agent, which owns the loop: the press still
    meets the rank group's one Ctrl-C policy (its handler, which a dropped KeyboardInterrupt
    cannot lose), and every rank stops."""
    met: list = []
    me = psutil.Process()
    with ctrl_c_once_both_ranks_recorded(tmp_path, met):
        notebook_launcher(hang_and_record, (str(tmp_path),), num_processes=2,
                          start_method="fork", max_restarts=1, **QUIET)
    assert met and met[0] is not signal.default_int_handler, met
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert live_ranks(me) == []


def test_rank_killed_by_sigint_is_not_a_success(method):
    """Jupyter may SIGINT the whole process group: an interrupted rank must never look done."""

    def interrupted():
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        return "done"

    with pytest.raises(WorkerError) as info:
        notebook_launcher(interrupted, num_processes=2, start_method=method, **QUIET)
    assert info.value.rank == 1 and info.value.type_name == "KeyboardInterrupt"


def test_single_process_runs_in_this_process_and_restores_env():
    before = dict(os.environ)

    def where():
        return os.getpid(), os.environ["RANK"], os.environ["WORLD_SIZE"]

    assert notebook_launcher(where, num_processes=1, **QUIET) == (os.getpid(), "0", "1")
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == {
        k: v for k, v in before.items() if k != "PYTEST_CURRENT_TEST"
    }


def test_single_process_failure_keeps_the_users_frames():
    def broken():
        raise ZeroDivisionError("in user code")

    with pytest.raises(WorkerError) as info:
        notebook_launcher(broken, num_processes=1, **QUIET)
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames[-1] == "broken", "post-mortem debugging must land in the user's function"
    assert isinstance(info.value.original, ZeroDivisionError)


def test_single_process_group_is_cleaned_for_the_next_launch():
    def init_only():
        dist.init_process_group("gloo")
        return dist.get_world_size()

    assert notebook_launcher(init_only, num_processes=1, **QUIET) == 1
    assert not dist.is_initialized()
    assert notebook_launcher(init_only, num_processes=1, **QUIET) == 1


def test_single_process_timeout():
    expected = (
        r"^notebook_launcher\(timeout=0\.5\) expired while the function ran in this process\. "
        r"Raise timeout= if the run needs longer\.$"
    )
    with pytest.raises(TimeoutError, match=expected):
        notebook_launcher(lambda: time.sleep(30), num_processes=1, timeout=0.5, **QUIET)
    # return_all: a list, as from ranks (the run's one rule)
    assert notebook_launcher(lambda: 7, num_processes=1, return_all=True, **QUIET) == [7]


def test_debug_launcher_runs_cpu_ranks(capsys):
    def who():
        return os.environ["WORLD_SIZE"], os.environ.get("CUDA_VISIBLE_DEVICES")

    assert debug_launcher(who) == ("2", "")


def test_ranks_stop_promptly_even_if_the_kernel_has_a_python_sigterm_handler(monkeypatch):
    """torch elastic (e.g. inside Accelerate's launcher) leaves a Python SIGTERM handler in the
    launching process; forked ranks must not inherit it, or a rank blocked in C++ ignores the
    launcher's SIGTERM until the SIGKILL grace runs out."""

    def fail_while_peer_blocks_in_cpp():
        if os.environ["RANK"] == "1":
            raise ValueError("early")
        dist.init_process_group("gloo")  # blocks in C++ waiting for rank 1, forever

    from nbtrain.kernel.group import rankgroup

    monkeypatch.setattr(rankgroup, "GRACE", 60.0)  # only SIGTERM can end it sooner
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError):
            notebook_launcher(fail_while_peer_blocks_in_cpp, num_processes=2, **QUIET)
        elapsed = time.monotonic() - start
    finally:
        signal.signal(signal.SIGTERM, previous)
    # Not a speed test: with a 60 s SIGKILL grace, finishing well before it proves SIGTERM worked.
    assert elapsed < 30, f"rank 0 ignored SIGTERM and waited for SIGKILL ({elapsed:.2f}s)"


def test_fork_from_a_busy_threaded_parent():
    """Pain point (PL #18130): forking while the parent's OpenMP pool is busy in another thread
    and DataLoader workers are alive must still give healthy ranks."""
    from torch.utils.data import DataLoader, TensorDataset

    matrix = torch.randn(256, 256)
    loader = DataLoader(TensorDataset(torch.randn(32, 3)), batch_size=8, num_workers=2,
                        persistent_workers=True)
    for _ in loader:
        pass
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            matrix @ matrix

    spinner = threading.Thread(target=spin)
    spinner.start()

    def train():
        x = torch.randn(128, 128)
        for _ in range(20):
            x = torch.tanh(x @ x)
        inner = DataLoader(TensorDataset(torch.ones(16, 2)), batch_size=4, num_workers=2)
        return sum(batch[0].shape[0] for batch in inner)

    try:
        results = [notebook_launcher(train, num_processes=2, start_method="fork",
                                     timeout=HANG_DIAGNOSIS, **QUIET) for _ in range(3)]
    finally:
        stop.set()
        spinner.join()
        del loader  # stop the persistent workers before the leak guard looks
    assert results == [16, 16, 16]


def test_autograd_results_come_back_detached_from_the_rank_graph():
    def forward():
        model = torch.nn.Linear(3, 1)
        return model(torch.ones(2, 3)), model.weight

    output, weight = notebook_launcher(forward, num_processes=2, **QUIET)
    assert output.shape == (2, 1) and output.grad_fn is None
    assert weight.requires_grad  # a leaf parameter keeps requires_grad


def test_start_method_missing_on_this_platform_is_refused(monkeypatch):
    """Platform facts are what we fake here (we have only Linux), not the check under test."""
    import nbtrain.kernel.host.environment as environment

    monkeypatch.setattr(environment, "available_start_methods", lambda: ("spawn",))
    with pytest.raises(ValueError, match="not available on this platform"):
        notebook_launcher(lambda: 1, num_processes=2, start_method="fork")
    from nbtrain.kernel.options.config import StartMethod, choose_start_method

    assert choose_start_method("auto", uses_cuda=False).method is StartMethod.SPAWN


def test_launch_where_every_rank_only_lost_a_peer_is_a_failure():
    def lost_peer():
        time.sleep(0.1 * int(os.environ["RANK"]))
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    for _ in range(3):
        with pytest.raises(WorkerError) as info:
            notebook_launcher(lost_peer, num_processes=2, **QUIET)
        assert "Connection closed by peer" in str(info.value)


# --- A rank that returned but cannot exit --------------------------------------------------


def leave_something_running():
    """Rank 0 forgets a non-daemon thread, rank 1 a non-daemon child process: interpreter
    shutdown would wait for them forever."""
    import multiprocessing

    if os.environ["RANK"] == "0":
        threading.Thread(target=time.sleep, args=(600,), name="forgotten-poller").start()
    else:
        multiprocessing.get_context("fork").Process(
            target=time.sleep, args=(600,), name="forgotten-child", daemon=False
        ).start()
    return int(os.environ["RANK"]) * 10


def test_a_rank_that_returned_but_cannot_exit_is_stopped_and_its_result_kept(
    method, monkeypatch, capsys
):
    from nbtrain.kernel.group import rankgroup

    monkeypatch.setattr(rankgroup, "EXIT_WAIT", 1.0)  # the default is a few seconds
    values = notebook_launcher(leave_something_running, num_processes=2, start_method=method,
                               return_all=True, progress="off")
    assert values == [0, 10]
    err = capsys.readouterr().err
    assert (
        "[rank 0] [nbtrain] rank 0 returned, but did not exit within 1s (non-daemon thread "
        "'forgotten-poller' still running); stopped it" in err
    ), err
    assert (
        "[rank 1] [nbtrain] rank 1 returned, but did not exit within 1s (non-daemon child "
        "process 'forgotten-child'" in err
    ), err
    # The autouse guard checks that the forgotten child process went with its rank.


def slow_to_shut_down():
    """Nothing of the function's is left running, but the process takes 2.5 s to exit (a
    busy machine finalizing: here the rank's teardown, made slow, stands for it)."""
    from nbtrain.rank import teardown

    release = teardown.release

    def slow_release(**kwargs):
        time.sleep(2.5)
        release(**kwargs)

    teardown.release = slow_release  # (this rank's copy of the module: it exits after)
    return int(os.environ["RANK"])


def test_a_rank_only_slow_to_shut_down_gets_a_wait_that_follows_the_load(monkeypatch, capsys):
    from nbtrain.kernel.group import lingering, rankgroup

    monkeypatch.setattr(rankgroup, "EXIT_WAIT", 1.0)
    monkeypatch.setattr(lingering, "_load_factor", lambda: 6.0)  # a busy machine: 6 s
    run = dict(num_processes=2, start_method="fork", return_all=True, progress="off")
    assert notebook_launcher(slow_to_shut_down, **run) == [0, 1]
    assert "returned, but" not in capsys.readouterr().err  # it exited by itself in time
    monkeypatch.setattr(lingering, "_load_factor", lambda: 1.0)  # idle: the 1 s holds
    assert notebook_launcher(slow_to_shut_down, **run) == [0, 1]
    err = capsys.readouterr().err
    assert "its process was still shutting down after 1s (nothing of the function's was left " \
        "running; machine load" in err, err
    assert "daemon" not in err, err  # no blame for threads the user did not start


# --- A rank that floods its output ---------------------------------------------------------


def flood(fail_after=None):
    """Rank 0 prints in a tight loop forever; rank 1 fails after ``fail_after`` s (or hangs)."""
    if os.environ["RANK"] == "1":
        time.sleep(fail_after if fail_after is not None else 600)
        raise ValueError("rank 1 failed while rank 0 flooded")
    import fcntl

    with contextlib.suppress(OSError):  # a deep pipe: the kernel never finds it empty
        fcntl.fcntl(1, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    block = b"x\n" * (1 << 16)  # short lines: reading them costs the kernel far more than
    while True:  # writing them costs the rank
        os.write(1, block)


def test_a_flooding_rank_cannot_hold_off_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timeout=2\b"):
        notebook_launcher(flood, num_processes=2, timeout=2, **QUIET)
    # Not a speed test: without a per-pass read budget, the loop never leaves rank 0's pipe.
    assert time.monotonic() - start < 60


def test_a_flooding_rank_cannot_hide_a_peers_failure():
    with pytest.raises(WorkerError) as info:
        notebook_launcher(flood, (1.0,), num_processes=2, **QUIET)
    assert info.value.rank == 1 and "while rank 0 flooded" in str(info.value)


# --- A SIGTERM handler that raises ---------------------------------------------------------


def sigterm_raises(peer_fails):
    """Like a library that turns SIGTERM into an exception (so a job scheduler's stop becomes
    a clean shutdown): the launcher's stop request must not become the root cause."""

    def handler(signum, frame):
        raise RuntimeError("received SIGTERM, shutting down")

    signal.signal(signal.SIGTERM, handler)
    if peer_fails and os.environ["RANK"] == "1":
        time.sleep(0.5)
        raise ValueError("the real failure")
    time.sleep(600)


def test_a_timeout_stays_a_timeout_when_ranks_raise_on_sigterm(method):
    with pytest.raises(TimeoutError, match=r"timeout=") as info:
        notebook_launcher(sigterm_raises, (False,), num_processes=2, start_method=method,
                          timeout=HANG_TIMEOUT[method], **QUIET)
    # (ranks that stood at the same place share one line: "ranks 0, 1 were in ...")
    assert re.search(r"(rank 0 was|ranks 0, 1 were) in ", str(info.value)), info.value


def test_a_rank_raising_on_sigterm_is_stopped_not_a_second_failure():
    with pytest.raises(WorkerError) as info:
        notebook_launcher(sigterm_raises, (True,), num_processes=2, **QUIET)
    assert info.value.rank == 1 and info.value.type_name == "ValueError", str(info.value)
    assert info.value.other_failures == {}, str(info.value)


# Long enough for every rank to start on a loaded 2-core machine (a spawn rank imports torch
# afresh): these timeouts only stop runs that hang by design.
HANG_TIMEOUT = {"fork": 4.0, "forkserver": 6.0, "spawn": 20.0}


# --- num_processes=1 -----------------------------------------------------------------------


def test_single_process_timeout_off_the_main_thread_is_refused_before_anything_runs():
    ran, caught = [], []

    def body():
        try:
            notebook_launcher(lambda: ran.append(1), num_processes=1, timeout=5, **QUIET)
        except ValueError as exc:
            caught.append(str(exc))

    thread = threading.Thread(target=body, name="cell-helper")
    thread.start()
    thread.join()
    assert ran == [], "the function ran although the launch was refused"
    assert len(caught) == 1 and "timeout=5" in caught[0] and "main thread" in caught[0]
    assert "num_processes=2" in caught[0]


class BrokenView:
    """A frontend that fails on close (a closed comm, a dead browser tab)."""

    def draw(self, state, *, now=False):
        pass

    def note(self, text):
        pass

    def close(self, state):
        raise RuntimeError("frontend gone")


def test_single_process_outcomes_survive_a_broken_frontend(monkeypatch):
    import nbtrain.kernel.run.lifecycle

    monkeypatch.setattr(nbtrain.kernel.run.lifecycle, "open_view", lambda config: BrokenView())

    def broken():
        raise ZeroDivisionError("the real error")

    assert notebook_launcher(lambda: 5, num_processes=1, **QUIET) == 5
    with pytest.raises(WorkerError, match="the real error"):
        notebook_launcher(broken, num_processes=1, **QUIET)
    with pytest.raises(TimeoutError):
        notebook_launcher(lambda: time.sleep(30), num_processes=1, timeout=0.5, **QUIET)


# --- Results the kernel cannot load --------------------------------------------------------


def return_an_object_of_a_rank_only_module(directory):
    sys.path.insert(0, directory)
    import nbtrain_rank_only_module

    return nbtrain_rank_only_module.Checkpointish(3)


def test_a_result_whose_class_exists_only_in_the_rank_gets_a_clear_error(tmp_path):
    from nbtrain.shared.errors import ResultError

    (tmp_path / "nbtrain_rank_only_module.py").write_text(
        "class Checkpointish:\n    def __init__(self, step):\n        self.step = step\n"
    )
    with pytest.raises(ResultError) as info:
        notebook_launcher(return_an_object_of_a_rank_only_module, (str(tmp_path),),
                          num_processes=2, **QUIET)
    text = str(info.value)
    assert info.value.rank == 0 and "rank 0" in text
    assert "nbtrain_rank_only_module.Checkpointish" in text
    assert "state_dict" in text and "plain data" in text
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


# --- Event transport -----------------------------------------------------------------------


def send_a_corrupt_event():
    from nbtrain.rank import runtime
    from nbtrain.shared import events

    fd = runtime.current().sink._fd
    garbage = b"\x80\x05not a pickle"
    flags = events._FIRST | events._LAST  # one whole frame, whose payload cannot be unpickled
    os.write(fd, events._PACKET.pack(os.getpid(), len(garbage), flags) + garbage)
    return "still here"


def test_an_undecodable_event_is_reported_and_the_launch_goes_on(capsys):
    assert notebook_launcher(send_a_corrupt_event, num_processes=2, progress="off") == "still here"
    err = capsys.readouterr().err
    assert "[rank 0] [nbtrain] protocol error: an event from process" in err, err
    assert "could not be decoded" in err


# --- Warm forkserver, and a worker path without ipywidgets ---------------------------------


def server_of_this_rank():
    return os.getppid()


def test_warm_forkserver_keeps_torch_loaded_for_later_launches():
    """Later launches reuse the same server, which has torch loaded (its shared libraries are
    mapped): a rank forked from it does not import torch again."""
    first = notebook_launcher(server_of_this_rank, num_processes=2, start_method="forkserver",
                              return_all=True, **QUIET)
    second = notebook_launcher(server_of_this_rank, num_processes=2, start_method="forkserver",
                               return_all=True, **QUIET)
    assert len(set(first + second)) == 1, f"the forkserver changed: {first} then {second}"
    with open(f"/proc/{first[0]}/maps") as maps:
        assert "libtorch" in maps.read(), "the forkserver has not imported torch"


def train_step_and_report():
    import nbtrain
    from nbtrain import Accelerator

    acc = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    loss = model(torch.ones(2, 4)).sum()
    acc.backward(loss)
    optimizer.step()
    for _ in nbtrain.progress(range(3), desc="steps"):
        nbtrain.log({"loss": float(loss)})
    return sorted(name for name in sys.modules if name.split(".")[0] in ("ipywidgets", "IPython"))


def test_the_worker_path_imports_no_widgets():
    loaded = notebook_launcher(train_step_and_report, num_processes=2, start_method="spawn",
                               **QUIET)
    assert not [name for name in loaded if name.startswith("ipywidgets")], loaded


def count_sigterms(directory):
    """Records every SIGTERM this rank receives, then waits to be stopped."""
    path = os.path.join(directory, f"rank{os.environ['RANK']}.terms")

    def handler(signum, frame):
        with open(path, "a") as handle:
            handle.write("SIGTERM\n")

    signal.signal(signal.SIGTERM, handler)
    time.sleep(600)


def test_stopping_a_rank_sends_it_one_sigterm(method, tmp_path):
    """A library's SIGTERM handler runs once per stop (a second signal while it handles the
    first would cut its shutdown short)."""
    with pytest.raises(TimeoutError):
        notebook_launcher(count_sigterms, (str(tmp_path),), num_processes=2, start_method=method,
                          timeout=HANG_TIMEOUT[method], **QUIET)
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.terms").read_text() == "SIGTERM\n"


def where_am_i() -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_one_rank_with_gpu_ids_runs_apart_from_the_kernel(monkeypatch):
    """The kernel sees every GPU and cannot be limited to gpu_ids: one rank with gpu_ids= runs in
    a process of its own that sees only those (GPUs mocked: CI has none; benchmarks/gpu runs the
    real thing). Without gpu_ids one rank still runs in the kernel's own process."""
    from nbtrain.kernel.host import environment

    monkeypatch.setattr(environment, "cuda_device_count", lambda: 2)
    pid, visible = notebook_launcher(where_am_i, num_processes=1, gpu_ids=[1], **QUIET)
    assert pid != os.getpid() and visible == "1"
    monkeypatch.setattr(environment, "cuda_device_count", lambda: 0)
    assert notebook_launcher(where_am_i, num_processes=1, **QUIET)[0] == os.getpid()


def last_one_late(ranks):
    dist.init_process_group("gloo")
    if dist.get_rank() == ranks - 1:
        time.sleep(600)  # never joins
    dist.all_reduce(torch.ones(1))


def test_at_width_ranks_at_the_same_place_share_one_line(capsys):
    # Eight real ranks, seven in all_reduce and the last one asleep: the picture is three
    # lines (issue 44's "Control at width"), not eight, and names the late rank.
    ranks = 8
    with pytest.raises(TimeoutError) as info:
        notebook_launcher(last_one_late, (ranks,), num_processes=ranks, start_method="fork",
                          timeout=25, progress="off", hang_after=8)
    lines = str(info.value).splitlines()
    picture = lines[lines.index(next(line for line in lines if line.startswith("Where"))) + 1:]
    assert len(picture) == 3, picture
    assert picture[0].startswith("ranks 0-6 were in ") and "in last_one_late" in picture[0]
    assert picture[1].startswith("rank 7 was in ") and "in last_one_late" in picture[1]
    assert picture[2] == (
        "ranks 0-6 wait in all_reduce; rank 7 has not entered it: the others wait for rank 7."
    )
    hang = capsys.readouterr().err
    assert "ranks 0-6 are in " in hang and "the others wait for rank 7." in hang, hang


def last_rank_raises(ranks):
    if int(os.environ["RANK"]) == ranks - 1:
        time.sleep(0.5)  # (the others are up by then)
        raise ValueError(f"rank {ranks - 1} failed on purpose")
    while True:
        time.sleep(0.05)


def test_at_width_one_failure_is_shown_in_full_and_the_stopped_ranks_in_one_line():
    # 32 real ranks, one raises, 31 are stopped (issue 44): the root cause's own traceback in
    # full, the others one line, not 31 tracebacks or summaries.
    ranks = 32
    with pytest.raises(WorkerError) as info:
        notebook_launcher(last_rank_raises, (ranks,), num_processes=ranks, start_method="fork",
                          **QUIET)
    err = info.value
    assert err.rank == ranks - 1 and err.other_failures == {} and err.stopped == ranks - 1
    assert str(err) == (
        "rank 31 failed with ValueError: rank 31 failed on purpose\n  31 other ranks were stopped"
    )
    assert "in last_rank_raises" in err.remote_traceback
    assert 'raise ValueError(f"rank {ranks - 1} failed on purpose")' in err.remote_traceback
