"""The ``nbtrain`` command: ``launch`` a script on ranks, report the ``env``, run the ``demo``.

``nbtrain launch`` is a thin layer over torch's elastic agent, as ``torchrun`` is, with the
supervision of a notebook launch inside it (``agent.py``): each rank runs the script as
``__main__`` with ``sys.argv`` set; output arrives as rank-prefixed whole lines, a failure is
reported with its root cause, the text live view shows progress, Ctrl-C stops every rank. So a
training function moved from a notebook into a script behaves the same.

Exit codes: 0 success; the failing rank's exit code (1 when it raised or was killed) on failure;
130 on Ctrl-C, 143 on SIGTERM; 124 when ``--timeout`` expired or the nodes did not all join
within ``--rdzv-timeout``; 2 for bad options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from nbtrain.kernel.cli.command_exit import exit_now, hear_stop_signals, restore

EXIT_TIMEOUT = 124
EXIT_INTERRUPT = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM to the command: stop every rank as for Ctrl-C, then exit with 143."""


# ---------------------------------------------------------------------------------------------
# nbtrain launch


def _launch(options: argparse.Namespace) -> int:
    script = Path(options.script)
    if not script.is_file():
        return _usage_error(f"script {options.script!r} not found (pass a path to a .py file)")
    from nbtrain.kernel.launch.choose import build_launch
    from nbtrain.kernel.options.function import check_function
    from nbtrain.kernel.options.interface import UserCall
    from nbtrain.kernel.options.names import command_line
    from nbtrain.kernel.options.requested import Requested
    from nbtrain.kernel.run.where import SignalAsks
    from nbtrain.rank.script import run_script  # what each rank runs (rank side)
    from nbtrain.shared.errors import LaunchError, WorkerError

    previous = hear_stop_signals(_raise_terminated)  # also when started with them ignored
    try:
        args, kwargs = check_function(
            run_script, (str(script.resolve()), list(options.script_args)), None
        )
        with command_line():  # messages name --timeout, not notebook_launcher(timeout=)
            requested = Requested(**_launch_keywords(options), debug=options.debug)
            # torch's elastic agent even on one node without restarts, as torchrun
            launch = build_launch(requested, script.stem, elastic=True)
            with SignalAsks():  # Ctrl-\ (SIGQUIT): where each rank is, the run goes on
                launch.run(UserCall(run_script, args, kwargs))
    except WorkerError as err:
        _report_failure(err, str(script.resolve()))
        return err.exitcode if err.exitcode and err.exitcode > 0 else 1
    except Terminated:
        print("nbtrain: terminated (SIGTERM); every rank was stopped", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("nbtrain: interrupted; every rank was stopped", file=sys.stderr)
        return EXIT_INTERRUPT
    except TimeoutError as err:
        print(f"nbtrain: {err}", file=sys.stderr)
        return EXIT_TIMEOUT
    except (ValueError, TypeError) as err:  # options are checked before any process starts
        return _usage_error(str(err))
    except LaunchError as err:
        print(f"nbtrain: {err}", file=sys.stderr)
        return 1
    finally:
        restore(previous)
    return 0


def _launch_keywords(options: argparse.Namespace) -> dict[str, Any]:
    return {
        "num_processes": options.num_processes,
        "num_nodes": options.num_nodes,
        "node_rank": options.node_rank,
        "rdzv_endpoint": options.rdzv_endpoint,
        "rdzv_timeout": options.rdzv_timeout,
        "max_restarts": options.max_restarts,
        "mixed_precision": options.mixed_precision,
        "start_method": options.start_method,
        "gpu_ids": options.gpu_ids,
        "timeout": options.timeout,
        "hang_after": options.hang_after or None,  # 0: off
        "output": options.output,
        "progress": options.progress,
    }


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _report_failure(err: Any, script: str) -> None:
    """The root cause: the failing rank's traceback, then the one-line summary."""
    if err.remote_traceback:
        print(script_traceback(err.remote_traceback, script).rstrip(), file=sys.stderr)
    print(f"nbtrain: {err}", file=sys.stderr)


def script_traceback(text: str, script: str) -> str:
    """Drop the launcher's and runpy's frames above the script's first one, as if the script
    had been run with ``python script.py``."""
    header = "Traceback (most recent call last):\n"
    start = text.find(f'  File "{script}"')
    if not text.startswith(header) or start < 0:
        return text
    return header + text[start:]


def _usage_error(message: str) -> int:
    print(f"nbtrain launch: error: {message}", file=sys.stderr)
    return 2


def _add_launch_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "launch",
        help="run a Python script on several ranks (and nodes) under nbtrain's supervision",
        description="Run SCRIPT on every rank as __main__, with sys.argv = [SCRIPT, *ARGS]. "
        "Ranks get RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, so "
        "torch.distributed.init_process_group() and nbtrain.Accelerator() work as in a notebook.",
    )
    parser.add_argument("--num-processes", "--nproc-per-node", type=int, default=None,
                        metavar="P", help="ranks on this node (default: one per visible GPU, "
                        "8 on a TPU host, else 1; always in processes of their own)")
    parser.add_argument("--num-nodes", "--nnodes", type=int, default=1, metavar="N",
                        help="machines taking part (default 1); run this command on each, "
                        "with its own --node-rank and the same --rdzv-endpoint")
    parser.add_argument("--node-rank", type=int, default=0, metavar="R",
                        help="this node's rank, 0..N-1; node 0 hosts the rendezvous")
    parser.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                        help="node 0's address and a free port, the same on every node")
    parser.add_argument("--rdzv-timeout", type=float, default=900.0, metavar="S",
                        help="seconds to wait for every node to join (default 900)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart every rank of every node up to K times after a failure")
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default=None,
                        help="the precision every rank's Accelerator uses unless the script "
                        "asks otherwise (default: full precision)")
    parser.add_argument("--start-method", choices=["auto", "fork", "forkserver", "spawn"],
                        default="auto", help="how the ranks' processes start (default auto: "
                        "fork where safe, else forkserver; `nbtrain env` says which and why)")
    parser.add_argument("--gpu-ids", default=None, metavar="IDS", help="e.g. 0,2")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop every rank after S seconds (exit code 124)")
    parser.add_argument("--hang-after", type=float, default=300.0, metavar="S",
                        help="when no rank made progress for S seconds, print where each rank "
                        "is, once (default 300; 0: off). Ctrl-\\ (SIGQUIT) prints it any time")
    parser.add_argument("--output", choices=["all", "main", "none"], default="all",
                        help="whose output to show (default all, prefixed with the rank)")
    parser.add_argument("--progress", choices=["text", "off"], default="text",
                        help="the live text view of every rank's progress and metrics "
                        "(default text), or none (off)")
    parser.add_argument("--debug", action="store_true",
                        help="a rank that fails stays alive (the others are stopped) and opens "
                        "a (Pdb) rank N> prompt on this terminal at the failing line, before the "
                        "failure is reported (needs a terminal on stdin)")
    parser.add_argument("script", help="the Python script every rank runs")
    script_args = parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                                      help="arguments passed to the script (optional)")
    # argparse (before 3.13) counts a REMAINDER positional as required, so a missing script was
    # reported as "required: script, ARGS"; ARGS may be empty.
    script_args.required = False
    parser.set_defaults(handler=_launch)


