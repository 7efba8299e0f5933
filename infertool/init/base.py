"""What init plans for: the target (``--gpu`` / ``--cpu`` / this host) and its traffic, the record of one value
init chose and why (``Choice``; ``Choices`` records them), and the small helpers every step uses."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import TypeVar

from infertool.errors import UsageError
from infertool.perf import hardware
from infertool.perf import host as hostfacts
from infertool.resolve import Target, target_for
from infertool.schema import YAMLValue


GIB = 1024**3
SUITE = "builtin-corpus"
API_KEY_ENV = "INFERTOOL_API_KEY"
TP_DEGREES = (1, 2, 4, 8)
PREFERRED_GROUP_SIZE = 128
EVAL_MIN_LEN = 513  # eval's windows (eval.seq_len 512) must fit the served max_model_len (evaluate.prepare)
MIN_LEN_WHY = ("the smallest choice: one request of the traffic, and the eval's 512-token windows (eval.seq_len) "
               "as served")
COMMENT_WIDTH = 110
# why float32 on a CPU without bf16 matrix instructions (said in the recipe's reasons)
HALF_SLOW_EVIDENCE = "time to first token 6.0 s in bf16 vs 1.1 s in float32, SmolLM2-135M, 256-token prompt"


@dataclass(frozen=True)
class Traffic:
    """The traffic init plans for on a kind of target (the bench section, and what the KV cache must hold)."""

    prompt_len: int
    output_len: int
    concurrency: int  # the most requests in flight: max_num_seqs, the top of the bench sweep
    requests: int  # per concurrency level
    context: int  # max_model_len to aim for (capped by the position limit and the KV cache)
    ttft_ms: float
    tpot_ms: float
    samples: int  # calibration windows
    seq_len: int

    @property
    def per_request(self) -> int:
        return self.prompt_len + self.output_len


TRAFFIC = {
    "gpu": Traffic(512, 256, 128, 512, 8192, 500, 50, 128, 512),
    "cpu": Traffic(256, 64, 8, 32, 2048, 3000, 250, 32, 256),
}


@dataclass
class Choice:
    """One value init chose (``field``: its dotted path in the recipe) and why. ``level`` "error": the
    target cannot hold the model even at the smallest choices (``why`` says what would)."""

    field: str
    value: YAMLValue
    why: str
    level: str = "info"  # info | warning | error

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


T = TypeVar("T", bound=YAMLValue)


class Choices(list[Choice]):
    """The choices made so far. Called, it records a value init chose at ``path`` and why, and gives the value
    back: ``tp = decide("serve.tensor_parallel_size", 2, "why")``."""

    def __call__(self, path: str, value: T, why: str, level: str = "info") -> T:
        self.append(Choice(path, value, why, level))
        return value


@dataclass(frozen=True)
class InitTarget:
    """What the recipe is for: the resolution's Target of ``--gpu`` / ``--cpu`` / this host (``target``: one
    GPU; ``resolve_target(count)`` for a tensor-parallel degree), and this host's facts."""

    target: Target
    host: hostfacts.HostFacts
    max_gpus: int = 8  # the largest tensor-parallel degree to consider (this host: its GPU count)

    @property
    def kind(self) -> str:  # gpu | cpu
        return self.target.kind

    @property
    def source(self) -> str:  # "--gpu" | "--cpu" | "this host"
        return self.target.source

    @property
    def gpu(self) -> hardware.GPU | None:
        return hardware.GPUS[self.target.gpu] if self.target.gpu else None

    @property
    def device(self) -> hardware.GPU:
        """The GPU of a GPU target (asked only where the target is one)."""
        assert self.gpu is not None, "a GPU target"
        return self.gpu

    @property
    def tag(self) -> str:
        return self.gpu.key.split("-")[0].lower() if self.gpu else "cpu"

    def describe(self, count: int = 1) -> str:
        if self.gpu is not None:
            return f"{count} x {self.gpu.name} ({self.gpu.memory_gib:.1f} GiB)"
        h = self.host
        isa = {"avx512": "AVX-512", "avx2": "AVX2 only"}.get(h.cpu_isa, "unknown vector ISA")
        half = "bf16 matrix instructions" if h.cpu_bf16 else "no bf16 matrix instructions"
        mem = f", {h.memory_total_bytes / GIB:.1f} GiB" if h.memory_total_bytes else ""
        return f"this host's CPU ({isa}, {half}{mem})"

    def resolve_target(self, count: int = 1) -> Target:
        """The resolution's Target with ``count`` GPUs per replica (the preflight's checks)."""
        return target_for(self.host, gpu=self.target.gpu, cpu=self.kind == "cpu", count=count, source=self.source)

    def on(self, dev: hardware.GPU) -> InitTarget:
        """The same host planning for another GPU of the table, up to 8 of them (what would hold a model)."""
        return InitTarget(target_for(self.host, gpu=dev.key, source="--gpu"), self.host)


def init_target(gpu: str | None = None, cpu: bool = False) -> InitTarget:
    """``--gpu NAME`` (infertool's GPU table), ``--cpu`` (this host's CPU), else this host as it is (its GPU,
    which must be in the table, or its CPU): the Target as ``resolve`` makes it (``target_for``)."""
    if gpu and cpu:
        raise UsageError("--gpu and --cpu cannot be used together", hint="--gpu NAME plans for that GPU; --cpu for this host's CPU")
    host = hostfacts.host_facts()
    if gpu:
        try:
            return InitTarget(target_for(host, gpu=gpu, source="--gpu"), host)
        except UsageError as e:
            raise UsageError(e.message, hint=f"known GPUs: {', '.join(hardware.GPUS)}") from None
    if cpu:
        if host.accelerator == "cuda":
            raise UsageError(
                "--cpu on a host with an NVIDIA GPU: a recipe cannot say \"CPU\" there (without target.gpu, every "
                "command plans and serves for this host, which is its GPU)",
                hint="set INFERTOOL_ACCELERATOR=cpu for init and for every command that uses the recipe, or use --gpu NAME")
        return InitTarget(target_for(host, cpu=True, source="--cpu"), host)
    here = target_for(host)
    if here.kind == "cpu":
        return InitTarget(here, host)
    if here.gpu is None:
        if not host.gpu_name:
            raise UsageError("this host has an NVIDIA GPU, but nvidia-smi did not say which",
                             hint=f"pass --gpu NAME ({', '.join(hardware.GPUS)})")
        raise UsageError(f"this host's GPU {host.gpu_name!r} is not in infertool's GPU table",
                         hint=f"pass --gpu NAME for the closest one ({', '.join(hardware.GPUS)})")
    return InitTarget(here, host, max_gpus=max(1, min(8, host.gpu_count)))


def pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return s[:60].strip("-._") or "model"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def levels(max_seqs: int) -> list[int]:
    """Concurrency levels of the bench sweep: 1, then 8, 32, 64, ... below max_num_seqs, then max_num_seqs."""
    return sorted({1, max_seqs} | {c for c in (8, 32, 64, 256) if c < max_seqs})


def one_line(text: str) -> str:
    """``text`` as one line: line breaks of every kind (YAML's too: NEL, LS, PS) and control characters
    become spaces."""
    chars = [" " if (unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp")) else c for c in str(text)]
    return " ".join("".join(chars).split())
