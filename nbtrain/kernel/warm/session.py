"""The session handle (``Ranks``), ``start_ranks`` and ``current`` (the session ``%%ranks``
uses): the public face of the warm ranks. The processes are ``world.Worlds``'; each method
is one command (command.py), or a look into the ranks (debugging.py)."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import inspect
import keyword
import os
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbtrain.kernel.host import environment
from nbtrain.kernel.launch.cluster import resolve
from nbtrain.kernel.launch.cluster.spec import RayCluster
from nbtrain.kernel.options.config import LaunchConfig, StartChoice
from nbtrain.kernel.options.function import check_function
from nbtrain.kernel.options.requested import Requested
from nbtrain.kernel.options.stopping import StopOptions, build_policy
from nbtrain.kernel.run import handle, registry, tracebacks
from nbtrain.kernel.run.where import Where
from nbtrain.kernel.specs.payload import prepare_call, share
from nbtrain.kernel.warm import debugging
from nbtrain.kernel.warm.command import execute, results_segments
from nbtrain.kernel.warm.world import Worlds, keep_until_collected
from nbtrain.shared.commands import Call, Cell, Pull, Push
from nbtrain.shared.errors import SessionError
from nbtrain.shared.options import ProgressMode, StartMethod
from nbtrain.shared.serialization import PayloadError

_current: Ranks | None = None  # the session magics use (the last one started)


class Ranks:
    """A set of warm ranks (see the package docstring); made by ``start_ranks``."""

    def __init__(
        self,
        config: LaunchConfig,
        stop: StopOptions | None = None,
        cluster: RayCluster | None = None,
    ) -> None:
        """``stop``: start_ranks' stop and resume options, checked again (and the checkpoint
        numbering taken afresh) whenever a new set of ranks starts. ``cluster``: ranks placed
        by Ray (bytes travel through Ray; no /dev/shm shared with them)."""
        self._worlds = Worlds(config, stop, cluster)
        self.ranks = self._worlds.ranks
        self._finalizer = keep_until_collected(self, self._worlds)
        self._cells = 0
        self._worlds.start()

    @property
    def config(self) -> LaunchConfig:
        """The options every command runs with (the stop policy of the current ranks)."""
        return self._worlds.config

    @property
    def cluster(self) -> RayCluster | None:
        """The ``RayCluster`` the ranks are placed on, or None for ranks on this machine."""
        return self._worlds.cluster

    # -- the public API ----------------------------------------------------------------------

    def run(
        self,
        function: Callable[..., Any],
        *args: Any,
        on_interrupt: str | None = None,
        block: bool = True,
        **kwargs: Any,
    ) -> Any:
        """``function(*args, **kwargs)`` on every rank: rank 0's value (every rank's with
        ``return_all``), as ``notebook_launcher`` returns it. A notebook-defined function sees
        the rank's own names (what earlier cells defined) over the kernel's. ``on_interrupt``
        ("stop" or "checkpoint") overrides start_ranks' for this call (guide:
        stop-and-resume.md); the call's checkpoints go where start_ranks' options say.
        ``block=False``: an ``nbtrain.Run`` at once, the call going on in the background
        (guide: long-runs.md); the ranks take no other command until it ended."""
        __tracebackhide__ = True
        if not isinstance(block, bool):
            raise TypeError(f"block={block!r} must be True or False.")
        if not block:
            name = getattr(function, "__qualname__", "run")
            run = handle.Run(
                name,
                lambda: self.run(function, *args, on_interrupt=on_interrupt, **kwargs),
                background=True,
                stopping=self._worlds.call_policy(on_interrupt),
                holds=self._worlds,
            )
            return registry.begin(run, block=False)
        args, kwargs = check_function(function, args, kwargs)
        stopping = self._worlds.call_policy(on_interrupt)
        world = self._worlds.require()
        # Pickled, never by reference: the ranks were started before these objects existed.
        call = prepare_call(function, args, kwargs, StartMethod.SPAWN, local=self._local)
        return_all = self.config.return_all
        try:
            call.commit(lambda text: None, len(self.ranks))
            name = getattr(function, "__qualname__", repr(function))
            return execute(
                self._worlds, world,
                lambda rank: Call(call.data, return_all or rank == 0, stopping), self.ranks,
                title=f"{name} on {len(self.ranks)} warm ranks", return_all=return_all,
                stopping=stopping,
            )
        finally:
            call.release()

    def pull(self, expression: str) -> list[Any]:
        """The value of ``expression`` on every rank, as a list by rank (tensors on the CPU)."""
        __tracebackhide__ = True
        _check_expression(expression)
        world = self._worlds.require()
        with results_segments(self._local) as prefix:
            return execute(
                self._worlds, world, lambda rank: Pull(expression, prefix), self.ranks,
                title=f"pull {expression!r}", return_all=True, quiet=True,
            )

    def push(self, **values: Any) -> None:
        """Set these names in every rank's namespace (large tensors and arrays through one
        shared-memory segment, not one copy per rank)."""
        __tracebackhide__ = True
        if not values:
            raise TypeError("push() needs names to set, e.g. ranks.push(lr=0.01).")
        for name in values:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"push({name}=...): {name!r} is not a Python name.")
        world = self._worlds.require()
        try:
            shared = share(values, label="push(...)", local=self._local)
        except PayloadError:
            raise
        except Exception as exc:
            raise PayloadError(_unpicklable(values, exc)) from None
        try:
            shared.commit(lambda text: None, len(self.ranks))
            execute(
                self._worlds, world, lambda rank: Push(shared.data), self.ranks,
                title=f"push {', '.join(values)}", return_all=True, quiet=True,
            )
        finally:
            shared.release()

    def run_cell(
        self,
        code: str,
        ranks: Sequence[int] | None = None,
        *,
        filename: str | None = None,
        timeout: float | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Run ``code`` on ``ranks`` (default: all) in each rank's namespace (what ``%%ranks``
        does). Returns each rank's display bundle of the last expression's value (ranks whose
        cell ended without a value are left out).

        :param code: Python source.
        :param ranks: rank numbers (default: every rank).
        :param filename: the name tracebacks give the code (``%%ranks`` gives ``Cell In[n]``).
        :param timeout: seconds the cell may take (default: the session's ``timeout``).
        :raises SessionError: no session running, or a rank number it does not have.
        :raises WorkerError: the cell failed on a rank (the ranks stay warm).
        """
        __tracebackhide__ = True
        selected = sorted(self.ranks if ranks is None else ranks)
        self._cells += 1
        name = filename or f"<%%ranks cell {self._cells}>"
        try:
            compile(code, name, "exec")  # bad syntax fails here once, before any rank runs it
        except SyntaxError as exc:
            exc.add_note("(the %%ranks cell was not sent to the ranks)")
            raise
        world = self._worlds.require()
        with results_segments(self._local) as prefix:
            values = execute(
                self._worlds, world, lambda rank: Cell(code, name, results_prefix=prefix),
                selected,
                title=f"cell on rank{'s' if len(selected) > 1 else ''} "
                f"{', '.join(map(str, selected))}",
                return_all=True,
                timeout=timeout,
            )
        pairs = zip(selected, values, strict=True)
        return {rank: value for rank, value in pairs if value is not None}

    def debug(self, rank: int | None = None, *, commands: Sequence[str] | None = None) -> None:
        """Post-mortem (``%ranks_debug``): pdb in ``rank`` (default: the rank that failed first
        in the last failed command) at the frame that raised, with its locals, as IPython's
        ``%debug``: ``p``, ``up``, ``down``, ``l``; ``c`` or ``q`` ends it, the rank stays warm.
        ``commands``: run these pdb commands instead of asking (shown as typed), then ``c``;
        works where nobody can type (a notebook run by nbclient or papermill)."""
        __tracebackhide__ = True
        debugging.debug(self._worlds, rank, commands)

    def where(self) -> Where:
        """Where each rank is now (between cells: idle, unless a rank's own threads run
        something): each rank's stack ending at the user's code and, for a rank inside a
        collective, which one and which ranks have not entered it. While a cell runs, the
        dashboard's "where?" button shows the same (notebooks/guides/debugging.md)."""
        return debugging.where(self._worlds)

    def restart(self) -> None:
        """Stop every rank and start a fresh set: namespaces and process group are gone."""
        self._worlds.restart()

    def stop(self) -> None:
        """End the ranks (each leaves its loop; stragglers are terminated). Idempotent."""
        global _current
        self._worlds.stop()
        if _current is self:
            _current = None

    @property
    def placed(self) -> str:
        """How the ranks were started: a start method here, or the cluster."""
        return "on a Ray cluster" if self.cluster else self.config.start.method.value

    @property
    def _local(self) -> bool:
        """The ranks share this machine's /dev/shm (not placed by a cluster)."""
        return self.cluster is None

    @property
    def running(self) -> bool:
        """True while the ranks are up (False after ``stop()`` or when they were lost)."""
        return self._worlds.world is not None

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<nbtrain warm ranks: {len(self.ranks)} ranks, {self.placed}, {state}>"
        )