# ---------------------------------------------------------------------------------------------
# nbtrain env and nbtrain demo


def _env(options: argparse.Namespace) -> int:
    from nbtrain.kernel.cli.envreport import report

    print(report())
    return 0


def _demo(options: argparse.Namespace) -> int:
    from nbtrain.kernel.cli.demo import main as demo_main

    previous = hear_stop_signals(_raise_terminated)
    try:
        return demo_main(num_processes=options.num_processes)
    except KeyboardInterrupt:
        print("nbtrain: interrupted; every rank was stopped", file=sys.stderr)
        return EXIT_INTERRUPT
    finally:
        restore(previous)


def _demo_ranks(text: str) -> int:
    """``demo --num-processes``: a whole number of ranks, 1 or more (checked before any start)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of ranks: pass 1 or more (default 2)"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbtrain",
        description="Notebook-first distributed training for PyTorch: the command line.",
    )
    from nbtrain._version import __version__

    parser.add_argument("--version", action="version", version=f"nbtrain {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_launch_parser(commands)
    env = commands.add_parser(
        "env", help="versions, devices, start methods, and what nbtrain would choose here",
    )
    env.set_defaults(handler=_env)
    demo = commands.add_parser(
        "demo", help="train a small model on 2 CPU ranks with live progress (a set-up check)",
    )
    demo.add_argument("--num-processes", type=_demo_ranks, default=2, metavar="P",
                      help="CPU ranks to train on (default 2)")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    code: int = options.handler(options)
    return code


def run() -> NoReturn:
    """The program (the ``nbtrain`` console script, ``python -m nbtrain``): ``main``, then an
    exit without interpreter teardown, which would hold a loaded machine for seconds after
    every rank was stopped (see command_exit.py)."""
    exit_now(main())


if __name__ == "__main__":  # pragma: no cover - `python -m nbtrain.kernel.cli.commands`
    run()
