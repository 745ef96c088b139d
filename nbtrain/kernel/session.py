"""Warm ranks: a distributed session that lives across cells (``nbtrain.start_ranks``).

A session is a set of long-lived rank processes (rank/session.py), each serving one command at a
time from its own pipe. Every command (a ``%%ranks`` cell, ``run``, ``pull``, ``push``) is one
``Run`` (run.py): its own view, cell output, root cause and timeout, fed by the session's
``RankGroup`` (group/, ``warm=True``): its one watch loop returns once every rank of the
command reported it and never tears the ranks down for an ordinary failure; its Ctrl-C policy
interrupts the command, not the processes.

What happens to the ranks' state:

- a command that raises on some ranks while the others finish (or raise too): state kept;
- ranks still busy STUCK_GRACE after another failed or after an interrupt (typically in a
  collective waiting for the failed rank), or a rank that died: every rank is stopped and a new
  set started, and the error says so plainly;
- Ctrl-C: KeyboardInterrupt in the command on every rank; kept if they all return in time.

No orphans: ranks die with the kernel (PR_SET_PDEATHSIG, and EOF on their command pipe), on
``stop()``, and at interpreter exit (``weakref.finalize``).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import keyword
import os
import pickle
import secrets
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from nbtrain.display.runstate import Verdict
from nbtrain.kernel import cellnames, environment, processes
from nbtrain.kernel.cluster.spec import RayCluster
from nbtrain.kernel.config import LaunchConfig, build_config, check_function
from nbtrain.kernel.group import Backend, LocalProcesses, RankGroup
from nbtrain.kernel.local import rank_specs
from nbtrain.kernel.payload import prepare_call, share
from nbtrain.kernel.pdbprompt import can_ask
from nbtrain.kernel.postmortem import NO_INPUT, KeptFailures
from nbtrain.kernel.rendezvous import open_local
from nbtrain.kernel.run import Run
from nbtrain.kernel.stopping import build_policy
from nbtrain.kernel.supervisor import Supervisor
from nbtrain.kernel.where import Where
from nbtrain.rank import session_entry
from nbtrain.shared import sharedmem, stacks
from nbtrain.shared.commands import Call, Cell, Command, Debug, Pull, Push, Stop
from nbtrain.shared.errors import SessionError, WorkerError
from nbtrain.shared.events import Event
from nbtrain.shared.options import ProgressMode, StartMethod
from nbtrain.shared.serialization import PayloadError
from nbtrain.shared.specs import RankSpec
from nbtrain.shared.stacks import RankStack
from nbtrain.shared.stopping import StopPolicy

STOP_WAIT = 5.0  # seconds ranks get to leave their loop on stop() before they are terminated
VIEW_AFTER = 0.5  # seconds a command runs before its live view appears (quick cells get none)

_current: Ranks | None = None  # the session magics use (the last one started)


class CommandPipe(Protocol):
    """A rank's command channel: a pipe's write end here, a call to its actor on a cluster."""

    def send_bytes(self, data: bytes) -> None: ...


@dataclasses.dataclass
class _World:
    """One generation of warm rank processes: their group, and each rank's command pipe."""

    group: RankGroup
    commands: Mapping[int, CommandPipe]
    # A failure's error as the cell shows it: on a cluster, naming the root cause's node.
    named: Callable[[WorkerError], WorkerError] = lambda error: error

    def send(self, rank: int, data: bytes) -> None:
        # A rank that died meanwhile cannot read: the supervisor sees its exit next.
        with contextlib.suppress(OSError):
            self.commands[rank].send_bytes(data)

    def close(self, grace: float) -> None:
        """Ask every rank to leave its loop, wait up to ``grace``, then stop the rest."""
        data = pickle.dumps(Stop())
        for rank in self.commands:
            self.send(rank, data)
        self.group.stop(wait=grace)
        self.group.close()  # (the command pipes and the rendezvous with it)


class _Holder:
    """What ``weakref.finalize`` stops: the session's current world (not the session itself)."""

    world: _World | None = None

    def stop(self, grace: float = STOP_WAIT) -> None:
        world, self.world = self.world, None
        if world is not None:
            world.close(grace)


