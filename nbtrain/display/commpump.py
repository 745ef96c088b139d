"""The dashboard's own widget messages, handled while its cell is busy (the "where?" button).

A cell that runs a launch holds the kernel's main thread: the frontend's messages wait in the
kernel until the cell ends, so a button in a live dashboard would do nothing while it matters.
As jupyter-ui-poll does, the launch's own wait loop reads them instead: ``pump()`` (called on
every turn) takes what the shell channel queued for the main thread, handles the messages for
the comms it was given (the button's click) at once, and keeps every other message; ``close()``
hands those back to ipykernel in their order, to be handled once the cell ends as they would
have been (a queued cell runs after this one, or is aborted if this one fails).

A page opened or reloaded while the cell runs asks for the widgets' state before it draws any
(ipywidgets 8's manager: a comm_open of target CONTROL, a ``request_states`` message on it, an
answer awaited for 4 s, then the comm closed); unanswered, it shows "Loading widget..." until
the cell ends. The pump answers those too, through ipywidgets' own handler: the reloaded page
draws the live dashboard and follows it; ``page_opened`` says one did (the dashboard then copies
the cell's lines for it: reloaded.py).

ipykernel 7 queues the main thread's messages on an inproc socket (SubshellManager's
``_shell_channel_to_main``): private, so ``for_kernel`` returns None wherever it is not there
(another kernel, an older ipykernel, no kernel) and the dashboard shows no button.

It sits with the dashboard it serves: the widget view asks ``for_kernel`` whether its button can
work at all; the kernel's launch loop (kernel/run/lifecycle.py) pumps it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

Handles = Callable[[str], bool]  # is this comm id one of ours?
CONTROL = "jupyter.widget.control"  # ipywidgets' comm target for a page's state request


class CommPump:
    """Reads the main thread's queued shell messages from the launch's loop."""

    def __init__(self, kernel: Any, socket: Any) -> None:
        self.kernel = kernel
        self.socket = socket
        self.kept: list[Any] = []  # other messages, in order, for ipykernel after the cell
        self.closed = False
        self._control: set[str] = set()  # the CONTROL comms pages opened meanwhile
        self.page_opened = False  # a page (a reload) asked for the widgets' state meanwhile

    @staticmethod
    def for_kernel() -> CommPump | None:
        """The pump of the running IPython kernel, or None where this cannot work."""
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        kernel = getattr(shell, "kernel", None)
        thread = getattr(kernel, "shell_channel_thread", None)
        manager = getattr(thread, "manager", None)
        pair = getattr(manager, "_shell_channel_to_main", None)
        socket = getattr(pair, "to_socket", None)
        if socket is None or getattr(kernel, "comm_manager", None) is None:
            return None
        return CommPump(kernel, socket)

    def pump(self, ours: Handles) -> None:
        """Handle the queued messages to comms ``ours`` accepts; keep the rest."""
        if self.closed:
            return
        import zmq

        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError:  # the kernel is shutting down: nothing more to read
                self.closed = True
                return
            if not self._handled(frames, ours):
                self.kept.append(frames)

    def _handled(self, frames: list[Any], ours: Handles) -> bool:
        session = self.kernel.session
        try:
            idents, parts = session.feed_identities(frames, copy=False)
            # Header and content read without the signature check: deserialize() records each
            # signature it checks, and would refuse a kept message when ipykernel reads it.
            kind = session.unpack(parts[1].bytes).get("msg_type")
            content = session.unpack(parts[4].bytes)
            handler = self._handler(str(kind), content, ours)
            if handler is None:
                return False
            msg = session.deserialize(parts, content=True, copy=False)
        except Exception:
            return False  # ipykernel reads it later and says what is wrong with it
        # The cell's output context (parent) stays this cell's: what the click prints goes
        # here, where the button is.
        handler(None, idents, msg)
        return True

    def _handler(self, kind: str, content: dict[str, Any], ours: Handles) -> Any:
        """The comm manager's handler for a message the pump answers now, else None."""
        manager = self.kernel.comm_manager
        comm_id = str(content.get("comm_id", ""))
        if kind == "comm_open" and content.get("target_name") == CONTROL:
            self._control.add(comm_id)
            self.page_opened = True
            return manager.comm_open
        if kind == "comm_msg" and (ours(comm_id) or comm_id in self._control):
            return manager.comm_msg
        if kind == "comm_close" and comm_id in self._control:
            self._control.discard(comm_id)
            return manager.comm_close
        return None

    def close(self) -> None:
        """Hand every kept message back to ipykernel, in order (after this cell's own)."""
        self.closed = True
        kept, self.kept = self.kept, []
        for frames in kept:
            with contextlib.suppress(Exception):  # the kernel is shutting down
                self.kernel.io_loop.add_callback(self.kernel.shell_main, None, frames)
