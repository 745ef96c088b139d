"""Warm ranks: a distributed session that lives across cells (``nbtrain.start_ranks``).

A session is a set of long-lived rank processes (rank/session.py), each serving one command at a
time from its own pipe. Every command (a ``%%ranks`` cell, ``run``, ``pull``, ``push``) is one
``Run`` (run.py): its own view, cell output, root cause and timeout, fed by the session's
``RankGroup`` (group/, ``warm=True``): its one watch loop returns once every rank of the
command reported it and never tears the ranks down for an ordinary failure; its Ctrl-C policy
interrupts the command, not the processes.

- ``session``: ``Ranks`` (the handle: run, pull, push, run_cell, debug, where, restart, stop),
  ``start_ranks`` and ``current`` (the session ``%%ranks`` uses; magics.py);
- ``command``: one command, its ``Run`` and how it ends (state kept after an ordinary failure;
  new ranks after a death or ranks left stuck; Ctrl-C interrupts the command);
- ``world``: the processes: one generation (local processes, or ranks placed by Ray with
  commands as Ray calls) and the session's generations over time;
- ``debugging``: the post-mortem of a failed command (``%ranks_debug``) and ``where()``.

No orphans: ranks die with the kernel (PR_SET_PDEATHSIG, and EOF on their command pipe), on
``stop()``, and at interpreter exit (``weakref.finalize``).
"""

from nbtrain.kernel.warm.session import Ranks, SessionError, current, start_ranks

__all__ = ["Ranks", "SessionError", "current", "start_ranks"]
