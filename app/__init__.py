"""TokenTrace's server: the live Gradio page over the engine service (`python -m app`)."""
