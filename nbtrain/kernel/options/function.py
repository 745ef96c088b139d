"""The function a launch runs, checked once before anything starts: callable, not async, and
``args`` / ``kwargs`` bind to its signature (with the fix for the usual slips: a dict as args,
a string without the tuple's comma, Accelerate's positional num_processes, a rank parameter)."""

from __future__ import annotations

import inspect
import numbers


def check_function(function: object, args: object, kwargs: object) -> tuple[tuple, dict]:
    """The function is callable and (args, kwargs) bind to its signature."""
    if not callable(function):
        raise TypeError(
            f"function={function!r} is not callable. Pass the function itself, e.g. "
            "notebook_launcher(train, args=(...)), not the result of calling it (train())."
        )
    if inspect.iscoroutinefunction(function):
        raise TypeError(
            f"function={function!r} is an async function (async def): each rank calls it "
            "without an event loop, so it would only create a coroutine. Define it with def."
        )
    if not isinstance(args, (tuple, list)):
        raise TypeError(_args_message(args))
    if kwargs is not None and not isinstance(kwargs, dict):
        hint = ""
        if isinstance(kwargs, numbers.Integral) and not isinstance(kwargs, bool):
            # Accelerate's notebook_launcher(function, args, num_processes): here the third
            # positional parameter is kwargs.
            hint = (
                f" The third positional parameter of notebook_launcher is kwargs (in "
                f"Accelerate it is num_processes): pass num_processes={kwargs!r} by name."
            )
        raise TypeError(f"kwargs={kwargs!r} must be a dict of keyword arguments or None.{hint}")
    args, kwargs = tuple(args), dict(kwargs or {})
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return args, kwargs
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(function, "__name__", repr(function))
        raise TypeError(
            f"args={args!r}, kwargs={kwargs!r} do not fit {name}{signature}: {exc}."
            + _rank_parameter_hint(signature)
        ) from None
    return args, kwargs


def _args_message(args: object) -> str:
    if isinstance(args, dict):
        return (
            f"args={args!r} is a dict: pass keyword arguments as kwargs={args!r} (args= takes "
            "a tuple of positional arguments)."
        )
    if isinstance(args, str):
        return (
            f"args={args!r} is a string, not a tuple: a one-element tuple needs a trailing "
            f"comma, args=({args!r},)."
        )
    return (
        f"args={args!r} must be a tuple of positional arguments, e.g. args=({args!r},) "
        "for a single argument."
    )


def _rank_parameter_hint(signature: inspect.Signature) -> str:
    params = list(signature.parameters)
    if params and params[0] in {"rank", "local_rank", "process_index", "index", "i"}:
        return (
            f" nbtrain does not pass the rank as the first argument (torch.multiprocessing.spawn"
            f" does): drop the '{params[0]}' parameter and read it inside the function with "
            "Accelerator().process_index or int(os.environ['RANK'])."
        )
    return " Pass args=(...) and kwargs={...} matching the function's parameters."
