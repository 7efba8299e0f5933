"""What a run's report decides: should the quantized candidate ship?

Pure functions over a run directory read once (``RunData``: manifest.json and the stages' results as typed
records, QuantizeResult, EvalResult, ProfileResult and BenchReport), no I/O. Every figure is read by
attribute, so a value that is missing or malformed reads as "not measured", never an exception.

- who was compared, named as a person names a model (``ModelRef.label``: its source and quantization), never
  by a cache path;
- what the candidate gains: weight bytes before/after (quantize), served output tokens/s and $ per 1M output
  tokens of the original and the candidate, both measured in the same run with the same traffic and SLO;
- what it costs: the eval gates with their intervals;
- the verdict, the decision it implies, and the next thing to try when the verdict is FAIL or INCONCLUSIVE,
  derived from which gate failed and from the recipe's quantization (its backend says what is gentler).

The package: ``run`` reads and compares (RunData, Names, Pair, Speed), ``ship`` decides (Decision, RunSummary).
"""

from infertool.decision.run import Names, Pair, RunData, Speed, SpeedRow, model_names, speed, weights
from infertool.decision.ship import Decision, RunSummary, next_steps, quant_bits, summarize, verdict_of

__all__ = ["Decision", "Names", "Pair", "RunData", "RunSummary", "Speed", "SpeedRow", "model_names", "next_steps",
           "quant_bits", "speed", "summarize", "verdict_of", "weights"]
