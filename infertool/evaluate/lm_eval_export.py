"""Write an infertool suite as lm-evaluation-harness task YAMLs (``dataset_path: json``), with the data
copied next to them, so the same items run in lm-eval::

    infertool eval export-lm-eval synthetic-mc out/lm-eval-tasks
    lm_eval --model hf --model_args pretrained=DIR --include_path out/lm-eval-tasks --tasks infertool_synthetic_mc

multiple_choice -> output_type multiple_choice (acc, acc_norm: the same scoring as infertool's);
generate -> generate_until with greedy decoding and exact_match after leading whitespace is removed
(contains/regex tasks are approximated with a regex filter); perplexity -> loglikelihood_rolling
(lm-eval's per-document word/byte perplexity and bits_per_byte: NOT the GPTQ window protocol).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infertool.atomic import OutputPathError, check_output_dir, write_text
from infertool.data.suites import SuiteTask, load_suite
from infertool.errors import UsageError


def _task_id(suite: str, task: str) -> str:
    return "infertool_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{suite}_{task}").strip("_").lower()


def export_lm_eval(suite_name: str, dest: str | Path, *, force: bool = False) -> LmEvalExport:
    """Write the suite's tasks into ``dest``. A file that is already there is replaced only with ``force``
    (checked for every file before anything is written); each file is written whole (temp file + rename)."""
    suite = load_suite(suite_name)
    try:
        check_output_dir(dest)  # not a file, a fifo, /proc/...; its parents folders
    except OutputPathError as e:
        raise UsageError(str(e), hint=e.hint) from None
    dest = Path(dest).resolve()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} is a file, not a directory", hint="give a directory for the lm-eval tasks")
    skipped: dict[str, str] = {}  # tasks an lm-eval task cannot express: {name: why}
    kept = []
    for task in suite.tasks:
        try:
            kept.append((task, _rows(task)))
        except _NoForm as e:
            skipped[task.name] = str(e)
    if not kept:
        raise UsageError(f"no task of suite {suite.name} has an lm-eval form: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
                         hint="score it with `infertool eval`, which runs every task form")
    task_ids = [_task_id(suite.name, task.name) for task, _ in kept]
    group = _task_id(suite.name, "")
    planned = [dest / f"{tid}{ext}" for tid in task_ids for ext in (".jsonl", ".yaml")] + [dest / f"_{group}.yaml"]
    there = [p for p in planned if p.exists()]
    if there and not force:
        what = f"{there[0]} (and {len(there) - 1} more) already exist" if len(there) > 1 else f"{there[0]} already exists"
        raise UsageError(f"{what}; not overwriting",
                         hint="pass --force to overwrite the exported tasks, or choose another directory")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for (task, rows), tid in zip(kept, task_ids):
        data = dest / f"{tid}.jsonl"
        write_text(data, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        cfg: dict[str, Any] = {  # Any: JSON / YAML values
            "task": tid,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
        }
        if task.type == "multiple_choice":
            cfg.update({"output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
                        "doc_to_target": "answer", "target_delimiter": task.delimiter,
                        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]})
        elif task.type == "generate":
            cfg.update({"output_type": "generate_until", "doc_to_text": "{{prompt}}", "doc_to_target": "{{target}}",
                        "target_delimiter": "",
                        "generation_kwargs": {"until": list(task.stop), "max_gen_toks": task.max_tokens, "do_sample": False,
                                              "temperature": 0.0},
                        "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
                        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                                         "ignore_case": False, "ignore_punctuation": False}]})
            if task.chat:
                cfg["metadata"] = {"note": "run with --apply_chat_template, as infertool's chat: true does"}
        else:
            cfg.update({"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
                        "metric_list": [{"metric": m, "aggregation": m, "higher_is_better": False}
                                        for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]})
        path = dest / f"{tid}.yaml"
        write_text(path, f"# exported by `infertool eval export-lm-eval {suite.name}` from {suite.path}\n"
                   + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
        written += [str(path), str(data)]
    gpath = dest / f"_{group}.yaml"
    write_text(gpath, yaml.safe_dump({"group": group, "task": task_ids}, sort_keys=False))
    written.append(str(gpath))
    return LmEvalExport(suite.name, str(dest), group, task_ids, skipped, written,
                        f"lm_eval --model hf --model_args pretrained=MODEL_DIR --include_path {dest} --tasks {group}")


@dataclass(frozen=True)
class LmEvalExport:
    """What ``export_lm_eval`` wrote (`infertool eval export-lm-eval --json` prints it as it is)."""

    suite: str
    dir: str
    group: str
    tasks: list[str]  # the lm-eval task ids written
    skipped: dict[str, str]  # tasks an lm-eval task cannot express: {name: why}
    files: list[str]
    usage: str  # the lm_eval command line that runs them


class _NoForm(Exception):
    """A task the exported lm-eval task would not score as infertool does (the message says why)."""


def _rows(task: SuiteTask) -> list[dict[str, Any]]:  # Any: JSON / YAML values
    """A task's documents as lm-eval reads them: a perplexity task's texts; the items (a chat item, one user
    message, with it as its ``prompt``: lm-eval's ``--apply_chat_template`` renders it as that turn). ``_NoForm``
    for a task lm-eval would score otherwise: a generative task matched by ``contains`` or a regex (the export
    scores exact match), or a chat item of several turns or with a system message (one prompt per document)."""
    if task.type == "perplexity":
        if task.source and task.source.startswith("builtin:pydoc_topics"):
            from infertool.data import corpus

            name = task.source.split(":")[2] if task.source.count(":") == 2 else None
            pairs = zip(corpus.part(name).keys, corpus.part(name).docs) if name else corpus.topics()
            return [{"id": k, "text": t} for k, t in pairs]
        return [{"id": str(i), "text": p} for i, p in enumerate((task.text or "").split("\n\n"))]
    if task.type in ("json", "tool_call"):
        raise _NoForm(f"a {task.type} task checks a server's structured answers, which lm-eval does not score")
    if task.type == "generate" and getattr(task, "match", "exact") != "exact":
        raise _NoForm(f"matched by {task.match}, which the exported exact-match metric would not reproduce")
    chats = [it for it in task.items if "messages" in it]
    bad = [str(it["id"]) for it in chats if [m.get("role") for m in it["messages"]] != ["user"]]
    if bad:
        raise _NoForm(f"{len(bad)} chat item(s) ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}) hold more than "
                      "one turn or a system message; an lm-eval task has one prompt per document")
    return [{**{k: v for k, v in it.items() if k != "messages"}, "prompt": it["messages"][0]["content"]}
            if "messages" in it else it for it in task.items]


# --------------------------------------------------------------------------------------------
# The lm-eval tasks infertool ships (infertool/_data/lm_eval/): items WE wrote, in lm-eval's format
# --------------------------------------------------------------------------------------------

SHIPPED_SEED = 2126
SHIPPED_PREFIX = "infertool_"  # a task named so finds its YAML in the shipped folder (LmEvalSpec.include_path)
_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena"]
_THINGS = ["apples", "pencils", "stickers", "marbles", "cards", "shells", "coins", "books"]
_GSM_REGEX = "#### (\\-?[0-9\\.\\,]+)"


def _gsm_problem(rng: random.Random, i: int) -> dict[str, Any]:  # Any: JSON / YAML values
    """One word problem of two or three steps; its answer is worked out and ends with ``#### N`` (GSM8K's form)."""
    name, other = rng.sample(_NAMES, 2)
    thing = rng.choice(_THINGS)
    kind = i % 3
    if kind == 0:
        boxes, per, given = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 9)
        total = boxes * per
        q = (f"{name} has {boxes} boxes with {per} {thing} in each box. {name} gives {given} {thing} to {other}. "
             f"How many {thing} does {name} have left?")
        a = f"{name} has {boxes} * {per} = {total} {thing}. After giving {given} away, {total} - {given} = {total - given}."
        ans = total - given
    elif kind == 1:
        a0, bought, days = rng.randint(3, 30), rng.randint(2, 8), rng.randint(2, 6)
        ans = a0 + bought * days
        q = (f"{name} starts with {a0} {thing} and buys {bought} more every day for {days} days. "
             f"How many {thing} does {name} have at the end?")
        a = f"{name} buys {bought} * {days} = {bought * days} {thing}. {a0} + {bought * days} = {ans}."
    else:
        mine, theirs = rng.randint(10, 60), rng.randint(2, 9)
        ans = mine + mine * theirs
        q = (f"{other} has {theirs} times as many {thing} as {name}. {name} has {mine} {thing}. "
             f"How many {thing} do they have together?")
        a = f"{other} has {theirs} * {mine} = {mine * theirs} {thing}. Together {mine} + {mine * theirs} = {ans}."
    return {"id": f"gsm-{i:03d}", "question": q, "answer": f"{a}\n#### {ans}"}


