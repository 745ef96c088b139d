"""The launch interface (kernel/launch/choose.py): the options as one object
(kernel/options/requested.py), the kind picked in one place, and one ending for every kind
(run.Run.finish), in process too."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from nbtrain import notebook_launcher
from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.launch.choose import build_launch, choose
from nbtrain.kernel.launch.cluster import RayLaunch
from nbtrain.kernel.launch.elastic import ElasticAgent
from nbtrain.kernel.launch.inprocess import InProcess
from nbtrain.kernel.launch.local import LocalRanks
from nbtrain.kernel.launch.xla import XlaOrdinals
from nbtrain.kernel.options.config import LaunchConfig, build_config
from nbtrain.kernel.options.interface import LaunchOptions
from nbtrain.kernel.options.requested import Requested
from nbtrain.kernel.options.stopping import StopOptions
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.events import Exited, Started


def test_requested_has_every_launcher_parameter_with_the_launchers_default():
    """notebook_launcher's signature is public: Requested must take each of its options, with
    the same default, so debug_launcher / nbtrain launch / start_ranks get the same values."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(notebook_launcher).parameters.items()
        # block= says how the call returns (a value, or a run: kernel/run/handle.py), not
        # how the ranks run: no option of Requested
        if name not in ("function", "args", "kwargs", "block")
    }
    fields = {f.name: f for f in dataclasses.fields(Requested) if f.name != "stop"}
    ours = {name: field.default for name, field in fields.items()}
    ours |= {f.name: f.default for f in dataclasses.fields(StopOptions)}
    assert ours == defaults



class _Captured(Exception):
    pass


@pytest.mark.parametrize("entry", ["notebook_launcher", "start_ranks"])
def test_every_parameter_of_an_entry_point_reaches_requested_by_its_name(monkeypatch, entry):
    """The entry points hand their parameters to Requested.of by name: a value given for any
    option arrives in Requested (or its stop options) as given, none is dropped or swapped."""
    from nbtrain.kernel import entry as entry_module
    from nbtrain.kernel.warm import session

    seen: list[Requested] = []
    original = Requested.of.__func__  # type: ignore[attr-defined]

    def capture(cls, given):
        seen.append(original(cls, given))
        raise _Captured

    monkeypatch.setattr(Requested, "of", classmethod(capture))
    function = notebook_launcher if entry == "notebook_launcher" else session.start_ranks
    # the call, how the cell waits for it, and what to do with a running session
    call = ("function", "args", "kwargs", "block", "replace")
    names = [n for n in inspect.signature(function).parameters if n not in call]
    marked = {name: object() for name in names}  # a distinct value for each option
    with pytest.raises(_Captured):
        if entry == "notebook_launcher":
            entry_module.notebook_launcher(print, (), None, **marked)
        else:
            session.start_ranks(**marked)
    requested = seen[0]
    got = {f.name: getattr(requested, f.name) for f in dataclasses.fields(Requested)}
    got |= {f.name: getattr(requested.stop, f.name) for f in dataclasses.fields(StopOptions)}
    assert {name: got[name] for name in names} == marked


def test_requested_of_refuses_a_name_it_does_not_know():
    with pytest.raises(TypeError, match="block"):
        Requested.of({"num_processes": 2, "block": False})
    assert Requested.of({"resume": True}).stop.resume is True

def config(**given: object) -> LaunchConfig:
    values: dict[str, object] = {
        "num_processes": 2, "start_method": "fork", "mixed_precision": None, "gpu_ids": None,
        "num_nodes": 1, "node_rank": 0, "rdzv_endpoint": None, "max_restarts": 0,
        "timeout": None, "output": "all", "progress": "off", "return_all": False,
        "allow_xla": False,
    }
    return build_config(**(values | given))


