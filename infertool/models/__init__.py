"""Model sources: a local HF directory, a .gguf file, or a bundled model; conversion and facts."""
