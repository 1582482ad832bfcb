"""Project assets: the embedded default models live in assets/models/."""
