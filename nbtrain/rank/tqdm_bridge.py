"""tqdm in a rank drives that rank's row of the live view, and draws nothing itself.

Training code creates ``tqdm(...)`` bars from ``tqdm``, ``tqdm.auto``, ``tqdm.notebook`` or
``tqdm.rich`` (Hugging Face's Trainer and Accelerate's tutorials do). In a rank none of them can
draw: ``tqdm.notebook`` builds widgets whose comm messages a forked rank would send over the
kernel's own sockets, and the others write carriage-return text. So, in a rank only, a bar of any
of those classes is made as a ``RankTqdm`` instead: tqdm's own counting, rate and ``set_*``
methods, with its display going to nbtrain's progress reporting (``open_bar``: step, total,
description; nested bars show as outer loops).

Libraries make their bars as subclasses of a front end (``huggingface_hub``'s and ``datasets``'
``tqdm`` subclass ``tqdm.auto.tqdm``, which in a forked rank is the kernel's notebook bar: left
alone, each built a widget that cannot work from a rank and left a dead "0%" line in the cell).
Such a subclass, from outside tqdm (a library's or the user's), keeps its own methods and takes
the rank's bar as its base in place of the front end: its ``__bases__`` are changed in this rank's
copy of the class, so ``isinstance``, ``super()`` and its own ``__init__`` work as they did.
tqdm's own other bars (``tqdm.gui``, ``tqdm.contrib``'s) are left alone.

Installed by the rank at start (``install``); outside a launch tqdm behaves as usual.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import numbers
import sys
from types import ModuleType
from typing import Any

from nbtrain.rank import imports
from nbtrain.rank.reporting import ProgressHandle, log, open_bar

# tqdm's front ends: a bar made from one of these classes becomes a RankTqdm in a rank.
FRONTENDS = {"tqdm.std", "tqdm.notebook", "tqdm.rich", "tqdm.asyncio", "tqdm.auto",
             "tqdm.autonotebook", "tqdm._tqdm", "tqdm"}
NOT_FOR_STD = ("display", "options")  # keyword arguments only the notebook / rich bars take


class _Discard(io.StringIO):
    """Where a RankTqdm's own text goes: nowhere (its state goes to the live view)."""

    def write(self, text: str) -> int:
        return len(text)


def install() -> None:
    """Route every tqdm front end's bars in this process to the live view, from when tqdm is
    imported (at once if it already is)."""
    imports.when_imported("tqdm.std", _patch)
    imports.when_imported("transformers.trainer", lambda module: _plain_trainer_progress())


def _patch(std: ModuleType) -> None:
    if getattr(std.tqdm, "_nbtrain_original_new", None) is not None:
        return  # already installed (a forked child of a rank)
    original_new = std.tqdm.__new__
    ranked = _RankClasses(_rank_class(std.tqdm))

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if issubclass(cls, ranked.plain):  # a rank bar, or a subclass rebased onto one
            return original_new(cls, *args, **kwargs)
        if cls.__module__ not in FRONTENDS:
            ranked.rebase(cls)  # a library's (or the user's) subclass of a front end
            return original_new(cls, *args, **kwargs)
        bar = original_new(ranked.instead_of(cls))
        if not isinstance(bar, cls):  # Python calls __init__ only for instances of cls
            bar.__init__(*args, **kwargs)
        return bar

    std.tqdm._nbtrain_original_new = original_new
    std.tqdm.__new__ = staticmethod(__new__)


class _RankClasses:
    """The rank's bar classes: ``plain``, and (made when first needed) one that keeps
    ``tqdm.asyncio``'s ``async for``, for front ends that have it (``tqdm.auto.tqdm`` does)."""

    def __init__(self, plain: type) -> None:
        self.plain = plain
        self._asynchronous: type | None = None

    def instead_of(self, front_end: type) -> type:
        asyncio = sys.modules.get("tqdm.asyncio")
        if asyncio is None or not issubclass(front_end, asyncio.tqdm_asyncio):
            return self.plain
        if self._asynchronous is None:
            self._asynchronous = type("RankTqdm", (self.plain, asyncio.tqdm_asyncio), {})
            self._asynchronous.__module__ = __name__
        return self._asynchronous

    def rebase(self, cls: type) -> None:
        """Each class in ``cls``'s ancestry made outside tqdm whose base is a front end takes
        the rank's bar as its base instead (not possible: left as it is, as tqdm draws it)."""
        for klass in cls.__mro__:
            if klass.__module__.partition(".")[0] == "tqdm" or klass is object:
                continue
            bases = [self.instead_of(base) if base.__module__ in FRONTENDS else base
                     for base in klass.__bases__]
            if bases == list(klass.__bases__):
                continue
            # (a base another one derives from goes: the order would be inconsistent)
            kept = [base for base in dict.fromkeys(bases)
                    if not any(other is not base and issubclass(other, base) for other in bases)]
            with contextlib.suppress(TypeError):  # a layout Python cannot swap
                klass.__bases__ = tuple(kept)


def _rank_class(base: type) -> type:
    class RankTqdm(base):
        """A tqdm bar whose display is this rank's row in the live view."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for name in NOT_FOR_STD:
                kwargs.pop(name, None)
            kwargs["file"] = _Discard()
            self._nbtrain_bar: ProgressHandle | None = None
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if self.disable:
                return True
            bar = self._nbtrain_bar
            if bar is None:
                bar = self._nbtrain_bar = open_bar(self.total, self.desc or None)
            bar.update_to(int(self.n))
            return True

        def set_postfix(self, ordered_dict: Any = None, refresh: bool = True,
                        **kwargs: Any) -> None:
            """tqdm's postfix (``set_postfix(loss=...)``): its numbers are logged too, at the
            bar's step, so they show in the rank's row and chart like ``nbtrain.log``'s."""
            super().set_postfix(ordered_dict, refresh=refresh, **kwargs)
            values = {**dict(ordered_dict or {}), **kwargs}
            found = {str(name): number for name, value in values.items()
                     if (number := _number(value)) is not None}
            if found and not self.disable:
                log(found, step=int(self.n))

        def close(self) -> None:
            if self.disable:
                return
            bar = self._nbtrain_bar
            super().close()
            if bar is None:
                bar = open_bar(self.total, self.desc or None)
            bar.update_to(int(self.n))
            bar.close(complete=self.total is None or self.n >= self.total)
            self._nbtrain_bar = None

    RankTqdm.__module__ = __name__
    RankTqdm.__qualname__ = "RankTqdm"
    return RankTqdm


def _number(value: Any) -> float | None:
    """A postfix value as a float when it is one number (int, float, NumPy or one-element
    tensor); None for text and anything else."""
    if isinstance(value, (bool, str, bytes)):
        return None
    if isinstance(value, numbers.Real) or getattr(value, "numel", lambda: 0)() == 1:
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def _plain_trainer_progress() -> None:
    """Transformers' Trainer picks its HTML notebook progress callback when it believes it runs
    in a notebook (a forked rank still holds the kernel's shell): in a rank, its tqdm callback,
    which feeds the view through this bridge, serves instead."""
    for name in ("transformers.utils", "transformers.utils.import_utils"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "is_in_notebook"):
            setattr(module, "is_in_notebook", _not_a_notebook)  # noqa: B010
    trainer = sys.modules.get("transformers.trainer")
    if trainer is not None:
        callbacks = importlib.import_module("transformers.trainer_callback")
        setattr(trainer, "DEFAULT_PROGRESS_CALLBACK", callbacks.ProgressCallback)  # noqa: B010


def _not_a_notebook() -> bool:
    return False
