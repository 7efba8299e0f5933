"""vLLM starts and wall time of a per-class tune against the same grid without classes and against brute force
(issue 44, item 4).

The traffic, written here: a JSONL file of chats whose lines carry `class` (the form whose classes a tune's load
probes replay; a `bench.trace`'s timestamps would make every probe the trace's one level):

- `listcopy`: "copy this list exactly", the reply the list again: the answer repeats its input (n-gram speculation
  proposes it from the prompt);
- `story`: "write two sentences about X", the reply new text: nothing of it is in the prompt.

Each request's output length is its reference reply's token count. Then, in one invocation, the same grid (the
bundled model; speculation off / n-gram k=2 [/ k=4 ...], optionally crossed with prefix caching) three ways, each
into its own --out:

- per-class: `tune.classes: true` (one tune directory, its classes sharing its servers and stage cache);
- plain: the same recipe without classes (the mix's SLO);
- brute force: every setting x every class probed alone: per class and grid point, a plain tune of that one
  setting with `bench.classes.replay: <class>` (each class's traffic alone) in its own directory, with its own
  servers and stage cache: nothing shared between settings or classes; a class's winner is tune's own decision
  over its settings' winners (overlapping intervals are a tie, broken by tune's rule). (Not
  `--exhaustive`: that sweeps every load level without pruning, which measures the staged search, not the sharing
  of servers.)

Each tune's vLLM starts are read from its tune.json files (`servers`: one entry per start) where they carry them,
else counted as the `# <time> infertool serve:` header lines of the server logs under its directory (as
benchmarks/server_starts.py counts a run's); its wall time is measured around the command. Prints a table, the
ratios against the goals (per-class / plain wall time <= 1.5, per-class / brute force <= 0.5) and whether each
class's winner is the same per-class and by brute force.

    python benchmarks/tune_starts.py [--per-class-requests 30] [--k 2] [--prefix-caching] [--max-concurrency 4]
                                     [--max-probes 3] [--rounds 4 8] [--dtype bfloat16|float32] [--only plain ...]
                                     [--keep DIR] [--json]

Before each variant runs, its `tune --dry-run --json` gives the planned starts (and the estimate), printed beside
the measured ones. It starts vLLM many times (80-85 s each on a 2-core CPU, issue 44). The defaults are sized to
stay under an hour there: 2 settings (speculation off / n-gram k=2), 30 requests per class of at most ~100 output
tokens, loads up to 4 in at most 3 probes: the three variants make 10 starts between them and took 18 to 37 minutes
on a 2-core AVX2 CPU (docs/commands/tune.md has the figures). With bfloat16 the speculative setting's lossless check
may fail (a near tie flipped), and then no variant probes it: --dtype float32 measures the case where it passes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "tune-starts"
CLASSES = ("listcopy", "story")
GOALS = {"per_class_over_plain": 1.5, "per_class_over_brute": 0.5}
HEADER = " infertool serve: "  # a server log's first line: "# <time> infertool serve: <command line>"

WORDS = ["apple", "river", "copper", "lantern", "meadow", "violet", "harbor", "pencil", "thunder", "marble", "falcon",
         "orchard", "canyon", "velvet", "glacier", "saffron", "beacon", "willow", "ember", "quartz", "pepper", "cobalt"]
TOPICS = ["a lighthouse keeper", "a lost umbrella", "the first snow", "a bakery at dawn", "an old bicycle",
          "a quiet library", "a storm at sea", "a garden robot", "a city bus", "a paper kite", "a mountain hut"]
OPENERS = ["Nobody expected", "Every morning", "Long after midnight", "By the time the bell rang", "In the end"]
VERBS = ["waited for", "remembered", "carried", "painted", "followed", "mended", "listened to", "forgot"]


# ---------------------------------------------------------------------------------------------- the traffic
def listcopy_chats(n: int, seed: int) -> list[dict]:
    """``n`` chats whose reply repeats the prompt's list (class listcopy)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        items = [f"{rng.choice(WORDS)}-{rng.randint(10, 999)}" for _ in range(rng.randint(6, 10))]
        listed = "\n".join(items)
        out.append({"id": f"listcopy-{i}", "class": "listcopy", "messages": [
            {"role": "user", "content": f"Copy this list exactly, one item per line, and nothing else:\n{listed}"},
            {"role": "assistant", "content": listed}]})
    return out


