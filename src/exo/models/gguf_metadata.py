"""Typed access to the key/value metadata of a GGUF file (the reader itself returns `Any`)."""

from pathlib import Path

import gguf

from exo.models.errors import ModelLoadError


class GGUFMetadata:
    """Reads scalars and arrays from `GGUFReader.fields`, raising `ModelLoadError` with the key when one is absent."""

    def __init__(self, reader: gguf.GGUFReader, source: Path) -> None:
        self._reader = reader
        self._source = source

    @property
    def architecture(self) -> str:
        return self.string("general.architecture")

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    def _contents(self, key: str) -> object:
        field = self._reader.fields.get(key)
        if field is None:
            raise ModelLoadError(f"cannot import {self._source}: GGUF metadata has no '{key}'")
        contents: object = field.contents()
        return contents

    def string(self, key: str) -> str:
        value = self._contents(key)
        if not isinstance(value, str):
            raise ModelLoadError(f"cannot import {self._source}: GGUF '{key}' is not a string")
        return value

    def integer(self, key: str) -> int:
        value = self._contents(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelLoadError(f"cannot import {self._source}: GGUF '{key}' is not an integer")
        return value

    def number(self, key: str) -> float:
        value = self._contents(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelLoadError(f"cannot import {self._source}: GGUF '{key}' is not a number")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        if not self.has(key):
            return default
        return bool(self._contents(key))

    def strings(self, key: str) -> list[str]:
        value = self._contents(key)
        if not isinstance(value, list):
            raise ModelLoadError(f"cannot import {self._source}: GGUF '{key}' is not a list")
        return [str(item) for item in value]

    def integers(self, key: str) -> list[int]:
        value = self._contents(key)
        if not isinstance(value, list):
            raise ModelLoadError(f"cannot import {self._source}: GGUF '{key}' is not a list")
        return [int(item) for item in value]

    def optional_integer(self, key: str) -> int | None:
        return self.integer(key) if self.has(key) else None

    def optional_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else None