@pytest.mark.parametrize(
    ("given", "cluster", "elastic", "kind"),
    [
        ({"num_processes": 1}, False, False, InProcess),
        ({"num_processes": 2}, False, False, LocalRanks),
        # gpu_ids= needs a process of its own, even for one rank
        ({"num_processes": 1, "gpu_ids": [0]}, False, False, LocalRanks),
        ({"max_restarts": 1}, False, False, ElasticAgent),
        ({"num_nodes": 2, "rdzv_endpoint": "127.0.0.1:29400"}, False, False, ElasticAgent),
        ({"num_processes": 1}, False, True, ElasticAgent),  # nbtrain launch
        ({"max_restarts": 1}, True, False, RayLaunch),  # a cluster restarts its ranks itself
    ],
)
def test_one_place_picks_the_kind(monkeypatch, given, cluster, elastic, kind):
    from nbtrain.kernel.host import environment

    monkeypatch.setattr(environment, "cuda_device_count", lambda: 1)  # (gpu_ids=[0] exists)
    assert choose(config(**given), cluster=cluster, elastic=elastic) is kind


def test_xla_comes_first_and_refuses_stop_and_resume():
    xla = dataclasses.replace(config(max_restarts=1), xla_device="CPU")
    kind = choose(xla, cluster=False, elastic=True)
    assert kind is XlaOrdinals and kind.no_stop_resume == "on XLA/TPU"
    assert ElasticAgent.no_stop_resume.startswith("through torch's elastic agent")
    assert InProcess.no_stop_resume == LocalRanks.no_stop_resume == ""


def test_the_chooser_returns_the_kind_built_with_its_checked_options():
    launch = build_launch(Requested(num_processes=2, timeout=30, progress="off"), "train")
    assert type(launch) is LocalRanks
    assert launch.options.requested.timeout == 30 and launch.options.config.timeout == 30.0
    assert launch.options.config.stopping is None  # (no stop option asked)


def test_a_kind_refuses_in_its_constructor_before_anything_runs():
    """InProcess's timeout needs SIGALRM in the main thread: refused when built, not run."""
    import threading

    options = LaunchOptions(Requested(timeout=5), config(num_processes=1, timeout=5.0))
    InProcess(options)  # the main thread: built
    caught: list[BaseException] = []

    def build() -> None:
        try:
            InProcess(options)
        except ValueError as exc:
            caught.append(exc)

    thread = threading.Thread(target=build, name="cell-helper")
    thread.start()
    thread.join()
    [error] = caught
    assert "timeout=5" in str(error) and "'cell-helper', not the main thread" in str(error)


# --- one ending ------------------------------------------------------------------------------


def failed_run(in_process: bool) -> tuple[Run, ZeroDivisionError]:
    from nbtrain.rank.failures import failure_event

    run = Run(config(num_processes=1, output="none"), [0], title="t", in_process=in_process)
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError as exc:
        raised = exc
    events = (Started(0, 1, "cpu", "host"), failure_event(0, raised, 1), Exited(0, 1, None, False))
    for event in events:
        run.emit(event)
    return run, raised


def test_the_same_failure_ends_with_the_same_error_in_process_or_not():
    ranks, _ = failed_run(in_process=False)
    with pytest.raises(WorkerError) as of_ranks:
        ranks.finish(Ending(How.FAILED))
    here, raised = failed_run(in_process=True)
    with pytest.raises(WorkerError) as in_process:
        here.finish(Ending(How.FAILED), raised=raised)
    assert str(in_process.value) == str(of_ranks.value)
    assert in_process.value.original is raised  # the exception itself, for %debug
    assert in_process.value.__traceback__ is not None
    summaries = [re.sub(r"[\d.]+s", "", run.state.summary) for run in (ranks, here)]
    assert summaries[0] == summaries[1] and summaries[0].startswith("Failed after")


def test_a_timeout_says_whether_ranks_were_stopped():
    for in_process, said in ((True, "while the function ran in this process"),
                             (False, "every rank was stopped (rank 0: ")):
        run = Run(config(num_processes=1, timeout=3), [0], title="t", in_process=in_process)
        run.emit(Exited(0, None, None, stopped_by_launcher=True))
        with pytest.raises(TimeoutError, match=r"timeout=3\) expired") as info:
            run.finish(Ending(How.TIMED_OUT))
        assert said in str(info.value)


def test_values_in_process_are_the_objects_themselves_and_return_all_is_a_list():
    value = object()  # could not even be pickled as a result
    run = Run(config(num_processes=1, return_all=True), [0], title="t", in_process=True)
    assert run.finish(Ending(How.SUCCEEDED), values={0: value}) == [value]
