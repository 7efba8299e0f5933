"""Worker tasks of `infertool quantize`: each quantization backend declares its own (``QuantBackend.tasks`` in
its module under infertool/backends/). This package stays data: ``TASKS_FROM`` names the registry they are read
from, by a dotted path, as a task's target is named. The vLLM load check is no worker task: it serves the
checkpoint with the one launcher (infertool.serve)."""

TASKS_FROM = "infertool.backends.registry:task_definitions"
