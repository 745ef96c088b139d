"""A value that cannot travel back from a rank (a lock, an open file) is refused with an error
naming the rank, the value's type, where it sits and what to return instead; an open file is
never sent as something else (cloudpickle would turn one opened for reading into a StringIO)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

import nbtrain
from nbtrain import WorkerError, notebook_launcher

pytestmark = pytest.mark.timeout(240)

QUIET = {"progress": "off", "output": "none"}


@pytest.fixture(params=["fork", "spawn"])
def method(request: pytest.FixtureRequest) -> str:
    return request.param


def a_lock_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.destroy_process_group()
    return {"step": 3, "lock": threading.Lock()} if rank == 1 else {"step": 3}


def test_a_lock_names_the_rank_its_place_its_type_and_the_fix(method):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(a_lock_on_rank_1, num_processes=2, start_method=method,
                          return_all=True, **QUIET)  # fmt: skip
    text = str(info.value)
    assert info.value.rank == 1, text
    assert "rank 1's return value cannot travel back from the rank" in text
    assert "value['lock'] is a _thread.lock" in text and "cannot be pickled" in text
    assert "Return plain data" in text and "model.state_dict()" in text
    assert info.value.type_name == "ReturnValueError"
    assert "payload.py" not in info.value.remote_traceback  # no frame of nbtrain's: bad input


def open_file(path: str, mode: str):
    return [open(path, mode)]


@pytest.mark.parametrize("mode", ["r", "rb", "w", "ab"])
def test_an_open_file_is_refused_never_sent_as_a_copy(method, tmp_path: Path, mode):
    path = tmp_path / "notes.txt"
    path.write_text("some text\n")
    with pytest.raises(WorkerError) as info:
        notebook_launcher(open_file, args=(str(path), mode), num_processes=2,
                          start_method=method, **QUIET)  # fmt: skip
    text = str(info.value)
    assert info.value.rank == 0, text
    assert "rank 0's return value cannot travel back from the rank" in text
    assert f"value[0] is a file {str(path)!r} opened with mode {mode!r} (_io." in text, text
    assert "Return its path (f.name) instead" in text


def in_memory_streams():
    return io.StringIO("text"), io.BytesIO(b"bytes")


def test_in_memory_streams_still_travel_as_they_are(method):
    text, data = notebook_launcher(in_memory_streams, num_processes=2, start_method=method,
                                   **QUIET)  # fmt: skip
    assert type(text) is io.StringIO and text.getvalue() == "text"
    assert type(data) is io.BytesIO and data.getvalue() == b"bytes"


def test_a_warm_rank_pull_of_an_open_file_is_refused_and_the_ranks_stay(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("some text\n")
    ranks = nbtrain.start_ranks(2, **QUIET)
    try:
        ranks.run_cell(f"f = open({str(tmp_path / 'notes.txt')!r})")
        with pytest.raises(WorkerError) as info:
            ranks.pull("f")
        text = str(info.value)
        assert "rank 0's value of 'f' cannot travel back from the rank" in text, text
        assert "opened with mode 'r'" in text
        assert ranks.pull("f.read()") == ["some text\n", "some text\n"]
    finally:
        ranks.stop()
