"""Tensors and arrays through a /dev/shm segment, in one process (ranks: tests/multiprocess)."""

from __future__ import annotations

import array
import glob
import linecache
import os
import pickle
import secrets
import threading
import traceback

import numpy as np
import pytest
import torch

from nbtrain.kernel.options.config import StartMethod
from nbtrain.kernel.specs.payload import prepare_call, shm_room
from nbtrain.shared import sharedmem, shmclean
from nbtrain.shared.serialization import PayloadError

MiB = 1 << 20


@pytest.fixture
def segment():
    made = sharedmem.Segment(sharedmem.segment_name(secrets.token_hex(4), "test"))
    yield made
    made.unlink()


def round_trip(value, segment, *, private=True):
    data = sharedmem.dumps(value, segment=segment)
    segment.write(keep_mapped=False)
    return data, sharedmem.loads(data, private=private)


def test_large_tensors_travel_as_tokens_and_come_back_equal(segment):
    big = torch.arange(MiB, dtype=torch.float32)
    weight = torch.nn.Parameter(torch.randn(512, 1024))
    grads = torch.zeros(MiB // 2, requires_grad=True)
    value = {"big": big, "view": big[10:20], "t": big.view(1024, 1024).t(), "w": weight,
             "g": grads, "half": big.to(torch.bfloat16), "small": torch.ones(3)}
    data, back = round_trip(value, segment)
    assert len(data) < 4096  # no tensor bytes in the pickle
    for key in value:
        assert torch.equal(back[key], value[key]), key
        assert back[key].dtype == value[key].dtype and back[key].stride() == value[key].stride()
    assert isinstance(back["w"], torch.nn.Parameter) and back["w"].requires_grad
    assert back["g"].requires_grad and back["g"].is_leaf
    # Views of one storage stay views of one storage (one region, written once).
    assert back["view"].untyped_storage().data_ptr() == back["big"].untyped_storage().data_ptr()
    assert back["t"].untyped_storage().data_ptr() == back["big"].untyped_storage().data_ptr()
    assert segment.size == (4 + 2 + 2 + 2) * MiB  # big, w, g, half: each once, page-aligned


def test_numpy_arrays_keep_dtype_shape_and_order(segment):
    c_order = np.arange(MiB, dtype=np.float64).reshape(1024, 1024)
    f_order = np.asfortranarray(c_order)
    strided = c_order[:, ::2]  # not contiguous: sent contiguous, as numpy's pickle does
    value = [c_order, f_order, strided, np.ones(4), np.array(["a", None], dtype=object)]
    _, back = round_trip(value, segment)
    for original, loaded in zip(value, back, strict=True):
        assert np.array_equal(original, loaded)
        assert original.dtype == loaded.dtype
    assert back[1].flags.f_contiguous and not back[1].flags.c_contiguous


def test_a_private_mapping_keeps_writes_to_itself(segment):
    data, first = round_trip(torch.zeros(MiB), segment)
    second = sharedmem.loads(data, private=True)
    first.add_(1)
    assert float(second.sum()) == 0.0  # the other reader sees the segment as written


def test_a_result_is_unlinked_once_mapped(segment):
    data, back = round_trip(torch.ones(MiB), segment)
    assert os.path.exists(segment.path)
    again = sharedmem.loads(data, private=False, unlink=True)
    assert not os.path.exists(segment.path)
    assert float(again.sum()) == MiB and float(back.sum()) == MiB  # mappings outlive the name


def test_tokens_cannot_name_other_files():
    token = ("tensor", "../../etc/passwd", 0, 4, "float32", (1,), (1,), 0, False, False)

    class Forger(pickle.Pickler):
        def persistent_id(self, obj):
            return token if obj == "x" else None

    import io

    buffer = io.BytesIO()
    Forger(buffer).dump(["x"])
    with pytest.raises(pickle.UnpicklingError, match="not an nbtrain segment name"):
        sharedmem.loads(buffer.getvalue(), private=True)


def test_a_reference_outside_a_forked_rank_is_refused():
    data = sharedmem.dumps([1], registry=("gone", {}), by_reference=lambda o: o == [1])
    with pytest.raises(pickle.UnpicklingError, match="forked from the kernel"):
        sharedmem.loads(data, private=True)


def test_too_large_for_dev_shm_is_refused_before_anything_starts(monkeypatch):
    """A 64 MiB /dev/shm (Docker's default) is a machine we lack: the free space is faked."""
    import nbtrain.kernel.specs.payload as payload

    monkeypatch.setattr(payload, "shm_room", lambda: (48 * MiB, "/dev/shm"))
    data = {"x": torch.zeros(16 * MiB)}  # 64 MiB
    mine = os.path.join(sharedmem.SHM_DIR, f"nbtrain_{os.getpid()}_*")
    before = set(glob.glob(mine))
    with pytest.raises(PayloadError) as info:
        prepare_call(len, (data,), {}, StartMethod.FORKSERVER)
    message = str(info.value)
    for fragment in ("args[0]['x']", "torch.Tensor", "64 MiB", "/dev/shm has 48 MiB free",
                     "start_method='fork'", "--shm-size"):
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert set(glob.glob(mine)) == before


def test_room_is_the_smaller_of_dev_shm_and_memory():
    room, where = shm_room()
    stat = os.statvfs(sharedmem.SHM_DIR)
    assert 0 < room <= stat.f_bavail * stat.f_frsize
    assert where in (sharedmem.SHM_DIR, "memory")


def test_orphaned_segments_of_a_dead_kernel_are_swept():
    dead = 2**22 + 12345  # above pid_max's default: no process has it
    path = os.path.join(sharedmem.SHM_DIR, f"nbtrain_{dead}_abc123_args")
    mine = os.path.join(sharedmem.SHM_DIR, f"nbtrain_{os.getpid()}_abc123_args")
    for name in (path, mine):
        with open(name, "wb") as handle:
            handle.write(b"x")
    try:
        removed = shmclean.sweep_orphans()
        assert path in removed and not os.path.exists(path)
        assert os.path.exists(mine)  # a live kernel's segment is never touched
    finally:
        for name in (path, mine):
            if os.path.exists(name):
                os.unlink(name)


def test_share_for_running_ranks_then_release():
    """The warm-rank path: no fork to inherit from, so even under fork it is a segment."""
    from nbtrain.kernel.specs.payload import share

    value = {"x": torch.arange(MiB // 2, dtype=torch.float64), "n": np.ones(MiB)}
    pushed = share(value, label="data")
    pushed.commit(lambda text: None, ranks=2)
    loaded = sharedmem.loads(pushed.data, private=True)
    pushed.release()
    assert not os.path.exists(pushed.segment.path)
    assert torch.equal(loaded["x"], value["x"]) and np.array_equal(loaded["n"], value["n"])


def test_share_names_the_part_that_does_not_fit(monkeypatch):
    import nbtrain.kernel.specs.payload as payload

    monkeypatch.setattr(payload, "shm_room", lambda: (MiB, "/dev/shm"))
    with pytest.raises(PayloadError, match=r"data\['n'\] \(numpy.ndarray, 8 MiB\)"):
        payload.share({"n": np.ones(MiB)}, label="data")


def test_without_dev_shm_everything_is_pickled(monkeypatch, tmp_path):
    """macOS has no /dev/shm: the same calls work, with the bytes in the pickle."""
    monkeypatch.setattr(sharedmem, "SHM_DIR", str(tmp_path / "missing"))
    call = prepare_call(len, (torch.ones(MiB),), {}, StartMethod.SPAWN)
    assert call.segment is None and len(call.data) > 4 * MiB
    function, args, _ = sharedmem.loads(call.data, private=True).call
    assert function is len and torch.equal(args[0], torch.ones(MiB))


def test_too_large_names_a_variable_the_function_captured(monkeypatch):
    import nbtrain.kernel.specs.payload as payload

    monkeypatch.setattr(payload, "shm_room", lambda: (MiB, "memory"))
    table = np.zeros(MiB)

    def train():
        return table.sum()

    with pytest.raises(PayloadError, match=r"function \(closure variable 'table'\) \(numpy"):
        prepare_call(train, (), {}, StartMethod.SPAWN)



def test_the_fork_check_does_not_stream_big_data(monkeypatch):
    """Under fork the call is only checked to be picklable (the ranks read the kernel's own
    objects): the check must not read the bytes of the big data the function reads, counted as
    the bytes pickled into the check's sink. (A big bytes or bytearray reaches the sink as the
    object itself, unread: not counted here.)"""
    big = 64 * MiB
    tensor = torch.ones(big // 4)
    storage = torch.ones(big // 4).untyped_storage()  # torch pickles a storage's every byte
    floats = array.array("f", bytes(big))  # array.array pickles by tobytes()

    def reads_big_data():  # (a closure: pickled by value, as a notebook's function is)
        return len(tensor) + storage.nbytes() + len(floats)

    streamed = []
    write = sharedmem._Discard.write

    def counting(self, data):
        streamed.append(len(memoryview(data)))
        return write(self, data)

    monkeypatch.setattr(sharedmem._Discard, "write", counting)
    sharedmem.check_picklable((reads_big_data, (), {}))
    assert sum(streamed) < MiB, f"the check pickled {sum(streamed)} bytes"
    # ... and it still refuses what cannot travel, next to the big data
    lock = threading.Lock()
    with pytest.raises(PayloadError, match="lock"):
        prepare_call(lambda: (reads_big_data(), lock), (), {}, StartMethod.FORK)


def test_a_pickled_function_keeps_its_code_file_name():
    """cloudpickle names by-value code '<dynamic-code>'; a rank's traceback must name the
    notebook's cell (the kernel renames the file, kernel/host/cellnames.py), nested code too."""
    namespace: dict = {}
    source = "def outer(x):\n    def inner():\n        raise ValueError(x)\n    return inner()\n"
    exec(compile(source, "/tmp/ipykernel_1/5.py", "exec"), namespace)
    outer = pickle.loads(sharedmem.dumps(namespace["outer"]))
    with pytest.raises(ValueError) as caught:
        outer(3)
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-2:] == [("/tmp/ipykernel_1/5.py", 4), ("/tmp/ipykernel_1/5.py", 3)]


def test_a_cells_lines_travel_with_its_code_and_a_files_do_not(tmp_path):
    """IPython keeps a cell's lines in linecache only (mtime None): a rank started apart from
    the kernel gets them with the code (pdb lists them); a file on disk is read there."""
    cell, source = "/tmp/ipykernel_1/7.py", "def f():\n    return 7\n"
    namespace: dict = {}
    exec(compile(source, cell, "exec"), namespace)
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    on_disk = tmp_path / "module.py"
    on_disk.write_text("def g():\n    return 8\n")
    exec(compile(on_disk.read_text(), str(on_disk), "exec"), namespace)
    linecache.getlines(str(on_disk))  # read from disk: cached with its mtime
    data = sharedmem.dumps((namespace["f"], namespace["g"]))
    del linecache.cache[cell]
    linecache.clearcache()
    f, g = pickle.loads(data)
    assert (f(), g()) == (7, 8)
    assert linecache.cache[cell][2] == ["def f():\n", "    return 7\n"]  # as the kernel had it
    assert str(on_disk) not in linecache.cache  # not sent: the rank reads the file itself
