"""The models shipped in the repository: the target served when no --model is given, and its draft."""
from pathlib import Path

EMBEDDED_MODELS = Path(__file__).resolve().parent.parent / "assets" / "models"
EMBEDDED_TARGET = EMBEDDED_MODELS / "target"
EMBEDDED_DRAFT = EMBEDDED_MODELS / "draft"