def _chat_question(rng: random.Random, i: int) -> dict[str, Any]:  # Any: JSON / YAML values
    """A short question with a one-number answer, for a chat model (the model's chat template)."""
    kind = i % 3
    if kind == 0:
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        return {"id": f"chat-{i:03d}", "question": f"What is {a} plus {b}? Reply with the number only.", "target": str(a + b)}
    if kind == 1:
        words = rng.sample(_THINGS, rng.randint(2, 6))
        return {"id": f"chat-{i:03d}", "question": f"How many words are in this list: {', '.join(words)}? "
                "Reply with the number only.", "target": str(len(words))}
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return {"id": f"chat-{i:03d}", "question": f"What is {a} times {b}? Reply with the number only.", "target": str(a * b)}


def _jsonl(rows: list[dict[str, Any]]) -> str:  # Any: JSON / YAML values
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _task_yaml(cfg: dict[str, Any], note: str) -> str:  # Any: JSON / YAML values
    return (f"# {note}\n# Generated by `python -m infertool.evaluate.lm_eval_export infertool/_data/lm_eval`; "
            "do not edit by hand.\n" + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))


def _json_task(name: str, data: str, train: str | None = None, **more: Any) -> dict[str, Any]:  # Any: YAML values
    """A ``dataset_path: json`` task over a data file beside it (a relative name: infertool's engine writes a copy
    with the absolute path; lm_eval run by hand resolves it from the current folder); ``train``: its few-shot file."""
    files = {"test": data, **({"train": train} if train else {})}
    return {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": files}, "test_split": "test", **more}


_EXACT = {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": False,
          "ignore_punctuation": False}


def shipped_files() -> dict[str, str]:
    """Every file of the shipped lm-eval tasks, {file name: content}: the synthetic multiple-choice and generative
    items of the built-in suites (the same items as evals/), a GSM8K-style word-problem task of our own (answer
    after ``####``, taken by a regex filter) and a chat task (short questions, a number taken by a regex)."""
    import random

    mc, gen = load_suite("synthetic-mc"), load_suite("synthetic-gen")
    rng = random.Random(SHIPPED_SEED)
    shots = [_gsm_problem(rng, i) for i in range(3)]
    chat_rng = random.Random(SHIPPED_SEED + 1)
    return {
        "infertool_mc.jsonl": _jsonl([it for t in mc.tasks for it in t.items]),
        "infertool_mc.yaml": _task_yaml(_json_task(
            "infertool_mc", "infertool_mc.jsonl", output_type="multiple_choice", doc_to_text="{{question}}",
            doc_to_choice="{{choices}}", doc_to_target="answer", target_delimiter=mc.tasks[0].delimiter,
            metric_list=[{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                         {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]),
            "infertool's synthetic multiple choice (the synthetic-mc suite's items), scored by log-likelihood"),
        "infertool_gen.jsonl": _jsonl([it for t in gen.tasks for it in t.items]),
        "infertool_gen.yaml": _task_yaml(_json_task(
            "infertool_gen", "infertool_gen.jsonl", output_type="generate_until", doc_to_text="{{prompt}}",
            doc_to_target="{{target}}", target_delimiter="",
            generation_kwargs={"until": ["\n"], "max_gen_toks": 16, "do_sample": False, "temperature": 0.0},
            filter_list=[{"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
            metric_list=[_EXACT]),
            "infertool's synthetic generation (the synthetic-gen suite's items): greedy, exact match"),
        "infertool_gsm_style.train.jsonl": _jsonl([{**s, "id": f"shot-{k}"} for k, s in enumerate(shots)]),
        "infertool_gsm_style.jsonl": _jsonl([_gsm_problem(rng, i) for i in range(40)]),
        "infertool_gsm_style.yaml": _task_yaml(_json_task(
            "infertool_gsm_style", "infertool_gsm_style.jsonl", train="infertool_gsm_style.train.jsonl",
            output_type="generate_until", doc_to_text="Question: {{question}}\nAnswer:", doc_to_target="{{answer}}",
            target_delimiter=" ", fewshot_split="train", num_fewshot=3, fewshot_config={"sampler": "first_n"},
            generation_kwargs={"until": ["Question:", "\n\n"], "max_gen_toks": 96, "do_sample": False,
                               "temperature": 0.0},
            filter_list=[{"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": _GSM_REGEX},
                                                              {"function": "take_first"}]}],
            metric_list=[{**_EXACT, "ignore_case": True, "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}]),
            "GSM8K-style word problems infertool wrote (seeded): the answer follows ####, taken by a regex filter"),
        "infertool_chat.jsonl": _jsonl([_chat_question(chat_rng, i) for i in range(30)]),
        "infertool_chat.yaml": _task_yaml(_json_task(
            "infertool_chat", "infertool_chat.jsonl", output_type="generate_until", doc_to_text="{{question}}",
            doc_to_target="{{target}}", target_delimiter="",
            generation_kwargs={"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False, "temperature": 0.0},
            filter_list=[{"name": "number", "filter": [{"function": "regex", "regex_pattern": "(-?[0-9]+)"},
                                                       {"function": "take_first"}]}],
            metric_list=[_EXACT]), "short questions with a one-number answer, for chat models: run with "
            "apply_chat_template (the model's chat template; eval.lm_eval.apply_chat_template: true)"),
    }


def shipped_dir() -> Path:
    """The folder of the shipped lm-eval tasks (infertool/_data/lm_eval)."""
    from importlib import resources

    return Path(str(resources.files("infertool") / "_data" / "lm_eval"))


def write_shipped(dest: str | Path) -> list[str]:
    """Write shipped_files() into ``dest`` (the repository's infertool/_data/lm_eval); a test checks they match."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in shipped_files().items():
        write_text(dest / name, text)
        out.append(str(dest / name))
    return out


if __name__ == "__main__":  # pragma: no cover - the regeneration command
    import sys

    for p in write_shipped(sys.argv[1] if len(sys.argv) > 1 else "infertool/_data/lm_eval"):
        print(p)
