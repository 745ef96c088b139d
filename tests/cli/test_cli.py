"""The nbtrain command, end to end: real processes, real ranks."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPTS = Path(__file__).parent / "scripts"
NBTRAIN = [sys.executable, "-m", "nbtrain"]
CONSOLE = Path(sys.executable).parent / "nbtrain"  # the console script pyproject declares


def run(
    *args: str, timeout: float = 120, command: list[str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*(command or NBTRAIN), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def test_launch_runs_the_script_as_main_on_every_rank(tmp_path: Path):
    # Run from elsewhere: the script's own directory must still be importable (sibling module).
    done = run(
        "launch",
        "--num-processes",
        "2",
        str(SCRIPTS / "hello.py"),
        "--flag",
        "x",
        command=[str(CONSOLE)],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        line = f"[rank {rank}] hello from rank {rank} of 2 argv=['--flag', 'x'] main=True sum=3"
        assert line in done.stdout.splitlines(), done.stdout


def test_python_m_nbtrain_launch_works_the_same():
    done = run("launch", "--nproc-per-node", "3", str(SCRIPTS / "hello.py"))
    assert done.returncode == 0, done.stderr
    assert sorted(line for line in done.stdout.splitlines() if "hello" in line) == [
        f"[rank {r}] hello from rank {r} of 3 argv=[] main=True sum=6" for r in range(3)
    ]


def test_a_failing_rank_is_reported_with_its_traceback_and_exit_code():
    done = run("launch", "--num-processes", "2", str(SCRIPTS / "fail.py"), "raise")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    # As `python fail.py` would show it: the user's frame first, no launcher or runpy frames.
    assert (
        f'Traceback (most recent call last):\n  File "{SCRIPTS / "fail.py"}", line 12'
        in done.stderr
    )
    assert "runpy" not in done.stderr
    assert "ValueError: bad value on rank 1" in done.stderr
    assert "nbtrain: rank 1 failed with ValueError: bad value on rank 1" in done.stderr
    assert "rank 0 failed" not in done.stderr  # the survivor is not blamed

    exited = run("launch", "--num-processes", "2", str(SCRIPTS / "fail.py"), "3")
    assert exited.returncode == 3, exited.stderr
    assert "rank 1" in exited.stderr


@pytest.mark.parametrize(
    ("signum", "exitcode", "message"),
    [
        (signal.SIGINT, 130, "interrupted; every rank was stopped"),  # Ctrl-C
        (signal.SIGTERM, 143, ""),  # a scheduler or `kill`
    ],
)
def test_a_signal_stops_every_rank_and_exits_with_its_code(
    tmp_path: Path, signum: int, exitcode: int, message: str
):
    command = [*NBTRAIN, "launch", "--num-processes", "2", str(SCRIPTS / "sleep.py"), str(tmp_path)]
    _signal_when_ranks_run(command, tmp_path, signum, exitcode, message)


def test_ctrl_c_is_heard_even_by_a_command_started_with_sigint_ignored(tmp_path: Path):
    # A background job of a non-interactive shell (and some CI harnesses) starts with SIGINT
    # ignored, and Python then leaves it ignored: the command must install its handler anyway.
    ignoring = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    command = [
        sys.executable, "-c", ignoring, "-m", "nbtrain", "launch", "--num-processes", "2",
        str(SCRIPTS / "sleep.py"), str(tmp_path),
    ]
    _signal_when_ranks_run(
        command, tmp_path, signal.SIGINT, 130, "interrupted; every rank was stopped"
    )


def test_ctrl_c_while_a_rank_is_being_forked_is_not_lost(tmp_path: Path):
    # A signal's Python handler can run inside an at-fork callback (logging has one), where its
    # KeyboardInterrupt is printed as "Exception ignored" and dropped: on a loaded machine a
    # Ctrl-C right as the ranks started did nothing. Here SIGINT arrives exactly then, from an
    # at-fork callback of the command itself, while it forks its second rank.
    env = _with_sitecustomize(
        tmp_path,
        "import os, signal\n"
        "forks = []\n"
        "def before_fork(kill=os.kill, pid=os.getpid):\n"
        "    forks.append(1)\n"
        "    if len(forks) == 2:\n"
        "        kill(pid(), signal.SIGINT)\n"
        "os.register_at_fork(before=before_fork)\n",
    )
    command = subprocess.Popen(
        [*NBTRAIN, "launch", "--num-processes", "2", "--start-method", "fork",
         str(SCRIPTS / "sleep.py"), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        _, err = command.communicate(timeout=60)  # without the fix: the ranks sleep 120 s
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 130, err
    assert "interrupted; every rank was stopped" in err
    assert "Exception ignored" not in err
    for pid_file in tmp_path.glob("rank*.pid"):
        if pid_file.read_text():
            assert not _alive(int(pid_file.read_text())), f"{pid_file.name} survived"


def _signal_when_ranks_run(
    command: list[str], tmp_path: Path, signum: int, exitcode: int, message: str
) -> None:
    """Start ``command``, send ``signum`` once both ranks run, check how it ended."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = _rank_pids_once_running(process, tmp_path)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == exitcode, err
    assert message in err
    for pid in ranks:
        assert not _alive(pid), f"rank process {pid} survived {signal.Signals(signum).name}"