class Ranks:
    """A set of warm ranks (see the module docstring); made by ``start_ranks``."""

    def __init__(
        self,
        config: LaunchConfig,
        stop_options: dict[str, Any] | None = None,
        cluster: RayCluster | None = None,
    ) -> None:
        """``stop_options``: start_ranks' stop and resume options, checked again (and the
        checkpoint numbering taken afresh) whenever a new set of ranks starts. ``cluster``:
        ranks placed by Ray (bytes travel through Ray; no /dev/shm shared with them)."""
        self.config = config
        self.cluster = cluster
        self._stop_options = dict(stop_options or {})
        self.ranks = list(range(config.world_size))
        self._holder = _Holder()
        # Ends the ranks when the handle is collected, or at interpreter exit at the latest.
        self._finalizer = weakref.finalize(self, self._holder.stop)
        self._commands = 0
        self._failures = KeptFailures(config.world_size)  # for %ranks_debug
        self._start_world()

    # -- the public API ----------------------------------------------------------------------

    def run(
        self,
        function: Callable[..., Any],
        *args: Any,
        on_interrupt: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``function(*args, **kwargs)`` on every rank: rank 0's value (every rank's with
        ``return_all``), as ``notebook_launcher`` returns it. A notebook-defined function sees
        the rank's own names (what earlier cells defined) over the kernel's. ``on_interrupt``
        ("stop" or "checkpoint") overrides start_ranks' for this call (guide:
        stop-and-resume.md); the call's checkpoints go where start_ranks' options say."""
        __tracebackhide__ = True
        args, kwargs = check_function(function, args, kwargs)
        stopping = self._call_policy(on_interrupt)
        world = self._require()
        # Pickled, never by reference: the ranks were started before these objects existed.
        call = prepare_call(function, args, kwargs, StartMethod.SPAWN, local=self._local)
        try:
            call.commit(lambda text: None, len(self.ranks))
            name = getattr(function, "__qualname__", repr(function))
            return self._execute(
                world,
                lambda rank: Call(call.data, self.config.return_all or rank == 0, stopping),
                self.ranks,
                title=f"{name} on {len(self.ranks)} warm ranks",
                return_all=self.config.return_all,
                stopping=stopping,
            )
        finally:
            call.release()

    def pull(self, expression: str) -> list[Any]:
        """The value of ``expression`` on every rank, as a list by rank (tensors on the CPU)."""
        __tracebackhide__ = True
        _check_expression(expression)
        world = self._require()
        with _results_segments(self._local) as prefix:
            return self._execute(
                world, lambda rank: Pull(expression, prefix), self.ranks,
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
        world = self._require()
        try:
            shared = share(values, label="push(...)", local=self._local)
        except PayloadError:
            raise
        except Exception as exc:
            raise PayloadError(_unpicklable(values, exc)) from None
        try:
            shared.commit(lambda text: None, len(self.ranks))
            self._execute(
                world, lambda rank: Push(shared.data), self.ranks,
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
        cell ended without a value are left out)."""
        __tracebackhide__ = True
        selected = sorted(self.ranks if ranks is None else ranks)
        self._commands += 1
        name = filename or f"<%%ranks cell {self._commands}>"
        try:
            compile(code, name, "exec")  # bad syntax fails here once, before any rank runs it
        except SyntaxError as exc:
            exc.add_note("(the %%ranks cell was not sent to the ranks)")
            raise
        world = self._require()
        with _results_segments(self._local) as prefix:
            values = self._execute(
                world, lambda rank: Cell(code, name, results_prefix=prefix), selected,
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
        chosen = self._failures.choose(rank)
        script = _pdb_commands(commands)
        if script is None and not can_ask():
            raise SessionError(
                f"ranks.debug(): {NO_INPUT}. Run the cell from Jupyter, or look at the rank's "
                "names with %%ranks / ranks.pull(...)."
            )
        world = self._require()
        if not self._failures.kept:  # a rank had died: _require started new ranks
            raise SessionError(
                f"ranks.debug(): rank {chosen}'s failure is gone: the ranks were just restarted "
                "(see the message above), and new ranks hold no frames."
            )
        prompts = world.group.channel.prompts
        with contextlib.nullcontext() if script is None else prompts.scripted(script):
            self._execute(
                world, lambda rank: Debug(), [chosen], title=f"post-mortem of rank {chosen}",
                return_all=True, quiet=True, keep_failures=False,
            )

    def where(self) -> Where:
        """Where each rank is now (between cells: idle, unless a rank's own threads run
        something): each rank's stack ending at the user's code and, for a rank inside a
        collective, which one and which ranks have not entered it. While a cell runs, the
        dashboard's "where?" button shows the same (notebooks/guides/debugging.md)."""
        world = self._require()
        group = world.group
        got: list[dict[int, RankStack]] = []
        group.begin(set(), _drop, lambda: False)  # no command: what the ranks write is dropped
        group.channel.ask_where(got.append)
        while not got and not group.exited():
            group.step(None)
        return Where(got[0] if got else group.stacks())

    def restart(self) -> None:
        """Stop every rank and start a fresh set: namespaces and process group are gone."""
        self._holder.stop()
        self._start_world()

    def stop(self) -> None:
        """End the ranks (each leaves its loop; stragglers are terminated). Idempotent."""
        global _current
        self._holder.stop()
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
        return self._holder.world is not None

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<nbtrain warm ranks: {len(self.ranks)} ranks, {self.placed}, {state}>"
        )

    # -- one command -------------------------------------------------------------------------

    def _execute(
        self,
        world: _World,
        command: Callable[[int], Command],
        ranks: list[int],
        *,
        title: str,
        return_all: bool,
        timeout: float | None = None,
        quiet: bool = False,
        stopping: StopPolicy | None = None,
        keep_failures: bool = True,
    ) -> Any:
        """``keep_failures``: the ranks that fail keep their frames for ``debug()``."""
        __tracebackhide__ = True
        config = dataclasses.replace(
            self.config,
            return_all=return_all,
            timeout=self.config.timeout if timeout is None else timeout,
            stopping=stopping or self.config.stopping,
        )
        if quiet:  # pull/push: answers, not runs worth a view of their own
            config = dataclasses.replace(config, progress=ProgressMode.OFF)
        run = Run(config, ranks, title=title, view_after=VIEW_AFTER)
        group = world.group
        group.begin(set(ranks), run.emit, run.outcome.has_failure)
        run.watching(group)
        run.start_clock()

        def send() -> None:
            for rank in ranks:
                world.send(rank, pickle.dumps(command(rank)))

        def lost(exc: BaseException) -> None:  # an error in the kernel's own loop: the ranks go
            self._holder.world = None
            run.abandon(exc)

        with group.stopped_on_error(lost):
            group.watch(
                run.deadline, run.tick, run.interrupts(keep=True), first=send, redraw=run.redraw
            )
        if keep_failures:  # (before a restart below, which forgets them again)
            self._failures.record(ranks, run.outcome)
        supervisor = group.channel
        if supervisor.stopping:
            self._restart_after(run, supervisor)
        if supervisor.timed_out:
            self._time_out(run, supervisor, restarted=False)
        if supervisor.interrupted:
            # Not a failure, and nothing was stopped: the dashboard says what the error says.
            run.end(
                f"Interrupted after {run.state.elapsed:.1f}s: every rank is idle again, "
                "its state kept",
                Verdict.STOPPED,
            )
            raise KeyboardInterrupt(
                "every rank was interrupted and is idle again; their state is kept"
            ) from None
        stops = run.outcome.stops()
        if stops and not run.outcome.has_failure():
            run.stopped(stops, "Every rank is idle again with its state as of that step.")
        try:
            return run.finish(supervisor)
        except WorkerError as error:  # (its cause: the rank's traceback, shown in the cell)
            raise world.named(error) from error.__cause__

    def _restart_after(self, run: Run, supervisor: Supervisor) -> None:
        """The world is broken (a rank died, or some stayed stuck): start a new one, then raise
        what happened, saying which rank failed, where the others were, that state is gone."""
        __tracebackhide__ = True
        stuck = stacks.describe(supervisor.stuck_frames(), cellnames.place)  # (the group's stacks)
        self._holder.stop(grace=0.0)
        self._start_world()
        note = (
            f"nbtrain restarted the {len(self.ranks)} ranks: every rank's state (names, "
            "model, process group) is gone; run your set-up cells again."
        )
        if stuck:
            note = f"Ranks that stayed busy (stuck, typically in a collective):\n{stuck}\n{note}"
        if supervisor.timed_out:
            self._time_out(run, supervisor, restarted=True, note=note)
        if supervisor.interrupted:
            run.abandon(KeyboardInterrupt())
            raise KeyboardInterrupt(f"not every rank returned to idle in time. {note}") from None
        if run.outcome.has_failure():
            error = run.outcome.error()
            error.add_note(note)
            run.fail(error)
        run.end(f"ranks restarted. {note}", Verdict.FAILED)
        raise WorkerError(0, message=note)

    def _time_out(
        self, run: Run, supervisor: Supervisor, *, restarted: bool, note: str = ""
    ) -> None:
        __tracebackhide__ = True
        limit = run.config.timeout or 0.0
        run.end(f"Timed out after {limit:g}s", Verdict.TIMED_OUT)
        kept = "" if restarted else "every rank was interrupted and is idle again; state kept."
        raise TimeoutError(f"the command's timeout={limit:g}s expired; {kept}{note}") from None

    # -- the processes -----------------------------------------------------------------------

    def _require(self) -> _World:
        """The running world; a rank that died since the last command means a new world (said
        in the cell before the command runs)."""
        world = self._holder.world
        if world is None:
            raise SessionError(
                "these warm ranks were stopped. Start new ones with nbtrain.start_ranks(...), "
                "or call ranks.restart()."
            )
        dead = world.group.exited()
        if dead:
            names = ", ".join(
                f"rank {rp.rank} (exit code {rp.process.exitcode})" for rp in dead
            )
            print(
                f"[nbtrain] {names} ended since the last command: restarted the "
                f"{len(self.ranks)} ranks; their state is gone.",
                file=sys.stderr,
            )
            self.restart()
            world = self._holder.world
            assert world is not None
        return world

    def _call_policy(self, on_interrupt: str | None) -> StopPolicy | None:
        """run(..., on_interrupt=...): this call's own policy, with the session's folder, period
        and limit (checked before anything is sent); None: the session's."""
        if on_interrupt is None:
            return None
        options = {**self._stop_options, "on_interrupt": on_interrupt}
        options.update(resume=False, resume_from=None)  # a resume belongs to start_ranks
        policy = build_policy("session", self.config.world_size, **options)
        if policy is None and self.config.stopping is not None:  # "stop" for this call only
            policy = dataclasses.replace(self.config.stopping, on_interrupt=False, resume_from=None)
        return policy

    def _say(self, phase: str) -> None:
        """A start-up phase that may take seconds, in the cell (where start_ranks shows no
        view): 'nbtrain: starting 2 warm ranks: starting Python, importing torch ...'."""
        if self.config.progress is not ProgressMode.OFF:
            print(f"nbtrain: starting {len(self.ranks)} warm ranks: {phase}...", flush=True)

    def _start_world(self) -> None:
        self._failures.forget()  # new processes: no failure's frames
        if self._stop_options:
            policy = build_policy("session", self.config.world_size, **self._stop_options)
            self.config = dataclasses.replace(self.config, stopping=policy)
            if self._stop_options.get("resume"):  # a restart resumes from the newest, if any
                self._stop_options["resume"] = "auto"
            self._stop_options.pop("resume_from", None)
        if self.cluster is not None:
            self._holder.world = _cluster_world(self.config, self.cluster)
            return
        config = self.config
        rendezvous = open_local(config.world_size)
        try:
            specs = _xla_allowed(rank_specs(config, rendezvous))
        except BaseException:
            rendezvous.close()
            raise
        ctx = processes.context(config.start.method)
        pipes = {rank: ctx.Pipe(duplex=False) for rank in self.ranks}  # commands: (read, write)

        def others(rank: int) -> tuple[int, ...]:
            """fork: every other command pipe, and the kernel's own end of the rank's."""
            return tuple(
                fd
                for other, (reader, writer) in pipes.items()
                for fd in ((writer.fileno(),) if other == rank else
                           (reader.fileno(), writer.fileno()))
            )

        def release() -> None:
            for _, writer in pipes.values():
                writer.close()
            rendezvous.close()

        backend = LocalProcesses(
            config.start.method,
            session_entry,
            specs,
            data=lambda rank: pipes[rank][0],
            also_close=others,
            release=release,
            debuggable=True,  # breakpoint() in a rank: a pdb prompt in the cell
            say=self._say,
        )
        try:
            group = _started(backend)
        finally:
            for reader, _ in pipes.values():
                reader.close()  # the ranks' ends: each has its own now
        commands = {rank: writer for rank, (_, writer) in pipes.items()}
        self._holder.world = _World(group, commands)


