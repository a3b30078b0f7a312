"""Where an embedding table's rows of ggml blocks come from when a lookup reads them: the matrix the runner holds
(`HeldRows`: a tied table, which is also the output head and so is read whole every step), or the model's file
(`FileRows`: a table only looked up, read row by row with `pread`).

A lookup reads a handful of rows a step, so a table that is never multiplied need not be resident: the default
model's Q5_0 `token_embd` is 89 MiB of the runner's memory held, and nothing read from the file. A memory map would
not do: the kernel maps the 64 KiB around every touched page (fault-around, which `MADV_RANDOM` does not turn off),
so 1,500 random rows made 62 of those 89 MiB resident. Read rows go through the page cache, which the kernel shares
and reclaims, not the process's resident memory.
"""

import ctypes
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_library import GgmlMatrix


class EmbeddingRows(Protocol):
    """An embedding table's rows of blocks (out × row_bytes, a ggml type's), looked up by token id."""

    @property
    def type_name(self) -> str: ...

    @property
    def shape(self) -> tuple[int, int]:
        """(vocabulary, hidden size)."""
        ...

    @property
    def row_bytes(self) -> int: ...

    def take(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        """The blocks of rows `ids` (a flat array), one row of blocks per id: len(ids) × row_bytes."""
        ...

    def read_into(self, ids: Sequence[int], address: int) -> None:
        """The blocks of rows `ids`, side by side, into the memory at `address` (len(ids) × row_bytes bytes)."""
        ...


class HeldRows:
    """The rows of a matrix the runner holds (unrepacked: its blocks as stored)."""

    def __init__(self, matrix: GgmlMatrix) -> None:
        self._matrix = matrix
        self.type_name = matrix.type_name
        self.shape = matrix.shape
        self.row_bytes = matrix.row_bytes

    def take(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        return self._matrix.blocks[ids]

    def read_into(self, ids: Sequence[int], address: int) -> None:
        destination = _bytes_at(address, len(ids) * self.row_bytes).reshape(len(ids), self.row_bytes)
        np.take(self._matrix.blocks, ids, axis=0, out=destination)


class FileRows:
    """The rows of a matrix stored in a file (a GGUF tensor's blocks at `offset`), read when looked up; the file
    stays open while this object lives, so a model file replaced or removed meanwhile is still the one read."""

    def __init__(self, file: Path, offset: int, type_name: str, shape: tuple[int, int], row_bytes: int) -> None:
        self.file = file
        self.type_name = type_name
        self.shape = shape
        self.row_bytes = row_bytes
        self._offset = offset
        self._descriptor = os.open(file, os.O_RDONLY)
        self._finalizer = weakref.finalize(self, os.close, self._descriptor)
        end = offset + self.nbytes
        if os.fstat(self._descriptor).st_size < end:
            self._finalizer()
            raise ValueError(f"{file} ends before its {type_name} table's last row (byte {end})")

    @property
    def nbytes(self) -> int:
        """Bytes of the whole table in the file."""
        return self.shape[0] * self.row_bytes

    def take(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        rows = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
        self.read_into([int(token) for token in ids], rows.ctypes.data)
        return rows

    def read_into(self, ids: Sequence[int], address: int) -> None:
        view = memoryview((ctypes.c_char * (len(ids) * self.row_bytes)).from_address(address)).cast("B")
        vocabulary, size = self.shape[0], self.row_bytes
        for index, token in enumerate(ids):
            if not 0 <= token < vocabulary:
                raise IndexError(f"token id {token} is outside the embedding table's {vocabulary} rows")
            row = view[index * size : (index + 1) * size]
            if os.preadv(self._descriptor, [row], self._offset + token * size) != size:
                raise OSError(f"{self.file} was cut short: row {token} of its {self.type_name} table is gone")

    def close(self) -> None:
        self._finalizer()


def _bytes_at(address: int, nbytes: int) -> npt.NDArray[np.uint8]:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
