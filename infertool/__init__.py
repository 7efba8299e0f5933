"""infertool: profile, quantize, evaluate, serve and benchmark self-hosted LLMs from one recipe."""

__version__ = "0.1.0"
