"""Every public name has a docstring that says what it does and names each of its parameters;
the entry points also say what they raise. Walks the real objects, as ``help()`` and the API
reference (.ci/docs_site.py) read them: ``nbtrain.__all__``, the Accelerator's public members
(its mixins' too), ``nbtrain.utils``, ``nbtrain.tracking``, and the warm ranks' handle."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from typing import Any

import nbtrain
import nbtrain.tracking
import nbtrain.utils

ENTRY_POINTS = ("notebook_launcher", "debug_launcher", "start_ranks", "Accelerator")


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """A class's public members as defined (a property's getter, a static method's function)."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            yield f"{cls.__qualname__}.{name}", member


def public_names() -> Iterator[tuple[str, Any]]:
    for module in (nbtrain, nbtrain.utils, nbtrain.tracking):
        for name in module.__all__:
            if name != "__version__":
                yield f"{module.__name__}.{name}", getattr(module, name)
    yield from members(nbtrain.Accelerator)
    yield from members(typing.get_type_hints(nbtrain.start_ranks)["return"])  # the handle


def parameters(obj: Any) -> list[str]:
    """The parameters a caller names (not self, *args, **kwargs or private ones)."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    if target is object.__init__:
        return []
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    named = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        p.name for p in signature.parameters.values()
        if p.kind not in named and p.name not in ("self", "cls") and not p.name.startswith("_")
    ]  # fmt: skip


def problems(name: str, obj: Any) -> list[str]:
    doc = inspect.getdoc(obj) if inspect.isclass(obj) else (obj.__doc__ or "")
    if not (doc or "").strip():
        return [f"{name} has no docstring"]
    found = [
        f"{name}'s docstring does not name its parameter {parameter!r}"
        for parameter in parameters(obj)
        if not re.search(rf"\b{re.escape(parameter)}\b", doc)
    ]
    if name.split(".")[-1] in ENTRY_POINTS and ":raises" not in doc:
        found.append(f"{name}'s docstring does not say what it raises (:raises X: when)")
    return found


def test_every_public_name_says_what_it_does_and_names_its_parameters():
    found = [problem for name, obj in public_names() for problem in problems(name, obj)]
    assert not found, "\n".join(found)


def test_the_check_finds_a_missing_docstring_or_parameter():
    def bare(x):
        pass

    def half(alpha, beta):
        """Uses ``alpha`` only."""

    def notebook_launcher(function):
        """Runs ``function``."""

    assert problems("bare", bare) == ["bare has no docstring"]
    assert problems("half", half) == ["half's docstring does not name its parameter 'beta'"]
    assert problems("notebook_launcher", notebook_launcher) == [
        "notebook_launcher's docstring does not say what it raises (:raises X: when)"
    ]


def test_the_walk_reaches_every_kind_of_public_name():
    names = {name for name, _ in public_names()}
    assert {"nbtrain.notebook_launcher", "nbtrain.utils.gather", "nbtrain.tracking.GeneralTracker",
            "Accelerator.progress", "Accelerator.device", "Accelerator.save_state",
            "Ranks.run_cell", "Ranks.running"} <= names  # fmt: skip
    assert len([name for name in names if name.startswith("Accelerator.")]) >= 70
