"""Post-mortem: the rank's pdb on a failure's frames (rank/debugger.py) over a real pipe to the
kernel's prompt, and the kernel's choices and checks (kernel/group/postmortem.py)."""

from __future__ import annotations

import sys

import pytest
from test_rank_debugger import _in_a_rank, _serve, rank_3  # noqa: F401 (rank_3: a fixture)

from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.group.pdbprompt import Prompts
from nbtrain.kernel.group.postmortem import KeptFailures
from nbtrain.kernel.options.debug import check_debug
from nbtrain.rank import debugger
from nbtrain.rank.failures import failure_event
from nbtrain.shared.errors import SessionError
from nbtrain.shared.events import Paused, Resumed, Status


def _fails(parts: int) -> float:
    total = 10
    return total / parts


@pytest.fixture
def no_last_failure(monkeypatch):
    for name in ("last_type", "last_value", "last_traceback"):
        monkeypatch.delattr(sys, name, raising=False)


def test_a_kept_failure_opens_at_its_frame_with_its_locals(rank_3, no_last_failure):  # noqa: F811
    events, writer = rank_3
    try:
        _fails(0)
    except ZeroDivisionError as exc:
        debugger.keep(exc)
    said: list[str] = []
    answers = iter(["p total, parts", "c"])
    prompts = Prompts({3: writer}, ask=lambda prompt: next(answers), say=said.append)
    prompts.no_input = False
    thread = _in_a_rank(debugger.debug_last)
    _serve(prompts, events, thread)
    pauses = [e for e in events if isinstance(e, Paused)]
    assert "post-mortem of rank 3: ZeroDivisionError: division by zero" in pauses[0].text
    assert "return total / parts" in pauses[0].text
    assert "(10, 0)" in pauses[1].text
    line = _fails.__code__.co_firstlineno + 2
    notes = [e.text for e in events if isinstance(e, Status)]
    assert notes == [f"post-mortem pdb (line {line})"] * 2 + [""]
    # c ends it: the prompt is free (nothing of the failure runs again).
    assert [e.stepping for e in events if isinstance(e, Resumed)] == [False]
    assert prompts.holder is None


def test_no_kept_failure_is_said_with_the_rank(rank_3, no_last_failure):  # noqa: F811
    with pytest.raises(RuntimeError, match="rank 3 has no failure to debug"):
        debugger.debug_last()


def _outcome_of(**failures: BaseException | None) -> Outcome:
    outcome = Outcome([0, 1, 2])
    for name, exc in failures.items():
        rank = int(name[1:])
        if exc is None:
            continue
        try:
            raise exc
        except BaseException as raised:
            if getattr(raised, "bad_input", False):
                raised.__traceback__ = None
            outcome.apply(failure_event(rank, raised, 1))
    return outcome


def test_the_default_is_the_last_failed_commands_root_cause():
    kept = KeptFailures(3)
    with pytest.raises(SessionError, match="no failure to debug"):
        kept.choose()
    kept.record([0, 1, 2], _outcome_of(r2=ValueError("early")))
    assert kept.choose() == 2
    kept.record([0, 1], _outcome_of(r1=KeyError("k")))
    assert kept.choose() == 1 and kept.choose(2) == 2  # rank 2 still holds the earlier one
    with pytest.raises(SessionError, match=r"rank 0 has no failure to debug.*rank 1 \(KeyError"):
        kept.choose(0)
    with pytest.raises(SessionError, match="there is no rank 3; the 3 warm ranks are 0-2"):
        kept.choose(3)
    with pytest.raises(TypeError, match=r"ranks.debug\('1'\): give a rank number"):
        kept.choose("1")
    kept.forget()  # new ranks
    with pytest.raises(SessionError, match="no failure to debug"):
        kept.choose()


def test_bad_input_keeps_no_frames():
    error = NameError("rank 0 has no name 'x'")
    error.bad_input = True  # type: ignore[attr-defined]
    kept = KeptFailures(3)
    kept.record([0], _outcome_of(r0=error))
    assert kept.kept == {}


def test_debug_is_checked_before_anything_starts():
    with pytest.raises(TypeError, match=r"debug='yes' must be True or False"):
        check_debug("yes")
    assert check_debug(False, cluster="ray") is False
    with pytest.raises(ValueError, match="debug=True with cluster='ray'"):
        check_debug(True, cluster="ray")
    with pytest.raises(ValueError, match="XLA ordinals have no debugger channel"):
        check_debug(True, xla=True)
    assert not sys.stdin.isatty()  # (pytest's stdin)
    with pytest.raises(ValueError, match="debug=True: this run has no input to type pdb"):
        check_debug(True)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught  # (with its traceback: a frame pdb could open)


def test_debug_true_opens_no_prompt_for_a_peer_loss_or_an_interrupt(rank_3):  # noqa: F811
    events, _ = rank_3
    lost = _raised(RuntimeError("Connection closed by peer [127.0.0.1]:29500 (gloo)"))
    debugger.after_failure(lost, failure_event(3, lost, 1))
    interrupted = _raised(KeyboardInterrupt())
    debugger.after_failure(interrupted, failure_event(3, interrupted, 1))
    assert events == []  # no pause: the rank exits at once


def test_commands_given_in_advance_answer_the_prompt_then_c(rank_3, no_last_failure):  # noqa: F811
    events, writer = rank_3
    try:
        _fails(0)
    except ZeroDivisionError as exc:
        debugger.keep(exc)
    said: list[str] = []
    prompts = Prompts({3: writer}, ask=lambda prompt: "never asked", say=said.append)
    prompts.no_input = True  # (nobody could type: a notebook run by nbclient)
    with prompts.scripted(["p parts"]):
        _serve(prompts, events, _in_a_rank(debugger.debug_last))
    assert said[1:] == ["(Pdb) rank 3> p parts", "0", "(Pdb) rank 3> c"]
    assert prompts.no_input  # as it was


def test_commands_must_be_a_list_of_strings():
    from nbtrain.kernel.warm.debugging import pdb_commands as _pdb_commands

    with pytest.raises(TypeError, match=r"debug\(commands='p x'\): give a list of pdb commands"):
        _pdb_commands("p x")
