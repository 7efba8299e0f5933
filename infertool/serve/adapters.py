"""LoRA adapters (serve.lora) checked before any server starts: each folder a PEFT LoRA adapter
(adapter_config.json with peft_type LORA, adapter_model.safetensors), its rank within serve.lora.max_lora_rank, and
its tensors fitting the served model: every lora_A / lora_B names a decoder layer the model has, a module vLLM
serves LoRA on, and the shape of that module (lora_A: r x in_features, lora_B: out_features x r, from config.json).
Reads the JSON and the safetensors header only (no torch). Every problem of every adapter is listed in one
UsageError (exit 2).

vLLM 0.32 serves LoRA on a Llama-style model's attention and MLP projections (q/k/v_proj packed as qkv_proj,
o_proj, gate/up_proj packed as gate_up_proj, down_proj: ``LlamaForCausalLM.packed_modules_mapping``); those are
what ``module_shapes`` describes and what plan sizes (infertool.plan.adapters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from infertool.errors import UsageError
from infertool.records import Record

if TYPE_CHECKING:
    from infertool.models.info import ModelInfo
    from infertool.recipe.serve import LoraSpec
    from infertool.serve.lint import LintIssue

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
_TENSOR_RE = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d{1,6})\.(self_attn|mlp)\.([A-Za-z0-9_]+)"
                        r"\.lora_([AB])(?:\.[A-Za-z0-9_]+)?\.weight$")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_LISTED = 6  # problems listed per adapter (a wrong base can mismatch hundreds of tensors)


class PeftConfig(BaseModel):
    """adapter_config.json as PEFT writes it: the fields the preflight reads (others ignored), each checked by
    ``_config`` (a wrong type is a listed problem, not a validation traceback)."""

    model_config = ConfigDict(extra="ignore")

    peft_type: Any = None  # Any: JSON value, checked by _config
    r: Any = None  # Any: JSON value, checked by _config
    lora_alpha: Any = None  # Any: JSON value, checked by _config
    target_modules: Any = None  # Any: JSON value (a list of names, a regex, "all-linear")
    use_dora: Any = None  # Any: JSON value


@dataclass
class AdapterFacts(Record):
    """One adapter as read from its folder: the served name, the absolute folder, its rank and alpha, the modules
    it adapts, its tensors' count and bytes (the safetensors data) and their dtype."""

    name: str = ""
    path: str = ""
    rank: int = 0
    alpha: float | None = None
    target_modules: list[str] = field(default_factory=list)
    layers: int = 0  # decoder layers it has tensors for
    tensors: int = 0
    bytes: int = 0
    dtype: str = ""


