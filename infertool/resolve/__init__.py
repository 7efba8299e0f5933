"""One resolution of a recipe: what every command means by it ("what you serve is what you test").

``resolve(recipe)`` decides, once, for plan, quantize, eval, profile, serve, ``--emit k8s``, bench, run
and tune:

- the BASE model (model.source: a local directory, a .gguf or bundled:NAME, converted into the cache, or a
  hub id found in the local Hugging Face cache: models.sources.locate, once per model);
- the CANDIDATE (where ``infertool quantize`` writes: quantize.output, else out/<recipe>-<method>; inside
  ``run``, the quantize stage's entry; for bitsandbytes, the base quantized when loaded);
- the SERVED model: the candidate whenever the recipe has a quantize section, unless serve.model says
  ``original``, ``quantized`` or a directory. A fallback to the original happens in one case only (the
  candidate's own load check found that this host's vLLM loads it but cannot run it) and is said loudly;
- the TARGET hardware (target.gpu, else this host) and this host's facts (infertool.perf.host);
- the EFFECTIVE serve settings for each model (the dtype infertool passes on this CPU, the KV dtype,
  TP/PP, memory): ``serve_for(model)``;
- a fingerprint of every input (model weights, calibration text, suite data, bench prompts):
  ``inputs()``.

Nothing here starts a process or loads weights; with ``materialize=True`` a bundled/GGUF base is
converted into the cache (once) so that it can be served or planned exactly.
The package: ``refs`` (ModelRef, Target, Overrides, ``target_for``), ``resolution`` (Resolution), ``core``
(``resolve``).
"""

from infertool.resolve.core import resolve, with_candidate
from infertool.resolve.refs import (QUANTIZE_MANIFEST, SLOW_HALF_EVIDENCE, ModelRef, Overrides, Target,
                                    candidate_manifest, cpu_serve_dtype, default_output, host_cannot_run, target_for)
from infertool.resolve.resolution import Resolution

__all__ = [
    "QUANTIZE_MANIFEST", "SLOW_HALF_EVIDENCE", "ModelRef", "Overrides", "Resolution", "Target", "candidate_manifest",
    "cpu_serve_dtype", "default_output", "host_cannot_run", "resolve", "target_for", "with_candidate",
]
