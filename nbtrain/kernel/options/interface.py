"""The launch interface types: what a launch runs (``UserCall``), a launch's checked options
(``LaunchOptions``), and what each kind of launch implements (``LaunchKind``, ``Launch``). The
kinds live in launch/; they import these types from here, below them, so no kind needs the
chooser that sits above them.

A kind is built with the options it runs (as Lightning's launchers are), and checks them then,
before anything starts; its class says what it cannot do, read before it is built:

    Kind.no_stop_resume             where on_interrupt= / checkpoint_every= / resume= do not
                                    run yet, in the refusal's words ("" where they do)
    Kind.no_background              where block=False does not run yet, likewise
    Kind(options)                   the kind with these options: what it refuses is raised here
    kind.options                    those options (what the cell's run reads: stop policy, claims)
    kind.run(call)                  start the ranks, watch them, end: the cell's value
                                    (``call``: the user's function and arguments, checked)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.options.requested import Requested


class UserCall(NamedTuple):
    """What a launch runs: ``function(*args, **kwargs)`` (function.check_function checked it);
    a tuple, so ``prepare_call(*call, method)`` takes it as it is."""

    function: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class LaunchOptions:
    """A launch's options, checked: what its kind is built with."""

    requested: Requested  # as passed (the values errors quote)
    config: LaunchConfig  # checked, with the stop policy and debug


class Launch(Protocol):
    """One kind of launch, built with its options (see the module docstring)."""

    no_stop_resume: ClassVar[str]
    no_background: ClassVar[str]
    options: LaunchOptions

    def run(self, call: UserCall) -> Any:
        """Run ``call`` on the ranks: the value the launch returns."""
        ...


class LaunchKind(Protocol):
    """A kind's class: what it cannot do, and how it is built (see the module docstring)."""

    @property  # (read-only: a kind's ClassVar matches it)
    def no_stop_resume(self) -> str: ...

    def __call__(self, options: LaunchOptions) -> Launch:
        """The kind with ``options``; raises what it refuses, before anything starts."""
        ...


__all__ = ["Launch", "LaunchKind", "LaunchOptions", "UserCall"]