def module_shapes(info: ModelInfo) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection vLLM serves LoRA on, from the model's config (empty when
    the config lacks the numbers)."""
    hidden, inter, heads = info.hidden_size, info.intermediate_size, info.num_attention_heads
    if not hidden or not heads:
        return {}
    head_dim = info.head_dim or hidden // heads
    kv = (info.num_key_value_heads or heads) * head_dim
    out = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
           "o_proj": (heads * head_dim, hidden)}
    if inter:
        out |= {"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    return out


def _config(folder: Path, problems: list[str]) -> tuple[int, float | None, list[str] | None]:
    """(r, lora_alpha, target_modules or None for "all") of adapter_config.json; problems appended."""
    from infertool.models.info import ModelError, read_json_file

    try:
        cfg = read_json_file(folder / CONFIG_FILE, folder)
    except ModelError as e:
        problems.append(e.message)
        return 0, None, None
    if not isinstance(cfg, dict):
        problems.append(f"{CONFIG_FILE} must be a JSON object")
        return 0, None, None
    pc = PeftConfig.model_validate(cfg)
    if pc.peft_type != "LORA":
        problems.append(f"{CONFIG_FILE} says peft_type {pc.peft_type!r}: vLLM serves LoRA adapters (peft_type "
                        "\"LORA\") only")
    r = pc.r
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        problems.append(f"{CONFIG_FILE} has no rank r (a positive integer); got {r!r}")
        r = 0
    if pc.use_dora:
        problems.append(f"{CONFIG_FILE} says use_dora: true: vLLM 0.32 does not serve DoRA adapters")
    alpha, targets = pc.lora_alpha, pc.target_modules
    if isinstance(targets, str):
        targets = None if targets == "all-linear" else [targets]  # a regex or "all-linear": the tensors decide
    elif not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        targets = None
    return r, float(alpha) if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else None, targets


def read_adapter(name: str, folder: str | Path, info: ModelInfo | None, max_rank: int) -> tuple[AdapterFacts, list[str]]:
    """The adapter's facts and every problem found (empty: it fits the model and the configured rank).
    ``info`` None: the model's shape is not known here, only the files and the rank are checked."""
    from infertool.models.info import ModelError, read_safetensors_header

    path = Path(folder).expanduser().resolve()
    facts = AdapterFacts(name=name, path=str(path))
    if not path.is_dir():
        return facts, [f"the folder {path} does not exist" if not path.exists() else f"{path} is not a folder"]
    problems: list[str] = []
    if not (path / CONFIG_FILE).is_file():
        problems.append(f"{CONFIG_FILE} is missing: a PEFT LoRA adapter folder has {CONFIG_FILE} and {WEIGHTS_FILE}")
    else:
        facts.rank, facts.alpha, targets = _config(path, problems)
        facts.target_modules = targets or []
    if not (path / WEIGHTS_FILE).is_file():
        why = " (adapter_model.bin is not read: convert it to safetensors)" if (path / "adapter_model.bin").exists() else ""
        problems.append(f"{WEIGHTS_FILE} is missing{why}")
        return facts, problems
    try:
        header = read_safetensors_header(path / WEIGHTS_FILE)
    except ModelError as e:
        return facts, problems + [e.message]
    shapes = module_shapes(info) if info is not None else {}
    layers = info.num_layers if info is not None else None
    tensor_ranks: set[int] = set()
    seen_layers: set[int] = set()
    dtypes: set[str] = set()
    mismatches: list[str] = []
    beyond: list[int] = []  # the layer of each tensor past the model's last layer
    for tname, entry in header.items():
        facts.tensors += 1
        facts.bytes += entry.end - entry.begin
        dtypes.add(entry.dtype)
        m = _TENSOR_RE.match(tname)
        if m is None:
            mismatches.append(f"tensor {tname}: not a LoRA weight of a decoder layer's projection (vLLM 0.32 serves "
                              f"LoRA on {', '.join(ATTENTION + MLP)}; embeddings, lm_head and modules_to_save are "
                              "not checked here)")
            continue
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        seen_layers.add(layer)
        if module not in ATTENTION + MLP:
            mismatches.append(f"tensor {tname}: module {module} is not one vLLM serves LoRA on "
                              f"({', '.join(ATTENTION + MLP)})")
            continue
        if targets and module not in targets:
            mismatches.append(f"tensor {tname}: module {module} is not in the adapter's target_modules {targets}")
        if len(entry.shape) != 2:
            mismatches.append(f"tensor {tname}: shape {entry.shape} is not a matrix")
            continue
        tensor_ranks.add(entry.shape[0] if ab == "A" else entry.shape[1])
        if layers is not None and layer >= layers:
            beyond.append(layer)
            continue
        if module in shapes:
            fan_in, fan_out = shapes[module]
            r = entry.shape[0] if ab == "A" else entry.shape[1]
            want = [r, fan_in] if ab == "A" else [fan_out, r]
            if list(entry.shape) != want:
                mismatches.append(f"tensor {tname}: shape {list(entry.shape)}, the model's {module} needs {want} "
                                  f"({module} is {fan_in} -> {fan_out}): the adapter was made for another base")
    if beyond and layers is not None:
        which = f"layer {beyond[0]}" if min(beyond) == max(beyond) else f"layers {min(beyond)}-{max(beyond)}"
        problems.append(f"{len(beyond)} of {facts.tensors} tensors are for {which}, but the "
                        f"model has {layers} layers (0-{layers - 1}): the adapter was made for another base")
    if facts.tensors == 0:
        problems.append(f"{WEIGHTS_FILE} holds no tensors")
    problems += mismatches[:MAX_LISTED]
    if len(mismatches) > MAX_LISTED:
        problems.append(f"... and {len(mismatches) - MAX_LISTED} more tensors that do not fit "
                        f"({len(mismatches)} of {facts.tensors})")
    if tensor_ranks and facts.rank and tensor_ranks != {facts.rank}:
        problems.append(f"{CONFIG_FILE} says r {facts.rank}, the tensors have rank {sorted(tensor_ranks)}")
    facts.rank = max([facts.rank, *tensor_ranks])
    if facts.rank > max_rank:
        problems.append(f"rank {facts.rank}; serve.lora.max_lora_rank is {max_rank}: raise it to "
                        f"{_rank_choice(facts.rank)}")
    facts.layers = len(seen_layers)
    facts.dtype = "/".join(sorted(dtypes))
    return facts, problems


def _rank_choice(rank: int) -> str:
    from infertool.recipe.serve import LORA_RANKS

    fit = [r for r in LORA_RANKS if r >= rank]
    return str(fit[0]) if fit else f"at most {LORA_RANKS[-1]} (vLLM's largest; this adapter cannot be served)"


def preflight(lora: LoraSpec, info: ModelInfo | None, *, what: str = "the served model") -> list[AdapterFacts]:
    """Every adapter of serve.lora read and checked against ``info`` (the served model) and the configured rank;
    a UsageError listing every problem of every adapter, before any server starts."""
    facts: list[AdapterFacts] = []
    lines: list[str] = []
    for name, folder in lora.adapters.items():
        f, problems = read_adapter(name, folder, info, lora.max_lora_rank)
        facts.append(f)
        lines += [f"serve.lora.adapters.{name}: adapter {name!r} ({f.path}): {p}" for p in problems]
    if lines:
        raise UsageError(f"{len(lines)} problem(s) with the LoRA adapters of {what}:\n  " + "\n  ".join(lines),
                         hint="each adapter is a PEFT LoRA folder trained on this base model (same layers and "
                         "shapes), its rank at most serve.lora.max_lora_rank")
    return facts


def lora_issues(lora: LoraSpec, info: ModelInfo | None, what: str, *, raise_: bool) -> list[LintIssue]:
    """The preflight as a launch's lint issues (a dry run shows them), or, with ``raise_``, its UsageError."""
    from infertool.serve.lint import LintIssue

    try:
        preflight(lora, info, what=what)
    except UsageError as e:
        if raise_:
            raise
        return [LintIssue("error", line.split(": ", 1)[0], line.split(": ", 1)[1], e.hint or "")
                for line in e.message.splitlines()[1:]]
    return []


def argv_adapters(argv: list[str]) -> dict[str, str]:
    """The NAME=PATH pairs of a vLLM command line's --lora-modules (the launch key fingerprints them)."""
    if "--lora-modules" not in argv:
        return {}
    out: dict[str, str] = {}
    for arg in argv[argv.index("--lora-modules") + 1:]:
        if arg.startswith("--") or "=" not in arg:
            break
        name, path = arg.split("=", 1)
        out[name] = path
    return out


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a safetensors dtype name (2 when unknown)."""
    return _DTYPE_BYTES.get(dtype, 2)