def _cluster_world(config: LaunchConfig, cluster: RayCluster) -> _World:
    """Warm ranks placed by Ray: each on its node under a rank actor, commands as Ray calls."""
    from nbtrain.kernel.cluster.ray_backend import RayRanks

    backend = RayRanks(config, cluster, None, say=lambda text: None)
    return _World(_started(backend), dict(backend.senders()), backend.named)


def _started(backend: Backend) -> RankGroup:
    """A warm session's rank group, started; closed again if the start fails."""
    group = RankGroup(backend, warm=True)
    try:
        group.start(_drop, failed=lambda: False)
    except BaseException:
        group.close()
        raise
    return group


def _xla_allowed(specs: dict[int, RankSpec]) -> dict[int, RankSpec]:
    """With PJRT_DEVICE set, a warm rank that imports torch_xla takes the XLA device: the
    one-shot CPU path's ACCELERATE_USE_CPU (which would pin its Accelerator to the CPU) is left
    out."""
    if not environment.variables().get("PJRT_DEVICE"):
        return specs
    return {
        rank: dataclasses.replace(
            spec, env={k: v for k, v in spec.env.items() if k != "ACCELERATE_USE_CPU"}
        )
        for rank, spec in specs.items()
    }


def _drop(event: Event) -> None:
    pass