def test_the_command_exits_without_tearing_the_interpreter_down(tmp_path: Path):
    # Tearing down torch's modules after the run costs about a CPU-second, which a loaded
    # machine stretched to 30 s between "every rank was stopped" and the exit. atexit handlers
    # (multiprocessing's, a coverage tool's) still run; module teardown does not.
    marks = tmp_path / "marks"
    env = _with_sitecustomize(
        tmp_path,
        "import atexit, os\n"
        f"MARKS = {str(marks)!r}\n"
        # (Defaults: teardown may have cleared this module's globals before __del__ runs.)
        "def mark(what, path=MARKS, open=open, pid=os.getpid()):\n"
        "    with open(path, 'a') as f:\n"
        "        f.write(f'{pid} {what}\\n')\n"
        "atexit.register(mark, 'atexit')\n"
        "class Teardown:\n"
        "    def __del__(self, mark=mark):\n"
        "        mark('teardown')\n"
        "kept = Teardown()  # collected when the interpreter tears its modules down\n",
    )
    done = subprocess.Popen(
        [*NBTRAIN, "launch", "--num-processes", "2", str(SCRIPTS / "hello.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert "[rank 1] hello from rank 1 of 2" in out  # output written before the exit arrives
    # (Only the command's own marks: a spawned rank or forkserver would make its own.)
    own = [line for line in marks.read_text().splitlines() if line.startswith(f"{done.pid} ")]
    assert own == [f"{done.pid} atexit"]


def _rank_pids_once_running(process: subprocess.Popen, tmp_path: Path) -> list[int]:
    """Wait until both ranks of ``process`` run (each script writes rank<r>.pid in
    ``tmp_path``); their pids."""
    pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline and process.poll() is None, "ranks never started"
        time.sleep(0.1)
    return [int(f.read_text()) for f in pid_files]


def _with_sitecustomize(tmp_path: Path, code: str) -> dict[str, str]:
    """An environment whose Python runs ``code`` at start-up (a sitecustomize.py of its own)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(code)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_bad_options_exit_2_with_the_reason():
    zero = run("launch", "--num-processes", "0", str(SCRIPTS / "hello.py"))
    assert zero.returncode == 2
    # In the command line's words: the flag as typed, and a fix that can be typed (not None).
    assert "--num-processes 0 must be >= 1" in zero.stderr
    assert "Leave --num-processes out for the default" in zero.stderr
    assert "None" not in zero.stderr
    missing = run("launch", "nope.py")
    assert missing.returncode == 2
    assert "script 'nope.py' not found" in missing.stderr
    no_endpoint = run("launch", "--num-nodes", "2", str(SCRIPTS / "hello.py"))
    assert no_endpoint.returncode == 2
    assert "rdzv_endpoint" in no_endpoint.stderr


def test_max_restarts_from_the_command_line(tmp_path: Path):
    marker = tmp_path / "marker"
    done = run(
        "launch",
        "--num-processes",
        "2",
        "--max-restarts",
        "1",
        str(SCRIPTS / "flaky.py"),
        str(marker),
    )
    assert done.returncode == 0, done.stderr
    assert "restarting every rank (restart 1 of 1)" in done.stderr
    assert "RuntimeError: flaky first attempt" in done.stderr + done.stdout
    assert "[rank 0] attempt 1 ok" in done.stdout and "[rank 1] attempt 1 ok" in done.stdout


def test_two_nodes_from_the_command_line():
    port = _free_port()
    nodes = [_start_node(node, port, str(SCRIPTS / "hello.py")) for node in (0, 1)]
    outputs = _finish_nodes(nodes)
    assert [node.returncode for node in nodes] == [0, 0], outputs
    lines = {line for out, _ in outputs for line in out.splitlines() if "hello" in line}
    assert lines == {
        f"[rank {r}] hello from rank {r} of 4 argv=[] main=True sum=10" for r in range(4)
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_node(node: int, port: int, *script: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *NBTRAIN, "launch", "--num-processes", "2", "--num-nodes", "2",
            "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}", *script,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish_nodes(nodes: list[subprocess.Popen]) -> list[tuple[str, str]]:
    try:
        return [node.communicate(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()


def test_text_view_and_launcher_precision_reach_a_script():
    done = run(
        "launch", "--num-processes", "2", "--mixed-precision", "bf16", str(SCRIPTS / "progress.py")
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] precision bf16 matmul torch.bfloat16" in done.stdout, out
        # The text live view: a compact line per rank with step/total and the metric.
        assert re.search(rf"\[rank {rank}\] train 20/20 .*loss 0\.05", out), out
    assert "Done in" in out
    assert "\r" not in out  # not a terminal: no carriage-return redraws


def test_one_process_still_runs_as_a_rank_of_its_own():
    done = run("launch", str(SCRIPTS / "hello.py"))
    assert done.returncode == 0, done.stderr
    assert "[rank 0] hello from rank 0 of 1 argv=[] main=True sum=1" in done.stdout.splitlines()


def test_a_failure_on_one_node_ends_both_with_its_exit_code():
    port = _free_port()
    nodes = [_start_node(node, port, str(SCRIPTS / "fail.py"), "3") for node in (0, 1)]
    outputs = _finish_nodes(nodes)
    assert [node.returncode for node in nodes] == [3, 3], outputs
    for _, err in outputs:
        assert "nbtrain: rank 1 failed with SystemExit: 3" in err, outputs  # on node 0


def test_env_reports_versions_devices_and_choices():
    done = run("env")
    assert done.returncode == 0, done.stderr
    import torch

    out = done.stdout
    assert f"torch                   {torch.__version__}" in out
    assert "cloudpickle" in out and "ipywidgets" in out and "torch_xla" in out
    assert "CUDA GPUs               0 visible" in out  # this machine has no GPU
    assert "start methods           " in out and "fork" in out
    assert "start_method='auto'     fork:" in out  # the command never initialised CUDA
    assert "c10d" in out and socket.gethostname() in out


def test_demo_trains_and_reports(tmp_path: Path):
    done = run("demo", timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[rank 0] epoch" in done.stdout and "[rank 1] epoch" in done.stdout
    result = [line for line in done.stdout.splitlines() if line.startswith("Result:")]
    assert result, done.stdout
    assert "weights identical on every rank" in result[0]
    accuracy = float(result[0].split("accuracy ")[1].split("%")[0])
    assert accuracy > 90.0, result[0]


def test_version_and_help():
    assert run("--version").stdout.strip().startswith("nbtrain ")
    assert "launch" in run("--help").stdout
    assert os.path.exists(CONSOLE)


def test_launch_without_a_script_asks_for_the_script_only():
    done = run("launch", "--num-processes", "2")
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert error == "nbtrain launch: error: the following arguments are required: script", error


def test_demo_refuses_zero_ranks_before_starting_any():
    done = run("demo", "--num-processes", "0")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr, done.stderr
    assert "--num-processes: '0' is not a number of ranks: pass 1 or more" in done.stderr
    assert "nbtrain demo:" not in done.stdout  # stopped at the parser: nothing ran


def test_every_option_of_every_command_says_what_it_does():
    from nbtrain.kernel.cli.commands import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    silent = [
        f"nbtrain {name} {'/'.join(action.option_strings) or action.dest}"
        for name, command in commands.choices.items()
        for action in command._actions
        if not (action.help or "").strip()
    ]
    assert not silent, f"options without a help text: {silent}"
    # And the help screen shows it (argparse prints help texts only where given).
    shown = run("launch", "--help")
    assert shown.returncode == 0
    assert "machines taking part" in shown.stdout and "live text view" in shown.stdout


def test_timeout_124_ctrl_backslash_and_hang_detection_show_where_each_rank_is(tmp_path: Path):
    # Rank 0 waits in an all_reduce rank 1 never reaches. SIGQUIT (Ctrl-\) asks where each rank
    # is, hang detection (--hang-after 3) says it once by itself, the timeout's message again:
    # one picture, naming the rank the other waits for; then exit code 124.
    command = [*NBTRAIN, "launch", "--num-processes", "2", "--timeout", "9", "--hang-after", "3",
               str(SCRIPTS / "skip_allreduce.py"), str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _rank_pids_once_running(process, tmp_path)
        time.sleep(1.0)  # rank 0 is inside the all_reduce by now
        process.send_signal(signal.SIGQUIT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 124, err  # SIGQUIT did not end the run: the timeout did
    named = "rank 0 waits in all_reduce; rank 1 has not entered it: the others wait for rank 1."
    assert err.count(named) == 3, err  # asked, hang detection, the timeout
    assert err.count("[nbtrain] where each rank is:") == 1, err
    assert err.count("no rank has made progress for 3s (--hang-after 3)") == 1, err
    assert "rank 1 is in " in err and "skip_allreduce.py:17 in <module>" in err, err
    # The option as the user gave it, not notebook_launcher's keyword.
    assert "nbtrain: --timeout 9 expired; every rank was stopped" in err
    assert "Raise --timeout if the run needs longer" in err
    assert "notebook_launcher" not in err
    timeout = err[err.index("--timeout 9 expired"):]
    assert named in timeout
    # Where the ranks were ends at the script's own line, not at nbtrain's way into it.
    where = [line for line in timeout.splitlines() if " was in " in line]
    assert len(where) == 2, timeout
    assert where[0].startswith("rank 0 was in torch/distributed/distributed_c10d.py")
    assert where[0].endswith("skip_allreduce.py:15 in <module>"), where[0]
    assert where[1].endswith("skip_allreduce.py:17 in <module>"), where[1]
    assert not any("cli.py" in line or "runpy" in line for line in where), where