def story_chats(n: int, seed: int) -> list[dict]:
    """``n`` chats whose reply is new text, nothing of it in the prompt (class story)."""
    rng = random.Random(seed + 1)
    out = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        reply = " ".join(f"{rng.choice(OPENERS)}, the {rng.choice(WORDS)} {rng.choice(VERBS)} the "
                         f"{rng.choice(WORDS)} near the {rng.choice(WORDS)}." for _ in range(rng.randint(2, 4)))
        out.append({"id": f"story-{i}", "class": "story", "messages": [
            {"role": "user", "content": f"Write two or three new sentences about {topic}."},
            {"role": "assistant", "content": reply}]})
    return out


def write_traffic(path: Path, per_class: int, seed: int = 0) -> dict[str, int]:
    """The two-class traffic, shuffled with ``seed``, one chat a line; returns the requests per class."""
    lines = [*listcopy_chats(per_class, seed), *story_chats(per_class, seed)]
    random.Random(seed).shuffle(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    counts: dict[str, int] = {}
    for x in lines:
        counts[x["class"]] = counts.get(x["class"], 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------- the recipes
def grid(ks: list[int], prefix_caching: bool) -> dict:
    """The serving grid: speculation off and n-gram k per ``ks`` (x prefix caching on / off)."""
    spec = [None, *({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
                    for k in ks)]
    return {"speculative": spec, **({"enable_prefix_caching": [True, False]} if prefix_caching else {})}


def base_recipe(args: argparse.Namespace, traffic: Path, requests: int) -> dict:
    """The tune every variant runs: the bundled model, the two-class traffic (every request a probe), the grid."""
    return {
        "name": NAME,
        "model": {"source": args.model, "dtype": args.dtype},
        "eval": {"suite": "builtin-corpus", "seq_len": 256, "accept": {"preset": "standard"}},
        "serve": {"max_model_len": 2048, "enforce_eager": True, "max_num_seqs": args.max_concurrency,
                  "dtype": "auto" if args.dtype == "bfloat16" else args.dtype, "cpu": {"kv_cache_space_gib": 1}},
        "bench": {"endpoint": "chat", "requests": requests, "prompt": {"source": str(traffic)},
                  "slo": {"ttft_ms": 3000, "tpot_ms": 250}, "cost_per_hour": 0.5},
        "tune": {"candidates": ["none"], "serve_grid": grid(args.k, args.prefix_caching),
                 "accuracy": {"rounds": list(args.rounds)},
                 "load": {"requests": requests, "max_concurrency": args.max_concurrency, "max_probes": args.max_probes,
                          "goodput_target": 0.9},
                 "max_trials": 64, "max_wall_s": args.max_wall_s},
    }


@dataclass
class Variant:
    """One way to tune the grid: its name, the recipes it runs (one, or one per class) and its --out."""

    name: str
    recipes: list[dict]
    out: Path
    classes: list[str] = field(default_factory=list)  # brute force: the class each recipe replays
    planned: int | None = None  # the starts its dry runs plan (set when it runs)


def variants(base: dict, classes: list[str], work: Path) -> list[Variant]:
    """per-class (tune.classes: true), plain (no classes), brute force (every setting x every class probed alone: a
    plain tune of one grid point replaying one class, each with its own servers and stage cache)."""
    per_class = json.loads(json.dumps(base))
    per_class["tune"]["classes"] = True
    brute, tags = [], []
    axes = sorted(base["tune"]["serve_grid"].items())
    points = [dict(zip([k for k, _ in axes], vs)) for vs in itertools.product(*[v for _, v in axes])]
    for c in classes:
        for i, point in enumerate(points):
            r = json.loads(json.dumps(base))
            r["name"] = f"{NAME}-{c}-s{i + 1}"
            r["bench"]["classes"] = {"replay": c}
            r["tune"]["serve_grid"] = {k: [v] for k, v in point.items()}
            brute.append(r)
            tags.append(c)
    return [Variant("per-class", [per_class], work / "per-class"), Variant("plain", [base], work / "plain"),
            Variant("brute force", brute, work / "brute", classes=tags)]


# ---------------------------------------------------------------------------------------------- what a tune did
def log_starts(folder: Path) -> int:
    """vLLM starts counted from the server logs under ``folder``: their ``# <time> infertool serve:`` lines."""
    n = 0
    for log in sorted(folder.rglob("*.log")):
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        n += sum(1 for line in text.splitlines() if line.startswith("# ") and HEADER in line)
    return n


def _servers(doc: object) -> list[dict] | None:
    """tune.json's ``servers`` (one per vLLM start) as plain data, or None where this tune.json has none."""
    got = getattr(doc, "servers", None)
    if got is None:
        got = getattr(doc, "extra", {}).get("servers")
    if not isinstance(got, list):
        return None
    return [s.to_dict() if hasattr(s, "to_dict") else s for s in got if isinstance(s, dict) or hasattr(s, "to_dict")]


def tune_docs(folder: Path) -> list[tuple[Path, object]]:
    """Every tune.json under ``folder`` (a per-class tune's: one per class), read as its record."""
    from infertool.tune.records import TuneDoc

    out = []
    for p in sorted(folder.rglob("tune.json")):
        try:
            out.append((p, TuneDoc.from_dict(json.loads(p.read_text(encoding="utf-8")))))
        except (OSError, ValueError):
            continue
    return out


def routing_docs(folder: Path) -> list[object]:
    """Every routing.json under ``folder`` (a per-class tune's), read as its record."""
    from infertool.tune.records import RoutingTable

    out = []
    for p in sorted(folder.rglob("routing.json")):
        try:
            out.append(RoutingTable.from_dict(json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return out


def starts(folder: Path) -> tuple[int, str]:
    """A tune directory's vLLM starts and where the count comes from: tune.json's (or routing.json's) ``servers``
    (each start once, a server the classes share counted once: by its log and key), else the server logs' header
    lines."""
    seen: set[tuple[str, str]] = set()
    recorded = False
    for doc in [d for _, d in tune_docs(folder)] + routing_docs(folder):
        servers = _servers(doc)
        if servers is None:
            continue
        recorded = True
        seen |= {(str(s.get("log")), str(s.get("key"))) for s in servers}
    if recorded:
        return len(seen), "tune.json servers"
    return log_starts(folder), "server log headers"


def winners(folder: Path, classes: list[str]) -> dict[str, str | None]:
    """The winning trial per class (a per-class tune: each class's tune.json under classes/<class>/; a plain tune:
    its one winner for every class) as trial ids."""
    docs = tune_docs(folder)
    by_class: dict[str, str | None] = {}
    for p, doc in docs:
        if p.parent.parent.name == "classes":
            by_class[p.parent.name] = getattr(doc, "winner", None)
    if by_class:
        return by_class
    win = next((getattr(d, "winner", None) for _, d in docs), None)
    return {c: win for c in classes}


def winner_record(folder: Path) -> list:
    """A plain tune's winning trial (its TrialRecord: objective, interval, settings), none when nothing won."""
    for _, doc in tune_docs(folder):
        trial = doc.trial(getattr(doc, "winner", None))
        return [trial] if trial is not None else []
    return []


@dataclass
class Outcome:
    """One variant measured: its vLLM starts (and their source), its wall time, its winners per class."""

    name: str
    starts: int
    starts_from: str
    wall_s: float
    winners: dict[str, str | None]
    exit_codes: list[int] = field(default_factory=list)
    planned: int | None = None  # the starts `tune --dry-run` planned for it

    def to_dict(self) -> dict:
        return {"name": self.name, "starts": self.starts, "planned_starts": self.planned,
                "starts_from": self.starts_from, "wall_s": round(self.wall_s, 1), "winners": self.winners,
                "exit_codes": self.exit_codes}


def outcome(v: Variant, wall_s: float, classes: list[str], exit_codes: list[int]) -> Outcome:
    """What a variant's --out holds after it ran (brute force: one tune directory per class under it)."""
    n, source = starts(v.out)
    if v.classes:  # brute force: a tune directory per setting and class; the class's winner: tune's own decision
        from infertool.tune import search  # over each setting's winner (overlapping intervals: its tie rule)

        best: dict[str, list] = {}
        for r, c in zip(v.recipes, v.classes):
            best.setdefault(c, []).extend(winner_record(v.out / r["name"]))
        wins = {}
        for c, recs in best.items():
            decision = search.decide(search.rank(recs), "cost") if recs else None
            wins[c] = decision.winner if decision is not None else None
    else:
        wins = winners(v.out, classes)
    return Outcome(v.name, n, source, wall_s, wins, exit_codes, v.planned)


def compare(results: list[Outcome], classes: list[str]) -> dict:
    """The ratios against the goals and whether the winners agree (per class: per-class against brute force)."""
    by = {o.name: o for o in results}
    pc, plain, brute = by.get("per-class"), by.get("plain"), by.get("brute force")

    def ratio(a: Outcome | None, b: Outcome | None, what: str) -> float | None:
        x, y = (getattr(a, what), getattr(b, what)) if a is not None and b is not None else (None, None)
        return round(x / y, 3) if x is not None and y else None

    out: dict = {}
    for key, other in (("per_class_over_plain", plain), ("per_class_over_brute", brute)):
        wall, st = ratio(pc, other, "wall_s"), ratio(pc, other, "starts")
        out[key] = {"wall": wall, "starts": st, "goal": GOALS[key],
                    "met": None if wall is None else wall <= GOALS[key]}
    agree = {c: (pc.winners.get(c) if pc else None, brute.winners.get(c) if brute else None) for c in classes}
    out["winners"] = {c: {"per_class": a, "brute_force": b, "agree": a is not None and a == b}
                      for c, (a, b) in agree.items()}
    out["winners_agree"] = all(w["agree"] for w in out["winners"].values())
    return out


def table(results: list[Outcome], summary: dict) -> str:
    """The printed answer: a row per variant, the ratios and the winners."""
    rows = [f"{'tune':12s} {'vLLM starts':>11s} {'planned':>7s} {'wall s':>9s}  starts from         winners"]
    for o in results:
        wins = ", ".join(f"{c}: {w or 'none'}" for c, w in o.winners.items())
        planned = "-" if o.planned is None else str(o.planned)
        rows.append(f"{o.name:12s} {o.starts:>11d} {planned:>7s} {o.wall_s:>9.0f}  {o.starts_from:18s} {wins}")
    for key, label in (("per_class_over_plain", "per-class / plain"), ("per_class_over_brute", "per-class / brute")):
        r = summary[key]
        met = "not measured" if r["met"] is None else ("met" if r["met"] else "MISSED")
        wall = "-" if r["wall"] is None else f"{r['wall']:.2f}"
        st = "-" if r["starts"] is None else f"{r['starts']:.2f}"
        rows.append(f"{label}: wall {wall} (goal <= {r['goal']}: {met}), starts {st}")
    rows.append("winners agree (per-class against brute force, per class): "
                + ("yes" if summary["winners_agree"] else "no") + "; "
                + "; ".join(f"{c}: {w['per_class'] or 'none'} / {w['brute_force'] or 'none'}"
                            for c, w in summary["winners"].items()))
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- running it
def planned_starts(dry: dict) -> int | None:
    """The vLLM starts a `tune --dry-run --json` plans (None: a dry run without a start plan)."""
    plan = dry.get("starts")
    return plan.get("starts") if isinstance(plan, dict) and isinstance(plan.get("starts"), int) else None


def dry_run(path: Path, out: Path) -> int | None:
    """The planned starts of one recipe (its `tune --dry-run --json`); None when the dry run fails."""
    p = subprocess.run([sys.executable, "-m", "infertool", "tune", str(path), "--out", str(out), "--dry-run",
                        "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    try:
        return planned_starts(json.loads(p.stdout)) if p.returncode == 0 else None
    except ValueError:
        return None


def run_variant(v: Variant, work: Path, timeout_s: float) -> tuple[float, list[int]]:
    """Each of the variant's recipes tuned into its --out, one after the other; the wall time of them all."""
    import yaml

    codes = []
    paths = []
    for r in v.recipes:
        path = work / f"{r['name']}-{v.name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(r, sort_keys=False), encoding="utf-8")
        paths.append(path)
    plans = [dry_run(path, v.out) for path in paths]
    v.planned = sum(n for n in plans if n is not None) if all(n is not None for n in plans) else None
    t0 = time.monotonic()
    for path in paths:
        print(f"{v.name}: infertool tune {path} --out {v.out}", file=sys.stderr, flush=True)
        p = subprocess.run([sys.executable, "-m", "infertool", "tune", str(path), "--out", str(v.out), "--json"],
                           capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        (work / f"{path.stem}.stderr.txt").write_text(p.stderr, encoding="utf-8")
        (work / f"{path.stem}.json").write_text(p.stdout, encoding="utf-8")
        codes.append(p.returncode)
        if p.returncode not in (0, 1):  # 1: no configuration passed, still a measured tune
            print(p.stderr[-3000:], file=sys.stderr)
    return time.monotonic() - t0, codes


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="the model's dtype (float32: speculation's verification and plain decoding agree to the last "
                         "bit more often, so its lossless check passes as it should; bf16 near ties may flip)")
    ap.add_argument("--per-class-requests", type=int, default=30,
                    help="requests of each class (a probe sends them all; a class needs 29 at goodput 0.9, 0.95)")
    ap.add_argument("--k", type=int, nargs="*", default=[2], help="n-gram num_speculative_tokens, each a setting")
    ap.add_argument("--prefix-caching", action="store_true", help="cross the grid with prefix caching on / off")
    ap.add_argument("--max-concurrency", type=int, default=4, help="the load search's top (and serve.max_num_seqs)")
    ap.add_argument("--max-probes", type=int, default=3, help="tune.load.max_probes")
    ap.add_argument("--rounds", type=int, nargs="+", default=[4, 8], help="accuracy screening rounds")
    ap.add_argument("--max-wall-s", type=float, default=1800,
                    help="each tune's tune.max_wall_s (no trial starts after it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="+", choices=["per-class", "plain", "brute force"], help="run these variants")
    ap.add_argument("--keep", help="the work folder (traffic, recipes, tune directories, logs); default: a temp one")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tune-starts-"))
    work.mkdir(parents=True, exist_ok=True)
    counts = write_traffic(work / "traffic.jsonl", args.per_class_requests, args.seed)
    classes = sorted(counts)
    base = base_recipe(args, work / "traffic.jsonl", sum(counts.values()))
    results = []
    for v in variants(base, classes, work):
        if args.only and v.name not in args.only:
            continue
        wall, codes = run_variant(v, work, timeout_s=3 * args.max_wall_s)
        results.append(outcome(v, wall, classes, codes))
    summary = compare(results, classes)
    if args.json:
        print(json.dumps({"work": str(work), "classes": counts, "results": [o.to_dict() for o in results],
                          **summary}, indent=2))
    else:
        print(f"traffic: {counts} ({work / 'traffic.jsonl'}); grid: {base['tune']['serve_grid']}")
        print(table(results, summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