def _check_expression(expression: object) -> None:
    if not isinstance(expression, str):
        raise TypeError(
            f"pull({expression!r}): give an expression as a string, e.g. ranks.pull('loss')."
        )
    try:
        ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise SyntaxError(
            f"pull({expression!r}) is not a Python expression ({exc.msg}); pull takes one "
            "expression, e.g. ranks.pull('model.weight.sum()')."
        ) from None


def _unpicklable(values: dict[str, Any], exc: Exception) -> str:
    for name, value in values.items():
        try:
            pickle.dumps(value)
        except Exception:
            try:
                import cloudpickle

                cloudpickle.dumps(value)
            except Exception:
                return (
                    f"push({name}=...): {type(value).__qualname__} cannot be sent to the "
                    f"ranks ({type(exc).__name__}: {exc}). Create it on the ranks instead, in "
                    "a %%ranks cell."
                )
    return f"push(...) cannot be sent to the ranks ({type(exc).__name__}: {exc})."


def current() -> Ranks:
    """The session ``%%ranks`` uses: the last one started and not stopped."""
    ranks = _current
    if ranks is None or not ranks.running:
        raise SessionError(
            "no warm ranks are running: start them first with "
            "ranks = nbtrain.start_ranks(num_processes=2)."
        )
    return ranks


