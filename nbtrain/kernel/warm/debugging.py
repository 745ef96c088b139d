"""Looking into warm ranks: the post-mortem of a failed command (``%ranks_debug`` /
``ranks.debug()``) and where each rank is now (``ranks.where()``).

The post-mortem is one more command (``Debug``): the failed rank opens pdb at the frame that
raised (rank/debugger.py), its prompt in the cell (pdbprompt.py), and stays warm. ``where``
asks the group's channel for every rank's stack between commands (where.py draws it).
"""

from __future__ import annotations

import contextlib

from nbtrain.kernel.host.stdin import NO_INPUT, can_ask
from nbtrain.kernel.run.where import Where
from nbtrain.kernel.warm.command import execute
from nbtrain.kernel.warm.world import Worlds, drop
from nbtrain.shared.commands import Debug
from nbtrain.shared.errors import SessionError
from nbtrain.shared.stacks import RankStack


def debug(worlds: Worlds, rank: int | None, commands: object) -> None:
    """pdb in ``rank`` (default: the root cause of the last failed command) at its failing
    frame; ``commands``: pdb commands to run instead of asking (then ``c``)."""
    __tracebackhide__ = True
    chosen = worlds.failures.choose(rank)
    script = pdb_commands(commands)
    if script is None and not can_ask():
        raise SessionError(
            f"ranks.debug(): {NO_INPUT}. Run the cell from Jupyter, or look at the rank's "
            "names with %%ranks / ranks.pull(...)."
        )
    world = worlds.require()
    if not worlds.failures.kept:  # a rank had died: require() started new ranks
        raise SessionError(
            f"ranks.debug(): rank {chosen}'s failure is gone: the ranks were just restarted "
            "(see the message above), and new ranks hold no frames."
        )
    prompts = world.group.channel.prompts
    with contextlib.nullcontext() if script is None else prompts.scripted(script):
        execute(
            worlds, world, lambda rank: Debug(), [chosen], title=f"post-mortem of rank {chosen}",
            return_all=True, quiet=True, keep_failures=False,
        )


def where(worlds: Worlds) -> Where:
    """Every rank's stack now (between commands: idle, unless its own threads run something),
    ending at the user's code; for a rank in a collective, which one and who is missing."""
    world = worlds.require()
    group = world.group
    got: list[dict[int, RankStack]] = []
    group.begin(set(), drop, lambda: False)  # no command: what the ranks write is dropped
    group.channel.ask_where(got.append)
    while not got and not group.exited():
        group.turn(None)
    return Where(got[0] if got else group.stacks())


def pdb_commands(commands: object) -> list[str] | None:
    if commands is None:
        return None
    if isinstance(commands, str) or not isinstance(commands, (list, tuple)) or not all(
        isinstance(line, str) for line in commands
    ):
        raise TypeError(
            f"debug(commands={commands!r}): give a list of pdb commands, e.g. "
            "ranks.debug(commands=['p loss', 'up', 'p batch.shape'])."
        )
    return list(commands)


__all__ = ["debug", "pdb_commands", "where"]
