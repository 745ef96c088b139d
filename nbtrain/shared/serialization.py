"""Packing the user's function and arguments for the ranks, and results for the kernel.

cloudpickle pickles notebook-defined functions, lambdas, closures and classes by value, so the
same payload works under fork, forkserver and spawn.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import io
import pickle
import pickletools
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from nbtrain.shared import sharedmem


class PayloadError(TypeError):
    """The function or its arguments cannot be sent to the ranks."""


def _describe(obj: object) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


Chain = list[tuple[str, object]]  # (path, object) from the argument down to the culprit


def _find_unpicklable(obj: object, path: str, depth: int = 0) -> Chain | None:
    """Walk containers, attributes and closure cells to name the innermost culprit."""
    try:
        cloudpickle.dumps(obj)
        return None
    except Exception:
        pass
    if depth < 6:
        for child_path, child in _children(obj, path):
            found = _find_unpicklable(child, child_path, depth + 1)
            if found:
                return [(path, obj), *found]
    return [(path, obj)]


def _children(obj: object, path: str) -> list[tuple[str, object]]:
    if isinstance(obj, dict):
        return [(f"{path}[{key!r}]", value) for key, value in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", value) for i, value in enumerate(obj)]
    if inspect.ismethod(obj):  # notebook_launcher(trainer.fit): the trainer travels too
        return [(f"{path}.__self__", obj.__self__), (path, obj.__func__)]
    closure = getattr(obj, "__closure__", None)
    if closure:
        names = obj.__code__.co_freevars  # type: ignore[attr-defined]
        cells = zip(names, closure, strict=True)
        return [(f"{path} (closure variable '{n}')", c.cell_contents) for n, c in cells]
    code = getattr(obj, "__code__", None)
    func_globals = getattr(obj, "__globals__", None)
    if code is not None and func_globals is not None:
        used = [name for name in code.co_names if name in func_globals]
        return [(f"{path} (global '{n}')", func_globals[n]) for n in used]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return [(f"{path}.{key}", value) for key, value in state.items()]
    return []


def describe_payload_error(
    function: Callable[..., Any], args: tuple, kwargs: dict, exc: Exception
) -> PayloadError:
    """The PayloadError for a call that failed to pickle with ``exc``: names the culprit."""
    chain = (
        _find_unpicklable(function, "function")
        or _find_unpicklable(args, "args")
        or _find_unpicklable(kwargs, "kwargs")
        or []
    )
    culprit = "(could not narrow it down)"
    if chain:
        path, obj = chain[-1]
        culprit = f"{path} = {_describe(obj)} ({type(obj).__qualname__})"
    return PayloadError(
        f"Cannot send the function and its arguments to the ranks: {culprit} cannot be "
        f"pickled ({type(exc).__name__}: {exc}). {_advice([o for _, o in chain], exc)}"
    )


def find_path(target: object, roots: list[tuple[str, object]]) -> str | None:
    """Where ``target`` sits below ``roots`` ("args[0]._parameters['weight']"), breadth first."""
    queue = collections.deque(roots)
    seen: set[int] = set()
    for _ in range(100_000):  # bounded: a huge container must not stall a failing launch
        if not queue:
            break
        path, obj = queue.popleft()
        if obj is target:
            return path
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float)):
            continue
        seen.add(id(obj))
        queue.extend(_children(obj, path))
    return None


def _advice(objects: list[object], exc: Exception) -> str:
    """What to do instead, for the objects users most often try to send."""
    kinds = [(type(o).__module__, type(o).__name__) for o in objects]
    if any(m.startswith("torch.utils.data") and n.endswith("DataLoaderIter") for m, n in kinds):
        return (
            "Pass the DataLoader itself (or its dataset), not iter(loader), and iterate inside "
            "the function: an iterator over a DataLoader holds live worker processes."
        )
    channel = {"Queue", "SimpleQueue", "JoinableQueue", "Connection", "AutoProxy"}
    if "through inheritance" in str(exc) or any(
        m.startswith("multiprocessing") and (n in channel or n.endswith("Proxy")) for m, n in kinds
    ):
        return (
            "Queues, pipes and managers cannot be passed to the ranks. To get values back, "
            "return them from the function: notebook_launcher returns rank 0's value "
            "(return_all=True: every rank's)."
        )
    if any(isinstance(o, types.GeneratorType) for o in objects):
        return (
            "Pass a list (or whatever the generator reads from) and create the generator "
            "inside the function."
        )
    return (
        "Create such objects (open files, locks, generators, database or CUDA handles) inside "
        "the function instead of passing them or capturing them from the notebook."
    )


class ReturnValueError(TypeError):
    """A value a rank sends back (a launch's return value, a warm rank's cell value or pull)
    cannot leave the rank: it holds something tied to the rank's process."""

    nbtrain_bad_input = True  # the message says it all: no frame of the rank's is the user's


