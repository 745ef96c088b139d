"""The launch interface types: what a launch runs (``UserCall``) and what each kind of launch
implements (``Launch``). The kinds live in launch/; they import these types from here, below
them, so no kind needs the chooser that sits above them.

A kind (``Launch``) runs a launch whose options were checked (``LaunchOptions``):

    no_stop_resume                  where on_interrupt= / checkpoint_every= / resume= do not
                                    run yet, in the refusal's words ("" where they do)
    no_background                   where block=False does not run yet, likewise
    check(options)                  what this kind refuses, before anything starts
    run(options, call)              start the ranks, watch them, end: the cell's value
                                    (``call``: the user's function and arguments, checked)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.requested import Requested


class UserCall(NamedTuple):
    """What a launch runs: ``function(*args, **kwargs)`` (function.check_function checked it);
    a tuple, so ``prepare_call(*call, method)`` takes it as it is."""

    function: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]


class Launch(Protocol):
    """One kind of launch (see the module docstring)."""

    @property
    def no_stop_resume(self) -> str:
        """Where stop and resume do not run yet (an error's words), "" where they do."""
        ...

    @property
    def no_background(self) -> str:
        """Where ``block=False`` does not run yet (an error's words), "" where it does."""
        ...

    def check(self, options: LaunchOptions) -> None:
        """Refuse what this kind cannot do with these options, before anything starts."""
        ...

    def run(self, options: LaunchOptions, call: UserCall) -> Any:
        """Run ``call`` on the ranks: the value the launch returns."""
        ...


@dataclass(frozen=True)
class LaunchOptions:
    """A launch's options, checked: what its kind runs with."""

    requested: Requested  # as passed (the values errors quote)
    config: LaunchConfig  # checked, with the stop policy and debug
    launch: Launch  # the kind that runs it (launch/choose.py)


__all__ = ["Launch", "LaunchOptions", "UserCall"]
