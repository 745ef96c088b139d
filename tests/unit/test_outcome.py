"""The root-cause rule with explicit ranks and times."""

from __future__ import annotations

from nbtrain.kernel.group.outcome import Outcome
from nbtrain.rank.payload import pack_result
from nbtrain.shared.events import Exited, Failed, Finished, Output
from nbtrain.shared.serialization import pack_exception


def failed(rank, t, *, collateral=False, type_name="ValueError", message="boom"):
    return Failed(rank, type_name, message, "Traceback...", None, 1, collateral, time=t)


def test_first_failure_in_time_wins():
    outcome = Outcome([0, 1, 2])
    outcome.apply(failed(2, 10.5))
    outcome.apply(failed(1, 10.0))
    assert outcome.root_cause() == 1


def test_peer_loss_never_beats_a_real_failure_even_if_earlier():
    outcome = Outcome([0, 1])
    outcome.apply(
        failed(
            0,
            9.0,
            collateral=True,
            type_name="DistBackendError",
            message="Connection closed by peer",
        )
    )
    outcome.apply(Exited(1, -9, "SIGKILL", stopped_by_launcher=False, time=9.5))
    assert outcome.root_cause() == 1
    error = outcome.error()
    assert error.signal == "SIGKILL" and error.rank == 1
    # Rank 0 ended because rank 1 died, as a rank the launcher stopped would have (which came
    # first is a race): counted with them, its own line kept in lost_peer, not in the summary.
    assert str(error) == "rank 1 was killed by signal SIGKILL\n  1 other rank was stopped"
    assert error.lost_peer == {0: "DistBackendError: Connection closed by peer"}
    assert error.other_failures == {} and error.stopped == 1


def test_ranks_stopped_by_the_launcher_are_not_failures():
    outcome = Outcome([0, 1])
    outcome.apply(failed(1, 1.0))
    outcome.apply(Exited(1, 1, None, stopped_by_launcher=False))
    outcome.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True))
    assert outcome.failed_ranks() == [1]
    assert outcome.all_exited and outcome.has_failure()
    error = outcome.error()
    assert error.stopped == 1 and str(error).endswith("\n  1 other rank was stopped")


def test_failures_are_known_as_events_come_and_go():
    # has_failure() is kept as events arrive (the watch loop asks it every pass): a rank that
    # exits badly fails, and one whose later report explains the exit stops failing.
    outcome = Outcome([0, 1, 2])
    assert not outcome.has_failure() and not outcome.all_exited
    outcome.apply(Exited(2, 0, None, stopped_by_launcher=False))
    assert outcome.has_failure() and outcome.failed_ranks() == [2]  # exit 0 without a result
    outcome.apply(Finished(2, pack_result(None)))
    assert not outcome.has_failure()
    outcome.apply(Exited(2, 0, None, stopped_by_launcher=False))  # (a second exit counts once)
    outcome.apply(failed(0, 1.0))
    outcome.apply(Exited(0, 1, None, stopped_by_launcher=False))
    outcome.apply(Exited(1, -15, "SIGTERM", stopped_by_launcher=True))
    assert outcome.all_exited and outcome.failed_ranks() == [0]
    assert outcome.error().stopped == 1  # rank 1; rank 2 had returned


def test_exit_zero_without_result_is_a_failure():
    outcome = Outcome([0])
    outcome.apply(Exited(0, 0, None, stopped_by_launcher=False))
    assert outcome.has_failure()
    assert "os._exit(0)" in str(outcome.error())


def test_fatal_signal_gets_the_faulthandler_dump_as_traceback():
    outcome = Outcome([0])
    for line in ["noise", "Fatal Python error: Segmentation fault", "", '  File "x.py", line 3']:
        outcome.apply(Output(0, "stderr", line))
    outcome.apply(Exited(0, -11, "SIGSEGV", stopped_by_launcher=False))
    error = outcome.error()
    assert error.remote_traceback.startswith("Fatal Python error: Segmentation fault")
    assert "x.py" in error.remote_traceback