@contextlib.contextmanager
def _results_segments(local: bool) -> Iterator[str | None]:
    """A name prefix for the segments of one command's large values (pulled tensors travel
    through /dev/shm, not the pipe); whatever a rank left under it (killed mid-write, a value
    never loaded) is removed when the command ends. None where there is no /dev/shm, or the
    ranks are not on this machine (``local`` False)."""
    if not (local and sharedmem.available()):
        yield None
        return
    prefix = f"{sharedmem.PREFIX}{os.getpid()}_{secrets.token_hex(6)}_"
    try:
        yield prefix
    finally:
        sharedmem.remove_names(prefix + "*")


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


def _pdb_commands(commands: object) -> list[str] | None:
    if commands is None:
        return None
    if isinstance(commands, str) or not isinstance(commands, (list, tuple)) or not all(
        isinstance(line, str) for line in commands
    ):
        raise TypeError(
            f"debug(commands={commands!r}): give a list of pdb commands, e.g. "
            "ranks.debug(commands=['p loss', 'up', 'p batch.shape'])."
        )
    return list(commands)


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
    this kernel is connected to, as notebook_launcher's (notebooks/guides/cluster.md)."""
    global _current
    # A start that takes seconds says what it waits for (Ranks._say), then how long it took.
    began = time.monotonic()
    config = build_config(
        num_processes=num_processes,
        start_method=start_method,
        mixed_precision=mixed_precision,
        gpu_ids=gpu_ids,
        num_nodes=1,
        node_rank=0,
        rdzv_endpoint=None,
        max_restarts=0,
        timeout=timeout,
        output=output,
        progress=progress,
        return_all=return_all,
        allow_xla=False,
        hang_after=hang_after,
    )
    chosen = None
    if cluster is not None:
        from nbtrain.kernel.cluster import resolve

        given = {"num_processes": num_processes, "start_method": start_method,
                 "gpu_ids": gpu_ids}
        chosen = resolve(cluster, config, given)
    elif start_method == "auto" and config.start.method is StartMethod.FORK:
        config = dataclasses.replace(config, start=_clean_start())
    if not isinstance(replace, bool):
        raise TypeError(f"replace={replace!r} must be True or False.")
    stop_options: dict[str, Any] = {
        "on_interrupt": on_interrupt,
        "checkpoint_every": checkpoint_every,
        "resume": resume,
        "resume_from": resume_from,
        "project_dir": project_dir,
        "total_limit": total_limit,
    }
    if build_policy("session", config.world_size, **stop_options) is None:
        stop_options = {}  # (checked here, before any rank starts: bad input fails now)
    running = _current
    if running is not None and running.running:
        if not replace:
            raise SessionError(
                f"{len(running.ranks)} warm ranks are already running ({running!r}). Stop them "
                "with ranks.stop() first, or pass replace=True to stop them and start new ones."
            )
        running.stop()
    ranks = Ranks(config, stop_options, chosen)
    if config.progress is not ProgressMode.OFF:
        print(f"nbtrain: {config.world_size} warm ranks ready in "
              f"{time.monotonic() - began:.1f}s ({ranks.placed})", flush=True)
    _current = ranks
    return ranks


def _clean_start() -> Any:
    from nbtrain.kernel.config import StartChoice

    if "forkserver" in environment.available_start_methods():
        return StartChoice(
            StartMethod.FORKSERVER,
            "forkserver: warm ranks start clean (the kernel may use CUDA meanwhile)",
        )
    return StartChoice(StartMethod.SPAWN, "spawn: warm ranks start clean")


__all__ = ["Ranks", "SessionError", "current", "start_ranks"]
