"""Profiling: roofline math (pure), hardware peaks, and (later) measurement, NVML and Nsight Systems."""
