"""kernel/group/outorder.py: a rank's lines and displays, read from three pipes in any order,
come out in the order the rank made them."""

from __future__ import annotations

import pytest

from nbtrain.kernel.group import outorder
from nbtrain.kernel.group.outorder import OutputOrder
from nbtrain.shared.events import Display, Output
from nbtrain.shared.lines import mark_line, parse_mark


def out(stream: str, text: str) -> Output:
    return Output(0, stream, text)


def mark(number: int, stream: str = "stdout") -> Output:
    return Output(0, stream, mark_line(number).rstrip("\n"))


def names(emitted: list) -> list[str]:
    return [e.line if isinstance(e, Output) else f"display {e.mark}" for e in emitted]


def display(number: int) -> Display:
    return Display(0, {"text/plain": str(number)}, {}, mark=number)


def test_lines_printed_after_a_display_wait_for_it() -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    # print A; display 1; print B; all of stdout is read before the events pipe.
    for line in (out("stdout", "A"), mark(1), out("stdout", "B")):
        order.line(0, line)
    order.line(0, mark(1, "stderr"))
    assert names(emitted) == ["A"]
    order.display(0, display(1))
    assert names(emitted) == ["A", "display 1", "B"]


def test_a_display_read_before_the_lines_printed_ahead_of_it_waits_for_them() -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    order.display(0, display(1))
    order.display(0, display(2))
    order.line(0, out("stderr", "warning"))
    for line in (mark(1, "stderr"), mark(2, "stderr")):
        order.line(0, line)
    for line in (out("stdout", "A"), mark(1), out("stdout", "B"), mark(2), out("stdout", "C")):
        order.line(0, line)
    assert names(emitted) == ["warning", "A", "display 1", "B", "display 2", "C"]


def test_processes_do_not_wait_for_each_other_and_unmarked_displays_go_at_once() -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    order.line(0, mark(1))
    order.line(1, Output(1, "stdout", "other rank"))
    order.display(1, Display(1, {}, {}))
    assert [type(e).__name__ for e in emitted] == ["Output", "Display"]


def test_a_mark_that_never_comes_holds_nothing_for_long(monkeypatch: pytest.MonkeyPatch) -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    order.display(0, display(1))  # the rank's fd 1 went elsewhere: no mark will come
    order.expire()
    assert emitted == []
    monkeypatch.setattr(outorder, "PATIENCE", 0.0)
    order.expire()
    assert names(emitted) == ["display 1"]
    order.line(0, mark(1))  # late: dropped, the stream does not wait
    order.line(0, out("stdout", "after"))
    assert names(emitted) == ["display 1", "after"]


def test_release_lets_everything_through_in_order() -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    for line in (mark(1), out("stdout", "B"), mark(2), out("stdout", "C")):
        order.line(0, line)
    order.display(0, display(2))
    order.release()
    assert names(emitted) == ["B", "display 2", "C"]


def test_mark_lines_are_recognised_and_nothing_else_is() -> None:
    assert parse_mark(mark_line(12).rstrip("\n")) == ("", 12)
    assert parse_mark("nbtrain-display-mark 12") == ("nbtrain-display-mark 12", None)


def test_a_partial_line_before_a_display_is_shown_before_it() -> None:
    emitted: list = []
    order = OutputOrder(emitted.append)
    # print("loading...", end=""); display(...): the mark ends the rank's unfinished line.
    order.line(0, Output(0, "stdout", "loading..." + mark_line(1).rstrip("\n")))
    order.line(0, mark(1, "stderr"))
    order.display(0, display(1))
    assert names(emitted) == ["loading...", "display 1"]
