"""Progress bars that libraries make as subclasses of tqdm's front ends drive the rank's row of
the live view, as plain tqdm does (issue 43, point 10): ``huggingface_hub``'s ``tqdm`` (which
``datasets`` uses too) and a user's own subclass, real rank processes. Their own methods still
run (``super()``, ``isinstance``, ``async for``). The same in a real Jupyter kernel, where the
front end is the notebook bar: tests/kernel/test_library_bars_kernel.py.

The kernel side's RunState.apply is wrapped to record every event the ranks sent.
"""

from __future__ import annotations

from typing import Any

import pytest

from nbtrain import notebook_launcher
from nbtrain.shared.events import Progress

pytestmark = pytest.mark.timeout(240)


def library_bars() -> dict[str, Any]:
    import asyncio
    import io

    from huggingface_hub.utils import tqdm as hub_tqdm
    from tqdm.auto import tqdm

    class Counting(tqdm):
        """A user's subclass: its own __init__ (with super()) and its own method."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.made_here = True
            super().__init__(*args, **kwargs)

        def twice(self) -> int:
            return 2 * int(self.n)

    written = io.StringIO()
    for _ in hub_tqdm(range(7), desc="hub", file=written):
        pass
    counting = Counting(total=5, desc="own", file=written)
    counting.update(5)
    doubled = counting.twice()
    counting.close()

    async def collect() -> list[int]:
        async def numbers():  # an async iterable: tqdm.asyncio's `async for`
            for i in range(4):
                yield i

        return [i async for i in hub_tqdm(numbers(), total=4, desc="async")]

    return {
        "written": written.getvalue(),  # the bars drew nothing themselves
        "subclass kept": isinstance(counting, Counting) and counting.made_here,
        "doubled": doubled,
        "async": asyncio.run(collect()),
        "hub is still hub's": issubclass(type(hub_tqdm(disable=True)), hub_tqdm),
    }


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_library_and_user_subclasses_drive_the_ranks_rows(received, start_method):
    results = notebook_launcher(
        library_bars, num_processes=2, start_method=start_method, progress="off",
        return_all=True,
    )
    for rank, result in enumerate(results):
        assert result == {
            "written": "",
            "subclass kept": True,
            "doubled": 10,
            "async": [0, 1, 2, 3],
            "hub is still hub's": True,
        }, (rank, result)
        bars = [e for e in received if isinstance(e, Progress) and e.rank == rank]
        last = {e.desc: (e.step, e.total) for e in bars}
        assert last == {"hub": (7, 7), "own": (5, 5), "async": (4, 4)}, bars
