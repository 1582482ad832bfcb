"""The Hugging Face hub: a repository's checkpoint files, downloaded once into its cache."""
from __future__ import annotations

from pathlib import Path

from engine.checkpoint.errors import ModelLoadError

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def download(repo_id: str) -> Path:
    """The local snapshot of a hub repository (only the files a checkpoint needs)."""
    try:
        from huggingface_hub import snapshot_download  # lazy: only hub ids need it
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise ModelLoadError(
            f"could not get {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "check the id and the network, or pass a local checkpoint directory") from e
