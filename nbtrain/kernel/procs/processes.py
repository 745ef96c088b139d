"""Starting rank processes under fork / forkserver / spawn (handles.py holds what the kernel
keeps of each; reaping.py stops and reaps them).

Each rank is a non-daemonic child (so it may start DataLoader workers) that makes itself the
leader of its own process group, so stopping it can signal its DataLoader workers too.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import torch.multiprocessing as torch_mp

from nbtrain.kernel.procs import fork_gc, forkserver, signal_hold, std_flush
from nbtrain.kernel.procs.handles import RankPipes, RankProcess, exit_fd
from nbtrain.kernel.procs.reaping import close_pidfds, stop
from nbtrain.shared.frontend import Frontend, frontend
from nbtrain.shared.options import StartMethod


def context(method: StartMethod) -> Any:
    ctx = torch_mp.get_context(method.value)
    if method is StartMethod.FORKSERVER:
        # Takes effect when the forkserver first starts (then later launches reuse it warm).
        ctx.set_forkserver_preload(forkserver.SERVER_PRELOAD)
    return ctx


def starting_phase(method: StartMethod, count: int) -> str:
    """What starting ``count`` ranks by ``method`` will spend its seconds on, said before it blocks
    (the view cannot redraw while the kernel waits for a fork or for the forkserver); '' when
    that is only a fork of a kernel that has imported everything already."""
    if method is StartMethod.SPAWN:
        return "starting Python"
    if method is StartMethod.FORKSERVER:
        return "" if forkserver.warm() else "starting Python, importing torch (forkserver)"
    cold = [name for name in fork_imports(count) if name not in sys.modules]
    if not cold:
        return ""
    # torch._dynamo alone (a launch in Run All, before the warm-up's last step): say which
    what = "torch._dynamo" if cold == ["torch._dynamo"] else "torch"
    return f"importing {what} {_forking_process()}"


def _forking_process() -> str:
    """Where a fork launch imports torch, in the words of where the user is: a script that
    calls notebook_launcher has no kernel, and its one launch is no "first" one."""
    kind = frontend()
    if kind is Frontend.JUPYTER:
        return "in the kernel (first launch only)"
    if kind is Frontend.IPYTHON:
        return "in IPython (first launch only)"
    return "before forking the ranks"


def fork_imports(count: int) -> list[str]:
    """What a fork launch of ``count`` ranks imports into the kernel first: what every rank
    imports anyway (torch, the rank side, torch._dynamo, which any optimizer imports), once, as
    the forkserver preloads it; the ranks, and every later launch's, inherit it. Also while the
    warm-up has torch._dynamo still to come ("Run All"): leaving it to the ranks made each
    launch's ranks import it again, at the same time; Run All with two launches took 18.2 s that
    way against 11.1 s (benchmarks/runall.py, issue 42)."""
    return list(forkserver.PRELOAD)


def start_ranks(
    method: StartMethod,
    ranks: Sequence[int],
    target: Callable[..., None],
    make_args: Callable[[int, RankPipes, tuple[int, ...]], tuple],
) -> list[RankProcess]:
    """Start one process per rank; ``make_args(rank, pipes, fds_to_close)`` builds its args.

    Under fork, each child inherits every pipe of every rank; it is told which fds to close.
    Under forkserver / spawn only the pipes passed as arguments reach the child.
    """
    ctx = context(method)
    if method is StartMethod.FORK:
        for module in fork_imports(len(ranks)):
            importlib.import_module(module)
    all_pipes = {rank: RankPipes.create(ctx) for rank in ranks}
    started: list[RankProcess] = []
    try:
        # A Ctrl-C during a fork would be raised in an at-fork callback and lost: held, then
        # raised here, after the loop (signal_hold.py), so the ranks started are stopped below.
        with signal_hold.held(), fork_gc.kernel_objects_frozen(method), std_flush.flushed_once():
            fds = _fd_numbers(all_pipes) if method is StartMethod.FORK else None
            for rank in ranks:
                pipes = all_pipes[rank]
                foreign = _foreign_fds(fds, rank) if fds is not None else ()
                process = ctx.Process(
                    target=target,
                    args=make_args(rank, pipes, foreign),
                    name=f"nbtrain-rank-{rank}",
                    daemon=False,
                )
                with forkserver.main_module_not_inherited(method):
                    process.start()
                _claim_group(process, method)
                started.append(RankProcess(rank, process, pipes, pidfd=exit_fd(process)))
        _note_served(method)
    except BaseException:
        stop(started, grace=0.0)
        close_pidfds(started)
        for pipes in all_pipes.values():
            pipes.close_writers()
            pipes.close_readers()
        raise
    for pipes in all_pipes.values():
        pipes.close_writers()
    for rank_process in started:
        for fd in rank_process.pipes.reader_fds():
            os.set_blocking(fd, False)
    return started


def _note_served(method: StartMethod) -> None:
    if method is StartMethod.FORKSERVER:
        forkserver.served()


def _fd_numbers(all_pipes: dict[int, RankPipes]) -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """Every rank's pipe ends as numbers, asked once: each fork child gets the list of the
    others' (64 ranks: 64 x 448 fileno() calls were 0.1 s of the launch)."""
    kernel = [fd for pipes in all_pipes.values() for fd in pipes.kernel_fds()]
    return kernel, {rank: pipes.rank_fds() for rank, pipes in all_pipes.items()}


def _foreign_fds(
    fds: tuple[list[int], dict[int, tuple[int, ...]]], own: int
) -> tuple[int, ...]:
    kernel, by_rank = fds
    return (*kernel, *(fd for rank, ends in by_rank.items() if rank != own for fd in ends))


def _claim_group(process: BaseProcess, method: StartMethod) -> None:
    # The child also calls setpgid itself; doing it here too closes the window in which a fork
    # child has not yet run that line. Other start methods exec or use another parent: the
    # child's own call is the one that counts there.
    if method is StartMethod.FORK and process.pid is not None:
        with contextlib.suppress(OSError):
            os.setpgid(process.pid, process.pid)
