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
import re
from pathlib import Path

import yaml

from infertool.atomic import OutputPathError, check_output_dir, write_text
from infertool.data.suites import load_suite
from infertool.errors import UsageError


def _task_id(suite: str, task: str) -> str:
    return "infertool_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{suite}_{task}").strip("_").lower()


def export_lm_eval(suite_name: str, dest: str | Path, *, force: bool = False) -> dict:
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
    task_ids = [_task_id(suite.name, task.name) for task in suite.tasks]
    group = _task_id(suite.name, "")
    planned = [dest / f"{tid}{ext}" for tid in task_ids for ext in (".jsonl", ".yaml")] + [dest / f"_{group}.yaml"]
    there = [p for p in planned if p.exists()]
    if there and not force:
        what = f"{there[0]} (and {len(there) - 1} more) already exist" if len(there) > 1 else f"{there[0]} already exists"
        raise UsageError(f"{what}; not overwriting",
                         hint="pass --force to overwrite the exported tasks, or choose another directory")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for task, tid in zip(suite.tasks, task_ids):
        data = dest / f"{tid}.jsonl"
        if task.type == "perplexity":
            if task.source and task.source.startswith("builtin:pydoc_topics"):
                from infertool.data import corpus

                name = task.source.split(":")[2] if task.source.count(":") == 2 else None
                pairs = zip(corpus.part(name).keys, corpus.part(name).docs) if name else corpus.topics()
                docs = [{"id": k, "text": t} for k, t in pairs]
            else:
                docs = [{"id": str(i), "text": p} for i, p in enumerate(task.text.split("\n\n"))]
            rows = docs
        else:
            rows = task.items
        write_text(data, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        cfg: dict = {
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
    return {"suite": suite.name, "dir": str(dest), "group": group, "tasks": task_ids, "files": written,
            "usage": f"lm_eval --model hf --model_args pretrained=MODEL_DIR --include_path {dest} --tasks {group}"}
