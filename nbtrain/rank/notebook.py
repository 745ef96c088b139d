"""A rank in a notebook: detached from the kernel's sockets, its rich output sent to the cell.

A forked rank inherits the kernel's ipykernel objects: the shell's display publisher, the
display hook, comms, logging handlers bound to the kernel's output streams. Any of them would
send from the fork over the kernel's own sockets ("Attempted to send message from fork"), and
the message would be lost. ``install`` (called once as a rank starts) detaches every one:

- ``display()`` / ``publish_display_data`` / matplotlib's inline ``plt.show()`` become a
  ``Display`` event to the kernel, which shows the mime bundle in the calling cell, labelled
  with the rank (kernel/run/cellout.py). Spawn and forkserver ranks get the same ``display``.
- comms (ipywidgets made in a rank) go nowhere: a widget's model lives in the rank, which no
  frontend can reach; its text form is what a display shows.
- the display hook prints, as in plain Python; logging handlers on the kernel's streams write
  to the rank's own (the kernel's pipes).
- tqdm bars feed the live view (tqdm_bridge.py).

Size limit: a display's bundle of more than MAX_BUNDLE bytes is replaced by a line saying so
(save such output to a file and return or display its path instead).
"""

from __future__ import annotations

import functools
import logging
import sys
from types import ModuleType
from typing import Any

from nbtrain.rank import imports, process, runtime, tqdm_bridge
from nbtrain.shared.events import Display

MAX_BUNDLE = 8 << 20  # bytes of one display's mime bundle sent to the kernel
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"  # its model exists only in the rank


def install() -> None:
    """Detach this rank from the kernel's sockets and route its rich output to the cell."""
    _detach_shell()
    _detach_comms()
    _retarget_logging()
    _route_display()
    tqdm_bridge.install()


def send(data: dict[str, Any], metadata: dict[str, Any] | None = None,
         display_id: str | None = None, update: bool = False) -> None:
    """A mime bundle to the calling cell, from this rank (dropped outside a launch)."""
    current = runtime.current()
    if current is None:
        return
    data = {mime: value for mime, value in data.items() if mime != WIDGET_VIEW}
    if not data:
        return
    size = sum(len(value) if isinstance(value, (str, bytes)) else 0 for value in data.values())
    if size > MAX_BUNDLE:
        kinds = ", ".join(sorted(data))
        data = {"text/plain": f"(a display of {size / 2**20:.1f} MiB ({kinds}) was not sent: "
                f"the limit is {MAX_BUNDLE >> 20} MiB; save it to a file instead)"}
        metadata = None
    mark = process.mark_output()  # after what the rank printed so far, before what follows
    current.sink.send(
        Display(current.info.rank, data, dict(metadata or {}), display_id, update, mark=mark)
    )


def _detach_shell() -> None:
    """Fork: the kernel's shell is here; its display publisher now sends to the cell."""
    sys.displayhook = sys.__displayhook__
    shell = _kernel_shell()
    if shell is None:
        return
    shell.display_pub = _publisher_class()(shell=shell)
    shell.displayhook = _PlainDisplayHook()


@functools.cache
def _publisher_class() -> type:
    """The shell's display publisher in a rank: sends to the cell (a traitlets class: setting it
    up scans its members, so it is made once per process, see the end of this module)."""
    from IPython.core.displaypub import DisplayPublisher

    class RankDisplayPublisher(DisplayPublisher):
        def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None,
                    source: object = None, *, transient: dict[str, Any] | None = None,
                    update: bool = False, **kwargs: Any) -> None:
            display_id = (transient or {}).get("display_id")
            send(data, metadata, display_id, update)

        def clear_output(self, wait: bool = False) -> None:
            pass  # a rank cannot clear the cell's output

    return RankDisplayPublisher


class _PlainDisplayHook:
    """What the shell's display hook does in a rank: nothing (ranks run functions)."""

    def __call__(self, value: object) -> None:
        sys.__displayhook__(value)


def _kernel_shell() -> Any:
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()


def _detach_comms() -> None:
    if "comm" not in sys.modules and "ipykernel" not in sys.modules:
        return
    try:
        import comm
        from comm.base_comm import BaseComm
    except ImportError:
        return

    class DetachedComm(BaseComm):
        def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None,
                        buffers: Any = None, **keys: Any) -> None:
            pass

    def create_comm(*args: Any, **kwargs: Any) -> BaseComm:
        return DetachedComm(*args, **kwargs)

    comm.create_comm = create_comm


def _retarget_logging() -> None:
    """Handlers made in the kernel write to ipykernel's stream objects: the rank's instead."""
    loggers = [logging.getLogger(), *(
        logger for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    )]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and _is_kernel_stream(handler.stream):
                name = getattr(handler.stream, "name", "")
                handler.setStream(sys.stdout if name == "stdout" else sys.stderr)


def _is_kernel_stream(stream: object) -> bool:
    return type(stream).__module__.startswith("ipykernel")


def _route_display() -> None:
    """Spawn/forkserver ranks have no shell: IPython's display functions send here directly
    (module attributes, so code unpickled or imported later finds these)."""
    if _kernel_shell() is not None:
        return  # fork: the shell's publisher (above) already routes every display
    imports.when_imported("IPython.core.display_functions", _patch_display)
    imports.when_imported("IPython.display", _patch_display)


def _patch_display(module: ModuleType) -> None:
    setattr(module, "display", _display)  # noqa: B010 - a module attribute, replaced
    setattr(module, "publish_display_data", _publish_display_data)  # noqa: B010


def _publish_display_data(data: dict[str, Any], metadata: dict[str, Any] | None = None,
                          source: object = None, *, transient: dict[str, Any] | None = None,
                          **kwargs: Any) -> None:
    send(data, metadata, (transient or {}).get("display_id"))


def _display(*objs: Any, include: Any = None, exclude: Any = None,
             metadata: dict[str, Any] | None = None, transient: dict[str, Any] | None = None,
             display_id: Any = None, raw: bool = False, clear: bool = False,
             **kwargs: Any) -> None:
    """IPython's display(), in a rank without a shell."""
    for obj in objs:
        if raw:
            data, meta = obj, metadata or {}
        else:
            data, meta = _formatter().format(obj, include=include, exclude=exclude)
            meta = {**meta, **(metadata or {})}
        identifier = display_id if isinstance(display_id, str) else None
        send(data, meta, identifier, bool(kwargs.get("update")))


_FORMATTER: Any = None


def _formatter() -> Any:
    """IPython's formatter, with matplotlib figures as PNG (as the inline backend registers)."""
    global _FORMATTER
    if _FORMATTER is None:
        from IPython.core.formatters import DisplayFormatter

        _FORMATTER = DisplayFormatter()
    if "matplotlib.figure" in sys.modules:
        from IPython.core.pylabtools import print_figure
        from matplotlib.figure import Figure

        png = _FORMATTER.formatters["image/png"]
        if not _has_type(png, Figure):
            png.for_type(Figure, lambda figure: print_figure(figure, "png"))
    return _FORMATTER


def formatter() -> Any:
    """IPython's display formatter for this rank (a warm rank formats a cell's value)."""
    return _formatter()


def _has_type(formatter: Any, kind: type) -> bool:
    try:
        formatter.lookup_by_type(kind)
    except KeyError:
        return False
    return True


if "IPython.core.displaypub" in sys.modules:
    # A kernel imports this module before it forks ranks (shared/preload.py): the publisher's
    # class is made there once, and every forked rank inherits it instead of making its own.
    _publisher_class()
