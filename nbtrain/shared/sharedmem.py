"""Big tensors and numpy arrays between processes by reference, not by copy (both sides).

Pickles made here carry large CPU tensors and numpy arrays as *tokens* (pickle's persistent ids)
instead of their bytes:

- ``("ref", key, id)``: under fork, an object the child already has. The parent keeps the object
  in ``FORK_REGISTRY`` from before the fork until the launch ends, so the child finds it there,
  at the same address, in its copy-on-write pages. Nothing is copied.
- ``("tensor", ...)`` / ``("ndarray", ...)``: the bytes sit in a file in /dev/shm (a *segment*)
  that every reader maps. Readers in the ranks map it copy-on-write (MAP_PRIVATE): they share the
  pages while they read, and a rank that writes gets private copies of the pages it wrote, so
  nothing a rank does ever reaches another rank or the kernel (the semantics of a pickled copy,
  at the cost of a mapping).

Segment names are ``nbtrain_<pid of the kernel>_<launch>_<what>``: the kernel removes its
launch's names when the launch ends, whatever the outcome, and names left by a kernel that died
(SIGKILL) are removed by the next launch on the machine (shmclean.py: ``sweep_orphans``).

Only files named like that, directly in SHM_DIR, are ever opened by a loader: the pickles come
from our own processes, and a token cannot point a loader at another file.
"""

from __future__ import annotations

import array
import contextlib
import io
import mmap
import os
import pickle
import re
import sys
import types
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from nbtrain.shared.cellcode import named_code

SHM_DIR = "/dev/shm"
PREFIX = "nbtrain_"
MIN_SHARED = 1 << 20  # bytes: smaller tensors and arrays are cheaper to pickle than to map
_ALIGN = 4096  # each region starts on its own page: no page is shared by two objects
_WRITE_CHUNK = 1 << 30  # pwrite moves at most about 2 GiB per call
_NAME = re.compile(r"nbtrain_\d+_[0-9a-f]+_[A-Za-z0-9_]+")

# Under fork: objects the children look up by (launch key, id). Filled before the fork, emptied
# when the launch ends; the children read their inherited copy.
FORK_REGISTRY: dict[str, dict[int, object]] = {}


class SharedMemoryError(OSError):
    """A segment could not be created, written or mapped."""


@dataclass
class _Region:
    offset: int
    nbytes: int
    source: memoryview  # the bytes to write, in memory order


