"""Run a patch when a module is first imported, so a rank pays for no import it never uses.

A rank adapts tqdm and IPython's display functions (notebook.py, tqdm_bridge.py), but importing
them costs 20-250 ms per rank per launch. ``when_imported(name, patch)`` patches at once if the
module is loaded, else when the user's code first imports it (a finder on ``sys.meta_path`` that
wraps the module's loader, once).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Patch = Callable[[ModuleType], None]


def when_imported(name: str, patch: Patch) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    sys.meta_path.insert(0, _Watch(name, patch))


class _Watch(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch: Patch) -> None:
        self.name = name
        self.patch = patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; the real finders do the finding
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Patched(spec.loader, self.patch)
        return spec


class _Patched(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Patch) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)
