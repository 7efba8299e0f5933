"""Traffic from data: ShareGPT (vLLM bench's sample), chat-conversation JSONL files, shared-prefix workloads and
timestamped traces.

The shapes other parts of bench build on (the load engineer drives them):

- ``Conversation(id, turns, output_lens, system)``: one session of multi-turn replay: its user turns in order,
  the output length (tokens) to ask for after each, an optional system prompt. ``conversations(bench, n)``
  gives them (sharegpt or a conversations JSONL, at most ``bench.prompt.multi_turn.max_turns`` user turns each).
- ``TraceEntry(t_s, prompt, output_len)``: one request of a timestamped trace, ``t_s`` seconds after the
  trace's first request. ``load_trace(path)`` reads one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conversation:
    """One multi-turn session: ``turns[i]`` is the i-th user message, ``output_lens[i]`` the tokens to ask for
    in reply to it (the dataset's own reply length), ``system`` a system prompt or None."""

    id: str
    turns: list[str]
    output_lens: list[int]
    system: str | None = None


@dataclass(frozen=True)
class TraceEntry:
    """One request of a timestamped trace: sent ``t_s`` seconds after the first, ``prompt`` text, asking for
    ``output_len`` tokens."""

    t_s: float
    prompt: str
    output_len: int