@dataclass
class Segment:
    """One file in SHM_DIR, planned region by region while pickling, written by ``write()``.

    ``objects`` keeps, per region, what the region holds (for the error that names an object
    too large to share and for the status line).
    """

    name: str
    regions: list[_Region] = field(default_factory=list)
    objects: list[tuple[object, int]] = field(default_factory=list)  # (object, nbytes)
    size: int = 0
    _by_key: dict[tuple[int, int], int] = field(default_factory=dict)  # (address, nbytes)
    _view: mmap.mmap | None = None
    written: bool = False

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, self.name)

    def place(self, key: tuple[int, int], source: memoryview, owner: object) -> int:
        """The offset of these bytes in the segment (the same bytes twice: one region)."""
        if key in self._by_key:
            return self._by_key[key]
        offset = -(-self.size // _ALIGN) * _ALIGN
        self.regions.append(_Region(offset, source.nbytes, source))
        self.objects.append((owner, source.nbytes))
        self.size = offset + source.nbytes
        self._by_key[key] = offset
        return offset

    def write(self, *, keep_mapped: bool) -> None:
        """Create the file and write every region (pwrite: one copy, no page faults here).

        ``keep_mapped``: also map it read-only with every page present, until ``unlink``. The
        pages then always count as shared between the kernel and the ranks (a rank's memory
        figures show only what it owns), and they are ready before the first rank reads them.
        """
        if not self.regions:
            return
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise SharedMemoryError(
                exc.errno, f"cannot create {self.path}: {exc.strerror}"
            ) from None
        self.written = True  # from now on, unlink() has something to remove
        try:
            for region in self.regions:
                _pwrite_all(fd, region.source, region.offset)
            os.ftruncate(fd, self.size)
            if keep_mapped:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._view = mmap.mmap(fd, self.size, flags=flags, prot=mmap.PROT_READ)
        except OSError as exc:
            self.unlink()
            raise SharedMemoryError(
                exc.errno, f"cannot write {self.size} bytes to {self.path}: {exc.strerror}"
            ) from None
        finally:
            os.close(fd)
            self.regions = [_Region(r.offset, r.nbytes, memoryview(b"")) for r in self.regions]

    def unlink(self) -> None:
        """Remove the name (mappings still open stay valid) and drop our own mapping."""
        if self._view is not None:
            with contextlib.suppress(BufferError):
                self._view.close()
            self._view = None
        if self.written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.written = False


def _pwrite_all(fd: int, source: memoryview, offset: int) -> None:
    done = 0
    while done < source.nbytes:
        done += os.pwrite(fd, source[done : done + _WRITE_CHUNK], offset + done)


def available() -> bool:
    """Segments need SHM_DIR (Linux's /dev/shm); elsewhere big data is pickled as before."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def segment_name(launch: str, what: str) -> str:
    return f"{PREFIX}{os.getpid()}_{launch}_{what}"


# -- pickling -------------------------------------------------------------------------------------


def _torch() -> Any:
    return sys.modules.get("torch")


def _numpy() -> Any:
    return sys.modules.get("numpy")


def is_array(obj: object) -> bool:
    """A torch tensor or a numpy array (whatever its size, device or subclass)."""
    torch, numpy = _torch(), _numpy()
    return (torch is not None and isinstance(obj, torch.Tensor)) or (
        numpy is not None and isinstance(obj, numpy.ndarray)
    )


class SharingPickler(cloudpickle.Pickler):
    """cloudpickle, with tensors and arrays replaced by tokens, and code keeping its file name.

    ``registry``: fork. Objects for which ``by_reference(obj)`` is true are registered and sent
    as references. ``segment``: large plain CPU tensors and numpy arrays go to the segment.
    """

    dispatch_table = ChainMap({types.CodeType: named_code}, cloudpickle.Pickler.dispatch_table)

    def __init__(
        self,
        file: Any,
        *,
        segment: Segment | None = None,
        registry: tuple[str, dict[int, object]] | None = None,
        by_reference: Callable[[object], bool] = is_array,
        min_shared: int = MIN_SHARED,
    ) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._segment = segment
        self._registry = registry
        self._by_reference = by_reference
        self._min_shared = min_shared

    def persistent_id(self, obj: Any) -> Any:
        if self._registry is not None and self._by_reference(obj):
            key, objects = self._registry
            objects[id(obj)] = obj  # alive until the launch ends: the child finds it by id
            return ("ref", key, id(obj))
        if self._segment is not None:
            return _share(obj, self._segment, self._min_shared)
        return None


def _share(obj: Any, segment: Segment, min_shared: int) -> tuple | None:
    torch, numpy = _torch(), _numpy()
    if torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
        return _share_tensor(obj, segment, min_shared)
    if numpy is not None and type(obj) is numpy.ndarray:
        return _share_array(obj, segment, min_shared)
    return None


def _share_tensor(tensor: Any, segment: Segment, min_shared: int) -> tuple | None:
    torch = _torch()
    if (
        tensor.device.type != "cpu"
        or tensor.layout is not torch.strided
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or (tensor.requires_grad and tensor.grad_fn is not None)  # pickle's own error stands
    ):
        return None
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes < min_shared:
        return None
    raw = torch.empty((0,), dtype=torch.uint8).set_(storage)
    source = memoryview(raw.numpy()).cast("B")
    offset = segment.place((storage.data_ptr(), nbytes), source, tensor)
    is_parameter = type(tensor) is torch.nn.Parameter
    return (
        "tensor", segment.name, offset, nbytes, str(tensor.dtype).removeprefix("torch."),
        tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.requires_grad,
        is_parameter,
    )


def _share_array(array: Any, segment: Segment, min_shared: int) -> tuple | None:
    numpy = _numpy()
    dtype = array.dtype
    if array.nbytes < min_shared or dtype.hasobject or dtype.fields is not None:
        return None
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = numpy.ascontiguousarray(array)  # what numpy's own pickling sends too
    flat = array.ravel(order="K").view(numpy.uint8)
    source = memoryview(flat).cast("B")
    offset = segment.place((array.__array_interface__["data"][0], array.nbytes), source, array)
    return ("ndarray", segment.name, offset, dtype.str, tuple(array.shape), order)


def dumps(obj: Any, **options: Any) -> bytes:
    buffer = io.BytesIO()
    SharingPickler(buffer, **options).dump(obj)
    return buffer.getvalue()


class _Discard(io.RawIOBase):
    """A file that keeps nothing: pickling into it checks that everything can be pickled."""

    written = 0  # bytes pickled into it

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = len(memoryview(data))
        self.written += size
        return size


def check_picklable(obj: Any) -> int:
    """Raise what pickling ``obj`` would raise, without reading the bytes of its big data:
    tensors, arrays, torch storages and array.array go as tokens (they always pickle; a storage
    would be torch.save'd into memory, an array.array copied by tobytes()). Big bytes,
    bytearrays and protocol-5 buffers reach the sink as the objects themselves, unread.
    Returns the bytes the check pickled."""
    sink = _Discard()
    SharingPickler(sink, registry=("check", {}), by_reference=_checked_by_reference).dump(obj)
    return sink.written


def _checked_by_reference(obj: object) -> bool:
    torch = _torch()
    storages = (torch.UntypedStorage, torch.TypedStorage) if torch is not None else ()
    return is_array(obj) or isinstance(obj, (array.array, *storages))


# -- loading --------------------------------------------------------------------------------------


class SharedLoader(pickle.Unpickler):
    """Unpickles what SharingPickler made. ``private``: map segments copy-on-write (a rank's
    writes stay its own); else shared (the kernel, sole owner of a result). ``unlink``: remove
    each segment's name once mapped (a result segment has exactly one reader)."""

    def __init__(self, file: Any, *, private: bool, unlink: bool) -> None:
        super().__init__(file)
        self._private = private
        self._unlink = unlink
        self._maps: dict[str, mmap.mmap] = {}
        self._storages: dict[tuple[str, int], Any] = {}

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        if kind == "ref":
            return _registered(pid[1], pid[2])
        if kind == "tensor":
            return self._tensor(*pid[1:])
        if kind == "ndarray":
            return self._array(*pid[1:])
        raise pickle.UnpicklingError(f"unknown reference {pid!r} in a payload")

    def _map(self, name: str) -> mmap.mmap:
        if name in self._maps:
            return self._maps[name]
        if not _NAME.fullmatch(name):
            raise pickle.UnpicklingError(f"not an nbtrain segment name: {name!r}")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, (os.O_RDONLY if self._private else os.O_RDWR) | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise pickle.UnpicklingError(
                f"the shared-memory segment {path} is gone: the launch that made it has ended "
                "(or something removed it from /dev/shm)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if self._private:
                mapped = mmap.mmap(
                    fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
            else:
                mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
            if self._unlink:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._maps[name] = mapped
        return mapped

    def _tensor(
        self, name: str, offset: int, nbytes: int, dtype: str, shape: tuple, stride: tuple,
        storage_offset: int, requires_grad: bool, is_parameter: bool,
    ) -> Any:
        import torch

        storage = self._storages.get((name, offset))
        if storage is None:  # views of one storage stay views of one storage
            raw = torch.frombuffer(self._map(name), dtype=torch.uint8, count=nbytes, offset=offset)
            storage = self._storages[(name, offset)] = raw.untyped_storage()
        tensor = torch.empty((0,), dtype=getattr(torch, dtype))
        tensor.set_(storage, storage_offset, shape, stride)
        if is_parameter:
            return torch.nn.Parameter(tensor, requires_grad=requires_grad)
        return tensor.requires_grad_(requires_grad) if requires_grad else tensor

    def _array(self, name: str, offset: int, dtype: str, shape: tuple, order: str) -> Any:
        import numpy

        kind = numpy.dtype(dtype)
        count = 1
        for extent in shape:
            count *= extent
        flat = numpy.frombuffer(self._map(name), dtype=kind, count=count, offset=offset)
        return flat.reshape(shape, order=order)  # type: ignore[call-overload]


def _registered(key: str, object_id: int) -> Any:
    try:
        return FORK_REGISTRY[key][object_id]
    except KeyError:
        raise pickle.UnpicklingError(
            "a payload sent by reference was not found: only a process forked from the kernel "
            "during its launch can read it"
        ) from None


@dataclass(frozen=True)
class Envelope:
    """What a launch sends its ranks: the call, and the prefix of the segment names under which
    a rank may return large results (None: results travel in the pickle)."""

    call: Any
    results_prefix: str | None = None


def loads(data: bytes, *, private: bool, unlink: bool = False) -> Any:
    return SharedLoader(io.BytesIO(data), private=private, unlink=unlink).load()
