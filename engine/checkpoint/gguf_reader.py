"""A GGUF file's reader, opened once and shared by everything that reads the file (its
config, its tensors, its tokenizer), and its metadata by key."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.checkpoint.errors import ModelLoadError

if TYPE_CHECKING:
    from gguf import GGUFReader

_readers: dict[tuple[str, int, int], "GGUFReader"] = {}


def is_gguf(path: Path) -> bool:
    """A GGUF file: named *.gguf, or starting with the GGUF magic (Ollama's blobs have no suffix)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def open_gguf(path: Path) -> "GGUFReader":
    """The file's reader. Parsing a 262k-token vocabulary is slow, so the config and
    the weights share one reader until `close_gguf`."""
    from gguf import GGUFReader

    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _readers:
        if len(_readers) >= 2:  # a target and its draft; a failed load must not keep files parsed
            del _readers[next(iter(_readers))]
        try:
            _readers[key] = GGUFReader(path)
        except Exception as e:  # bad magic, unknown version, a truncated file (short reads)...
            raise ModelLoadError(f"cannot read GGUF file {path} (corrupt or truncated?): {first_line(e)}") from e
    return _readers[key]


def close_gguf(path: Path) -> None:
    for key in [k for k in _readers if k[0] == str(path.resolve())]:
        del _readers[key]


def first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def meta(reader: "GGUFReader", key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()
