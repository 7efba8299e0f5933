"""config.json against the safetensors headers: does the config describe the weights that are there?

A config.json copied from another model (a 70B config over 8B weights) makes every figure infertool derives from
it wrong: the plan would size a 70B (and "fit" a quantized model larger than its original), the preflight would
check layers that do not exist. ``config_vs_weights`` compares, without loading a tensor, the decoder's layer count
and the shape every tensor of a known role must have (embedding, attention and MLP projections, norms) with the
headers, and says each disagreement with its figures. It returns findings (strings), never raises for a
disagreement: `infertool init` refuses with them, and the check registry runs it as one of its checks.

Only what can be compared is: weights stored packed (int4 in I32 containers) have no shape of their own, so
quantized linear weights are compared only when stored unpacked (float / fp8); tensors of roles not listed here
(experts, vision towers, biases) are not compared; a directory without safetensors files has nothing to compare.
"""

from __future__ import annotations

import re
from pathlib import Path

from infertool.models.info import ConfigNumbers, load_config, read_safetensors_header, weight_files

# weights stored as their own shape (a packed int4 weight's stored shape is its container's)
_UNPACKED = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
# a decoder layer of the language model: "model.layers.N.REST" (also under a multimodal wrapper's language_model)
_LAYER_RE = re.compile(r"^(?P<prefix>(?:[\w.]*\.)?model\.)layers\.(?P<n>\d+)\.(?P<rest>.+)$")
_OTHER_TOWERS = ("vision", "visual", "audio", "encoder", "mm_projector")
# multi-head latent attention (DeepSeek V2/V3): q / kv go through ranks of their own
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim")
MAX_FINDINGS = 20


def _fmt(shape: list[int] | tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expected_shapes(n: ConfigNumbers, mla: bool) -> dict[str, list[tuple[int, ...]]]:
    """The shapes config.json implies for each tensor role of a decoder layer (key: the name after
    ``layers.N.``) and for the embedding / head (key: the whole name after the ``model.`` prefix, or lm_head):
    each a list of accepted shapes (a q projection may carry an output gate: twice the rows). ``mla``: multi-head
    latent attention, whose q / kv projections have ranks of their own."""
    h, heads, inter, vocab = n.hidden, n.heads, n.intermediate, n.vocab
    kv = n.kv_heads or heads
    hd = n.head_dim or (h // heads if h and heads and h % heads == 0 else None)
    out: dict[str, list[tuple[int, ...]]] = {}
    if h:
        out.update({"input_layernorm.weight": [(h,)], "post_attention_layernorm.weight": [(h,)]})
        if vocab:
            out.update({"embed_tokens.weight": [(vocab, h)], "lm_head.weight": [(vocab, h)]})
    if h and heads and hd and not mla:
        q, k = heads * hd, (kv or heads) * hd
        out.update({"self_attn.q_proj.weight": [(q, h), (2 * q, h)], "self_attn.k_proj.weight": [(k, h)],
                    "self_attn.v_proj.weight": [(k, h)], "self_attn.o_proj.weight": [(h, q)]})
    if h and inter:
        out.update({"mlp.gate_proj.weight": [(inter, h)], "mlp.up_proj.weight": [(inter, h)],
                    "mlp.down_proj.weight": [(h, inter)]})
    return out


def _headers(path: Path) -> dict[str, tuple[list[int], str]]:
    """Every tensor of the model's safetensors files: name -> (shape, dtype), headers only."""
    tensors: dict[str, tuple[list[int], str]] = {}
    for f in weight_files(path):
        for name, entry in read_safetensors_header(f).items():
            tensors[name] = (list(entry.shape), entry.dtype)
    return tensors


def _layer_findings(n: ConfigNumbers, layers: dict[int, str]) -> list[str]:
    """The decoder's layer count in config.json against the layer indices the weights hold."""
    said = n.layers
    if said is None or not layers:
        return []
    held = sorted(layers)
    extra = n.nextn_layers or 0  # multi-token-prediction layers after the decoder's
    findings = []
    count = held[-1] + 1
    if not said <= count <= said + extra:
        findings.append(f"config.json says {said} layers (num_hidden_layers), the weights hold {count} "
                        f"({layers[held[0]]}layers.{held[0]} to {layers[held[-1]]}layers.{held[-1]})")
    missing = sorted(set(range(min(said, count))) - set(held))
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        findings.append(f"the weights have no tensors for layer(s) {shown} of the {said} config.json says")
    return findings


def config_vs_weights(model_dir: str | Path) -> list[str]:
    """Each way config.json disagrees with the safetensors headers of ``model_dir``, with its figures ("config.json
    says 80 layers (num_hidden_layers), the weights hold 32 (...)"; "model.layers.0.mlp.down_proj.weight is [4096,
    14336] in the weights, config.json implies [8192, 28672]"); [] when they agree or there is nothing to compare.
    One finding per tensor role (its first tensor that disagrees), at most MAX_FINDINGS. A config.json or a header
    that cannot be read raises the model's own error (ModelError)."""
    path = Path(model_dir)
    config = load_config(path)
    tensors = _headers(path)
    if not tensors:
        return []
    n = config.numbers()
    want = expected_shapes(n, any(k in config.lm for k in _MLA_KEYS))
    layers: dict[int, str] = {}
    findings: list[str] = []
    seen_roles: set[str] = set()

    def compare(name: str, role: str, shape: list[int], dtype: str) -> None:
        accepted = want.get(role)
        if not accepted or role in seen_roles or dtype not in _UNPACKED or tuple(shape) in accepted:
            return
        seen_roles.add(role)
        findings.append(f"{name} is {_fmt(shape)} in the weights, config.json implies {_fmt(accepted[0])}"
                        + _because(role, n))

    for name in sorted(tensors, key=_natural):
        shape, dtype = tensors[name]
        if any(t in name for t in _OTHER_TOWERS):
            continue
        m = _LAYER_RE.match(name)
        if m:
            layers.setdefault(int(m.group("n")), m.group("prefix"))
            compare(name, m.group("rest"), shape, dtype)
        elif name.endswith("model.embed_tokens.weight"):
            compare(name, "embed_tokens.weight", shape, dtype)
        elif name == "lm_head.weight" or name.endswith(".lm_head.weight"):
            compare(name, "lm_head.weight", shape, dtype)
    return (_layer_findings(n, layers) + findings)[:MAX_FINDINGS]


def _because(role: str, n: ConfigNumbers) -> str:
    """The config.json fields the expected shape comes from."""
    if role.startswith("mlp."):
        return f" (hidden_size {n.hidden}, intermediate_size {n.intermediate})"
    if role.startswith("self_attn."):
        return f" (hidden_size {n.hidden}, {n.heads} heads / {n.kv_heads or n.heads} KV heads)"
    if role in ("embed_tokens.weight", "lm_head.weight"):
        return f" (vocab_size {n.vocab}, hidden_size {n.hidden})"
    return f" (hidden_size {n.hidden})"


def _natural(name: str) -> tuple:
    """Sort key: layer 2 before layer 10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