def tied_to_process(obj: object) -> bool:
    """An open file (or a socket's file): it means nothing in another process. Pickled as is,
    cloudpickle would turn a file opened for reading into a StringIO of its text, silently;
    in-memory streams (StringIO, BytesIO) travel as they are."""
    return isinstance(obj, io.IOBase) and not isinstance(obj, (io.StringIO, io.BytesIO))


def describe_return_error(
    value: object, exc: Exception, *, rank: int, what: str, culprit: object = None
) -> ReturnValueError:
    """The error for ``value`` (rank ``rank``'s ``what``, e.g. "return value") that failed to
    pickle with ``exc``: names where the culprit sits in it, its type and what to send instead.
    ``culprit``: the object that failed, when the pickler knows it (an open file)."""
    if culprit is None:
        chain = _find_unpicklable(value, "value") or [("value", value)]
        path, culprit = chain[-1]
    else:
        path = find_path(culprit, [("value", value)]) or "value"
    kind = type(culprit)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}"
    )
    where = "it" if path == "value" else path
    if tied_to_process(culprit):
        mode, name = getattr(culprit, "mode", "?"), getattr(culprit, "name", None)
        opened = f" {name!r}" if isinstance(name, str) else ""
        advice = (
            f"{where} is a file{opened} opened with mode {mode!r} ({type_name}), which stays "
            "with the process that opened it. Return its path (f.name) instead, after closing "
            "it in the rank, or what you read from it (f.read())."
        )
    else:
        advice = (
            f"{where} is a {type_name} ({_describe(culprit)}), which cannot be pickled "
            f"({type(exc).__name__}: {exc}). Return plain data (numbers, strings, lists, "
            "dicts), tensors or a state_dict (e.g. model.state_dict()) instead: objects tied "
            "to the rank's process (locks, open files, sockets, threads, generators) cannot "
            "leave it."
        )
    return ReturnValueError(f"rank {rank}'s {what} cannot travel back from the rank: {advice}")


def unpack(data: bytes) -> Any:
    """The kernel maps (and unlinks) the segments a rank's result names: no copy."""
    return sharedmem.loads(data, private=False, unlink=True)


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
               "BINSTRING", "STRING"}


def unloadable_global(data: bytes) -> str | None:
    """The first class or function named by reference in a pickle that this process cannot
    import ("module.Name"), or None if every one loads (or the pickle cannot be read)."""
    memo: dict[int, object] = {}
    recent: list[object] = []  # the values pushed lately: STACK_GLOBAL takes the last two
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name in ("FRAME", "PROTO"):  # framing only: they push nothing
                continue
            if name in _STRING_OPS:
                recent.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = recent[-1] if recent else None  # type: ignore[arg-type]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                recent.append(memo.get(int(arg)))  # type: ignore[arg-type]
            elif name in ("GLOBAL", "STACK_GLOBAL", "INST"):
                module, qualname = (
                    str(arg).split(" ", 1) if name != "STACK_GLOBAL" else map(str, recent[-2:])
                )
                if not _loads(module, qualname):
                    return f"{module}.{qualname}"
                recent.append(None)
            else:
                recent.append(None)
    except Exception:
        return None
    return None


def _loads(module: str, qualname: str) -> bool:
    try:
        value: object = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except Exception:
        return False
    return True


def pack_exception(exc: BaseException) -> bytes | None:
    """The exception object if it survives a round trip, else None (text still travels)."""
    try:
        data = cloudpickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return data
    except Exception:
        return None
