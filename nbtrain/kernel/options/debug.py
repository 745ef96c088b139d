"""``notebook_launcher(..., debug=True)`` / ``nbtrain launch --debug``, checked before anything
starts: a post-mortem prompt needs someone to type at it, and a channel to the failed rank."""

from __future__ import annotations

from nbtrain.kernel.host.stdin import NO_INPUT, can_ask
from nbtrain.kernel.options.names import hint


def check_debug(debug: object, *, cluster: object = None, xla: bool = False) -> bool:
    """``debug`` as a bool, or a clear error naming the fix (before any rank starts)."""
    if not isinstance(debug, bool):
        raise TypeError(f"debug={debug!r} must be True or False.")
    if not debug:
        return False
    if cluster is not None:
        raise ValueError(
            f"debug=True with cluster={cluster!r}: a post-mortem prompt is not available for "
            "ranks on a cluster yet. Reproduce the failure on local ranks (leave cluster out) "
            "with debug=True, or drop debug=True."
        )
    if xla:
        raise ValueError(
            "debug=True: XLA ordinals have no debugger channel yet. Reproduce the failure on CPU "
            "ranks (debug_launcher, or unset PJRT_DEVICE) with debug=True, or drop debug=True."
        )
    if not can_ask():
        raise ValueError(
            f"{hint('debug=True', '--debug')}: {NO_INPUT}. "
            + hint(
                "Run the cell from Jupyter (or the script from a terminal), or drop debug=True.",
                "Run nbtrain launch from a terminal, or leave --debug out.",
            )
        )
    return True


__all__ = ["check_debug"]