def test_results_and_original_exception_round_trip():
    outcome = Outcome([0, 1])
    outcome.apply(Finished(0, pack_result({"w": [1, 2]})))
    assert outcome.results() == {0: {"w": [1, 2]}}
    err = ValueError("bad")
    outcome.apply(Failed(1, "ValueError", "bad", "tb", pack_exception(err), 1, False))
    outcome.apply(Exited(1, 1, None, stopped_by_launcher=False))
    original = outcome.error().original
    assert isinstance(original, ValueError) and str(original) == "bad"


def test_collateral_only_failures_still_fail_the_launch():
    """Every rank reporting a lost connection (gloo never connected) is a failure, not success."""
    outcome = Outcome([0, 1])
    message = "Connection closed by peer"
    outcome.apply(failed(0, 2.0, collateral=True, type_name="RuntimeError", message=message))
    outcome.apply(failed(1, 1.0, collateral=True, type_name="RuntimeError", message=message))
    outcome.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True))
    outcome.apply(Exited(1, -15, "SIGTERM", stopped_by_launcher=True))
    assert outcome.has_failure()
    assert outcome.root_cause() == 1


def test_a_long_faulthandler_dump_is_kept_whole():
    """A deep stack must not push the header and the crashing frame out of the stderr tail."""
    outcome = Outcome([0])
    outcome.apply(Output(0, "stderr", "Fatal Python error: Segmentation fault"))
    outcome.apply(Output(0, "stderr", '  File "model.py", line 7 in crash_here'))
    for i in range(500):
        outcome.apply(Output(0, "stderr", f'  File "deep.py", line {i} in level_{i}'))
    outcome.apply(Exited(0, -11, "SIGSEGV", stopped_by_launcher=False))
    dump = outcome.error().remote_traceback
    assert dump.startswith("Fatal Python error: Segmentation fault")
    assert "crash_here" in dump and "level_499" in dump


def test_a_failure_raised_after_the_launchers_stop_request_is_no_failure():
    """A SIGTERM handler that raises (after a timeout, or a peer's failure): the stop's doing."""
    outcome = Outcome([0, 1])
    stopped = Failed(0, "RuntimeError", "got SIGTERM", "tb", None, 1, True, after_stop=True)
    outcome.apply(stopped)
    outcome.apply(Exited(0, 1, None, stopped_by_launcher=False, stop_requested=True))
    assert not outcome.has_failure()
    outcome.apply(failed(1, 0.5))
    outcome.apply(Exited(1, 1, None, stopped_by_launcher=False))
    assert outcome.root_cause() == 1 and outcome.error().other_failures == {}


def test_a_result_the_kernel_cannot_load_names_the_rank_the_type_and_the_fix():
    import pickle
    import sys
    import types

    import pytest

    from nbtrain.shared.errors import ResultError

    module = types.ModuleType("only_in_the_rank")
    exec("class Weights:\n    pass\n", module.__dict__)
    sys.modules["only_in_the_rank"] = module
    try:
        data = pickle.dumps({"weights": module.Weights()})
    finally:
        del sys.modules["only_in_the_rank"]
    outcome = Outcome([0, 1])
    outcome.apply(Finished(0, pack_result("fine")))
    outcome.apply(Finished(1, data))
    with pytest.raises(ResultError) as info:
        outcome.results()
    assert info.value.rank == 1 and info.value.type_name == "only_in_the_rank.Weights"
    assert "rank 1 returned an object of type only_in_the_rank.Weights" in str(info.value)
    assert "state_dict" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).rank == 1


