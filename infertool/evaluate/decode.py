"""The decode path as served (issue 21): PLACEHOLDER of the seam, replaced by its implementation."""

from __future__ import annotations


class DecodePhase:
    name = "decode"

    def __init__(self, spec):
        self.spec = spec

    def run(self, served, prior, events) -> dict:
        return {}

    def compare(self, raw_ref: dict, raw_cand: dict, *, confidence: float, first: str) -> dict:
        return {}
