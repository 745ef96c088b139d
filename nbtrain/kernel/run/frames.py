"""A failed run's exception, kept by ``nbtrain.runs()`` without the frames of the failed call.

A traceback holds every frame it passed through, and each frame its locals: the user's model and
batches (a launch in this process), the launch's options and the call's arguments (any launch).
A run in the registry lives until it is dropped, so what it keeps of its error must not hold them.
What the user needs of a failed run stays: the error's type, message and attributes
(``WorkerError``'s rank, remote traceback...) and its traceback as text.
"""

from __future__ import annotations

import copy
import traceback

__all__ = ["again", "detached", "formatted", "let_go"]


def formatted(error: BaseException) -> str:
    """``error``'s traceback (with its causes) as the cell prints it, as text."""
    return "".join(traceback.format_exception(error))


def let_go(error: BaseException) -> None:
    """Clear the locals of every finished frame in ``error``'s tracebacks (its causes' and its
    context's too). The traceback still prints (file, line, code are kept); frames still
    running (the caller's) are left as they are."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        original = getattr(current, "original", None)  # WorkerError: the exception itself
        todo += [current.__cause__, current.__context__]
        if isinstance(original, BaseException):
            todo.append(original)


def detached(error: BaseException) -> BaseException:
    """A copy of ``error`` (same type, message and attributes) with no traceback, cause or
    context: the original keeps its frames for the cell's %debug, the copy holds none."""
    try:
        kept = copy.copy(error)
    except Exception:  # a type that cannot be rebuilt from its args: its type and message
        kept = RuntimeError(f"{type(error).__name__}: {error}")
    kept.__traceback__ = kept.__cause__ = kept.__context__ = None
    original = getattr(kept, "original", None)
    if isinstance(original, BaseException) and original is not error:
        kept.original = detached(original)  # type: ignore[attr-defined]
    elif original is error:
        kept.original = None  # type: ignore[attr-defined]
    return kept


def again(error: BaseException) -> BaseException:
    """``error`` to raise once more (``run.wait()``): a copy with the same traceback, cause and
    context, so that the frames the raise passes through (the waiting cell's, a function's
    that waits) join the copy's traceback, never the one the run keeps. A type that cannot be
    copied is raised as it is."""
    try:
        copied = copy.copy(error)
    except Exception:
        return error
    copied.__cause__, copied.__context__ = error.__cause__, error.__context__
    copied.__suppress_context__ = error.__suppress_context__
    return copied.with_traceback(error.__traceback__)