def test_a_frame_boundary_between_module_and_name_still_names_the_class():
    """Pickles over 64 KiB are cut into frames; a FRAME opcode may fall between the module and
    the name that STACK_GLOBAL takes: it pushes nothing."""
    import pickle
    import struct

    from nbtrain.shared.serialization import unloadable_global

    def frame(body: bytes) -> bytes:
        return b"\x95" + struct.pack("<Q", len(body)) + body

    def short(text: str) -> bytes:
        return b"\x8c" + bytes([len(text)]) + text.encode()

    data = (
        b"\x80\x04"  # PROTO 4
        + frame(short("only_in_the_rank") + b"\x94")  # module name, MEMOIZE
        + frame(short("Weights") + b"\x94" + b"\x93" + b"\x94" + b")\x81." )
    )  # name, MEMOIZE, STACK_GLOBAL, MEMOIZE, EMPTY_TUPLE, NEWOBJ, STOP
    assert unloadable_global(data) == "only_in_the_rank.Weights"
    assert unloadable_global(pickle.dumps([1, "two"], protocol=4)) is None


def test_only_the_collectives_transport_errors_count_as_a_lost_peer():
    from nbtrain.rank.failures import is_collateral

    lost = [
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                     "peer [127.0.0.1]:40123"),
        RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed "
                     "out waiting 1800000ms for recv operation to complete"),
        RuntimeError("NCCL communicator was aborted on rank 1."),
        type("DistBackendError", (RuntimeError,), {})("anything"),
    ]
    own = [
        TimeoutError("timed out"),
        RuntimeError("request timed out after 3 retries"),
        ConnectionRefusedError(111, "Connection refused"),
        RuntimeError("database: connection refused"),
        OSError("Connection reset by peer"),
        ValueError("connection closed by peer"),
    ]
    assert [is_collateral(exc) for exc in lost] == [True] * len(lost)
    assert [is_collateral(exc) for exc in own] == [False] * len(own)


def test_ranks_that_raised_the_same_error_are_not_called_its_consequence():
    outcome = Outcome([0, 1, 2])
    outcome.apply(failed(0, 1.0, message="bad value 1"))
    outcome.apply(failed(1, 1.1, message="bad value 1"))
    outcome.apply(failed(2, 1.2, collateral=True, type_name="ConnectionError", message="peer"))
    text = str(outcome.error())
    assert text.splitlines() == [
        "rank 0 failed with ValueError: bad value 1",
        "  rank 1 raised the same error",
        "  1 other rank was stopped",
    ]


def test_a_different_error_of_its_own_is_still_listed_as_a_consequence():
    outcome = Outcome([0, 1, 2])
    outcome.apply(failed(0, 1.0, message="bad value 1"))
    outcome.apply(failed(1, 1.1, type_name="OSError", message="disk full"))
    outcome.apply(Exited(2, -15, "SIGTERM", stopped_by_launcher=True))
    assert str(outcome.error()).splitlines() == [
        "rank 0 failed with ValueError: bad value 1",
        "  then, as a consequence: rank 1: OSError: disk full",
        "  1 other rank was stopped",
    ]


def test_a_long_error_cut_in_the_summary_still_counts_as_the_same():
    long = "x" * 500
    outcome = Outcome([0, 1])
    outcome.apply(failed(0, 1.0, message=long))
    outcome.apply(failed(1, 1.1, message=long))
    assert str(outcome.error()).splitlines()[1] == "  rank 1 raised the same error"


def test_torch_distributed_used_before_a_process_group_says_what_to_do() -> None:
    import torch.distributed as dist

    from nbtrain.rank.failures import NO_GROUP_HINT, failure_event

    assert not dist.is_initialized()
    try:
        dist.get_rank()
    except (ValueError, RuntimeError) as exc:
        event = failure_event(0, exc, 1)
    else:  # pragma: no cover - torch changed: the test must notice
        raise AssertionError("get_rank() without a process group did not raise")
    assert NO_GROUP_HINT in event.traceback
    assert "nbtrain.Accelerator()" in NO_GROUP_HINT