def start_ranks(
    num_processes: int | None = 2,
    *,
    start_method: str = "auto",
    mixed_precision: str | None = None,
    gpu_ids: list[int] | None = None,
    timeout: float | None = None,
    hang_after: float | None = 300.0,
    output: str = "all",
    progress: str = "auto",
    return_all: bool = False,
    replace: bool = False,
    on_interrupt: str = "stop",
    checkpoint_every: int | str | datetime.timedelta | None = None,
    resume: bool | str = False,
    resume_from: str | os.PathLike[str] | None = None,
    project_dir: str | os.PathLike[str] | None = None,
    total_limit: int | None = 3,
    cluster: str | RayCluster | None = None,
) -> Ranks:
    """Start ``num_processes`` warm ranks (notebooks/guides/warm-ranks.md). ``timeout`` is each
    command's limit; ``start_method='auto'`` starts clean ranks (forkserver, else spawn), so
    the kernel may use CUDA itself; ``hang_after`` is each command's hang detection
    (notebooks/guides/debugging.md). With ranks already running, ``replace=True`` stops them
    first; otherwise that is an error saying so. The stop and resume options are
    notebook_launcher's, for every command (default project_dir: ``nbtrain-runs/session``).
    ``cluster="ray"`` (or ``nbtrain.RayCluster(...)``): the ranks are placed on the Ray cluster
    this kernel is connected to, as notebook_launcher's (notebooks/guides/cluster.md).

    :param num_processes: how many warm ranks (None: one per visible GPU).
    :param start_method: ``"auto"``, ``"forkserver"``, ``"spawn"`` or ``"fork"``.
    :param mixed_precision: the default precision of the ranks' Accelerators, as
        notebook_launcher's.
    :param gpu_ids: which GPUs the ranks use, as notebook_launcher's.
    :param timeout: see above.
    :param hang_after: see above.
    :param output: ``"all"``, ``"main"`` or ``"none"``: whose prints reach the cell.
    :param progress: ``"auto"``, ``"widgets"``, ``"text"`` or ``"off"``: the live view of each
        command.
    :param return_all: True: ``ranks.run(function)`` returns every rank's value, not only rank 0's.
    :param replace: see above.
    :param on_interrupt: ``"stop"`` or ``"checkpoint"``, as notebook_launcher's.
    :param checkpoint_every: periodic checkpoints, as notebook_launcher's.
    :param resume: as notebook_launcher's; as are ``resume_from``, ``project_dir`` and
        ``total_limit``.
    :param cluster: see above.
    :returns: the ``Ranks`` handle; ``%%ranks`` cells run on these ranks from now on.
    :raises ValueError: a bad option value, named with the fix, before any rank starts.
    :raises TypeError: an option of the wrong type (named the same way).
    :raises SessionError: warm ranks already run and ``replace`` is False.
    """
    global _current
    # A start that takes seconds says what it waits for (Worlds._say), then how long it took.
    began = time.monotonic()
    tracebacks.install()  # a wrong argument's message under the cell, not nbtrain's frames
    # Every parameter but replace is an option, by its name (Requested.of).
    requested = Requested.of({k: v for k, v in locals().items() if k in _START_OPTIONS})
    stop = requested.stop
    config, chosen = _checked(requested)
    if not isinstance(replace, bool):
        raise TypeError(f"replace={replace!r} must be True or False.")
    # (checked here, before any rank starts: bad input fails now)
    asked = build_policy("session", config.world_size, stop) is not None
    running = _current
    if running is not None and running.running:
        if not replace:
            raise SessionError(
                f"{len(running.ranks)} warm ranks are already running ({running!r}). Stop them "
                "with ranks.stop() first, or pass replace=True to stop them and start new ones."
            )
        running.stop()
    ranks = Ranks(config, stop if asked else None, chosen)
    if config.progress is not ProgressMode.OFF:
        print(f"nbtrain: {config.world_size} warm ranks ready in "
              f"{time.monotonic() - began:.1f}s ({ranks.placed})", flush=True)
    _current = ranks
    return ranks


# start_ranks' options: its parameters but replace (what to do with a running session).
_START_OPTIONS = frozenset(inspect.signature(start_ranks).parameters) - {"replace"}


def _checked(requested: Requested) -> tuple[LaunchConfig, RayCluster | None]:
    """The warm ranks' configuration (one node, no XLA launch: a rank may import torch_xla
    itself), and the cluster that places them, if any."""
    config = requested.config(allow_xla=False)
    if requested.cluster is not None:
        return config, resolve(requested.cluster, config, requested)
    if requested.start_method == "auto" and config.start.method is StartMethod.FORK:
        config = dataclasses.replace(config, start=_clean_start())
    return config, None


def _clean_start() -> StartChoice:
    if "forkserver" in environment.available_start_methods():
        return StartChoice(
            StartMethod.FORKSERVER,
            "forkserver: warm ranks start clean (the kernel may use CUDA meanwhile)",
        )
    return StartChoice(StartMethod.SPAWN, "spawn: warm ranks start clean")


__all__ = ["Ranks", "SessionError", "current", "start_ranks"]
