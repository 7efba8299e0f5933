"""The leaf of the package graph: pure performance math (roofline), the hardware table (GPU datasheets,
links, CPU reference) and this host's facts (GPU present, CPU features, memory).

plan, profile, serve, quantize and envs import from here; nothing here imports another infertool package
(except errors), so no package depends on another through it.
"""
