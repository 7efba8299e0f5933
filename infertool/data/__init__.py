"""The text infertool reads, in one place: the built-in corpus and its disjoint calibration / evaluation
parts, eval suites, calibration sets, and the content fingerprints that tell when any input changed.

Pure Python (PyYAML at most); imports no other infertool package but errors, so the resolution of a
recipe, quantize, eval and bench can all rely on it.
"""
