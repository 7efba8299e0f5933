"""`tune.classes` / `tune --per-class`: a search per traffic class over the same trials (the accuracy evidence
shared, capacity per class), tuned-<class>.yaml and routing.json, one deployment when one configuration is
within 5 % of every class's best, and `serve TUNE_DIR --emit k8s`: a Deployment and Service per configuration
and an HTTPRoute on the class header, validated. With the stand-in stage work of tests/test_tune.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool.cli import app
from infertool.errors import UsageError
from infertool.recipe import validate_recipe_data
from infertool.tune import space
from tests.test_tune import Stand, smol, tune_recipe  # noqa: F401 - smol: the fixture

CRDS = Path(__file__).parent / "fixtures" / "crds"


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def classed_recipe(model: Path, tmp_path: Path, classes=True, names=("chat", "rag"), requests: int = 120,
                   **tune) -> dict:
    """The tune test recipe over a prompt file whose lines carry a class: 3 of every 4 the first, 1 the second."""
    prompts = tmp_path / "prompts.jsonl"
    a, b = names
    prompts.write_text("".join(json.dumps({"prompt": f"question {i} " * 4, "class": a if i % 4 else b}) + "\n"
                               for i in range(4)))
    data = tune_recipe(model, tmp_path, candidates=["none", {"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}],
                       serve_grid={"max_num_seqs": [4]}, classes=classes, **tune)
    data["bench"].update(requests=requests, prompt={"source": str(prompts)})
    data["target"] = {"peak_rps": 10.0}
    return data


class ClassStand(Stand):
    """Capacity per class: ``loads[(class, candidate label)] = (max load, $/1M, requests/s per replica)``."""

    def capacity(self, ctx):
        trial, cls = ctx.job.trial, ctx.job.tune.bench.classes.replay
        assert cls is not None and ctx.job.tune.bench.slo is not None  # each class replayed alone, under its SLO
        self.calls.append(f"capacity:{cls}:{trial.id}")
        load, cost, rps = self.loads[(cls, trial.candidate.label)]
        at = {"cost": {"per_1m_output_tokens": cost}, "tpot_ms": {"p50": 50.0}, "request_throughput": rps,
              "goodput": {"requests_per_s": rps}}
        return {"max_load": load, "at_max_load": at, "probes": [], "stopped": "stand-in", "max_load_ci": [load, load + 1]}


W8 = "W8A8 (llmcompressor)"


def _stand(monkeypatch, loads):
    return ClassStand(monkeypatch, verdicts={W8: "PASS"}, loads=loads, served={})


def test_two_classes_get_different_winners_tuned_recipes_and_a_routing_table(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import run_per_class
    from infertool.tune.records import RoutingTable

    r = validate_recipe_data(classed_recipe(smol, tmp_path, classes=["chat", {"name": "rag", "slo": {"ttft_ms": 3000}}]))
    ids = {t.candidate.label: t.id for t in space.trials(r)}
    stand = _stand(monkeypatch, {("chat", "original"): (4, 8.0, 2.0), ("chat", W8): (8, 4.0, 4.0),
                                 ("rag", "original"): (2, 3.0, 1.5), ("rag", W8): (2, 6.0, 1.0)})
    per = run_per_class(r)
    d = Path(per.tune_dir)
    # the accuracy evidence is shared: quantized, referenced and screened once; capacity once per class and trial
    assert sum(c.startswith("quantize:") for c in stand.calls) == 1
    assert stand.calls.count("reference:ref") == 1 and sum(c.startswith("screen:") for c in stand.calls) == 1
    assert sorted(c for c in stand.calls if c.startswith("capacity:")) == sorted(
        f"capacity:{k}:{i}" for k in ("chat", "rag") for i in ids.values())
    table = RoutingTable.from_dict(json.loads((d / "routing.json").read_text()))
    by = {c.name: c for c in table.classes}
    assert by["chat"].configuration == ids[W8] and by["rag"].configuration == ids["original"]
    assert table.winners_differ and not table.one_deployment and len(table.deployments) == 2
    # share of the traffic (3 of 4 lines chat) x target.peak_rps 10; replicas = ceil(peak / req/s per replica)
    assert by["chat"].share == pytest.approx(0.75) and by["chat"].peak_rps == pytest.approx(7.5)
    assert by["chat"].replicas == math.ceil(7.5 / 4.0) == 2 and by["rag"].replicas == math.ceil(2.5 / 1.5) == 2
    assert by["chat"].max_load == 8 and by["chat"].max_load_ci == [8, 9] and by["chat"].cost_per_1m == 4.0
    assert by["rag"].slo == {"ttft_ms": 3000.0} and by["chat"].slo == {"ttft_ms": 1000.0}
    # each class's recipe: its winner, as every command takes it, replaying its own class
    for name, label in (("chat", "W8A8"), ("rag", None)):
        assert by[name].recipe == f"tuned-{name}.yaml"
        tuned = validate_recipe_data(yaml.safe_load((d / f"tuned-{name}.yaml").read_text()))
        assert (tuned.quantize.scheme if tuned.quantize else None) == label and tuned.bench.classes.replay == name
    # what one configuration would cost instead: W8A8 for both, 0.75 x 4 + 0.25 x 6, against the per-class 3.75
    assert table.per_class.cost_per_1m == pytest.approx(0.75 * 4.0 + 0.25 * 3.0)
    assert table.single.configuration == ids[W8] and table.single.cost_per_1m == pytest.approx(4.5)
    assert table.single.within is False  # rag: 6 against its best 3
    # again: every stage reused
    stand.calls.clear()
    run_per_class(validate_recipe_data(classed_recipe(smol, tmp_path, classes=["chat", {"name": "rag", "slo": {"ttft_ms": 3000}}])))
    assert stand.calls == []


def test_one_configuration_within_five_percent_of_every_class_is_one_deployment(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import run_per_class, summary_lines

    r = validate_recipe_data(classed_recipe(smol, tmp_path))
    ids = {t.candidate.label: t.id for t in space.trials(r)}
    # chat: W8A8 best (4.0), the original 4.1; rag: the original best (5.0), W8A8 5.2 (4 % above): W8A8 serves both
    _stand(monkeypatch, {("chat", "original"): (4, 4.1, 2.0), ("chat", W8): (4, 4.0, 2.0),
                         ("rag", "original"): (4, 5.0, 1.0), ("rag", W8): (4, 5.2, 1.0)})
    table = run_per_class(r).routing
    assert table.winners_differ and table.one_deployment
    assert [d.configuration for d in table.deployments] == [ids[W8]] and table.deployments[0].classes == ["chat", "rag"]
    assert {c.configuration for c in table.classes} == {ids[W8]} and table.single.within
    # the deployment's replicas: the classes' peaks over its load per replica on each, together: 7.5/2 + 2.5/1
    assert table.deployments[0].replicas == math.ceil(7.5 / 2.0 + 2.5 / 1.0)
    assert any("one deployment" in line for line in summary_lines(table))


def test_bad_classes_are_refused_before_anything_runs(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import plan_classes

    stand = _stand(monkeypatch, {})
    with pytest.raises(UsageError) as e:
        plan_classes(validate_recipe_data(classed_recipe(smol, tmp_path, classes=["chat", "billing"])))
    assert "'billing'" in e.value.message and "chat (90)" in e.value.message and "rag (30)" in e.value.message
    with pytest.raises(UsageError) as e:  # 40 requests a probe: rag, named, has 10, a probe needs 29
        plan_classes(validate_recipe_data(classed_recipe(smol, tmp_path, classes=["chat", "rag"], requests=40)))
    assert "class rag has 10 of the 40 requests a probe sends, it needs 29" in e.value.message
    # tune.classes: true leaves a class too small out (said), unless no class has enough
    with pytest.raises(UsageError) as e:
        plan_classes(validate_recipe_data(classed_recipe(smol, tmp_path, requests=20)))
    assert "class chat has 15 of the 20 requests a probe sends, it needs 29" in e.value.message
    _stand(monkeypatch, {("chat", "original"): (4, 8.0, 2.0), ("chat", W8): (8, 4.0, 4.0)})
    from infertool.tune.classes import run_per_class

    table = run_per_class(validate_recipe_data(classed_recipe(smol, tmp_path, requests=40))).routing
    assert [c.name for c in table.classes] == ["chat"]
    assert any("class rag not tuned: 10 requests in a probe's traffic, a probe needs 29" in n for n in table.notes)
    stand.calls.clear()
    # the CLI: exit 2 with the message, no trace, nothing run
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(classed_recipe(smol, tmp_path, classes=["rag"], requests=40)))
    out = CliRunner().invoke(app, ["tune", str(path)])
    assert out.exit_code == 2 and "it needs 29" in out.output and "Traceback" not in out.output
    assert stand.calls == []


def test_validate_refuses_classes_the_traffic_lacks_as_the_run_would(smol, tmp_path):
    """`infertool validate` reads the traffic file when the recipe names a class (tune.classes, bench.classes.replay)
    and refuses what the run would refuse before any server, with the classes the traffic has."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(classed_recipe(smol, tmp_path, classes=["chat", "billing"])))
    out = CliRunner().invoke(app, ["validate", str(path)])
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert "tune.classes names 'billing'" in out.output and "chat (90)" in out.output, out.output
    data = classed_recipe(smol, tmp_path, classes=None)
    data["bench"]["classes"] = {"replay": "billing"}
    path.write_text(yaml.safe_dump(data))
    out = CliRunner().invoke(app, ["validate", str(path)])
    assert out.exit_code == 2 and "the class 'billing' has no request in this traffic (its classes: chat, rag)" in \
        " ".join(out.output.split()), out.output
    data["bench"]["classes"] = {"replay": "rag"}
    path.write_text(yaml.safe_dump(data))
    assert CliRunner().invoke(app, ["validate", str(path)]).exit_code == 0
    path.write_text(yaml.safe_dump(classed_recipe(smol, tmp_path, classes=["chat", "rag"])))
    out = CliRunner().invoke(app, ["validate", str(path)])
    assert out.exit_code == 0, out.output


def _validate_all(docs: list[dict]) -> None:
    import jsonschema

    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    schema = json.loads((CRDS / "httproute-v1.handwritten.schema.json").read_text())
    for doc in docs:
        if doc["kind"] == "HTTPRoute":
            errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
            assert not errors, errors[0].message
        else:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_serve_emit_k8s_routes_each_class_on_its_header(smol, tmp_path, monkeypatch):
    """Class names YAML would read as other types (true, 0x1F) stay strings; the header name is the recipe's."""
    from infertool.tune.classes import run_per_class

    names = ("true", "0x1F")
    r = validate_recipe_data(classed_recipe(smol, tmp_path, names=names, routing={"header": "x-traffic-class"}))
    ids = {t.candidate.label: t.id for t in space.trials(r)}
    _stand(monkeypatch, {(names[0], "original"): (4, 8.0, 2.0), (names[0], W8): (8, 4.0, 4.0),
                         (names[1], "original"): (2, 3.0, 1.5), (names[1], W8): (2, 6.0, 1.0)})
    per = run_per_class(r)
    out = CliRunner().invoke(app, ["serve", per.tune_dir, "--emit", "k8s"])
    assert out.exit_code == 0, out.output
    text = out.stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Deployment", "Service", "Deployment", "Service", "HTTPRoute"]
    _validate_all(docs)
    route = docs[-1]
    services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
    assert all(ids[W8][:8] in s or ids["original"][:8] in s for s in services)
    rules = route["spec"]["rules"]
    matched = {m["matches"][0]["headers"][0]["value"]: m["backendRefs"][0]["name"] for m in rules if "matches" in m}
    assert matched == {"true": next(s for s in services if ids[W8][:8] in s),
                       "0x1F": next(s for s in services if ids["original"][:8] in s)}
    assert all(isinstance(v, str) for v in matched)  # not True, not 31
    assert {h["name"] for m in rules if "matches" in m for h in m["matches"][0]["headers"]} == {"x-traffic-class"}
    assert rules[-1] == {"backendRefs": [{"name": matched["true"], "port": rules[0]["backendRefs"][0]["port"]}]}
    deps = {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs if d["kind"] == "Deployment"}
    assert sorted(deps.values()) == [2, 2]  # routing.json's replicas
    # --json: the same documents
    js = CliRunner().invoke(app, ["serve", per.tune_dir, "--emit", "k8s", "--json"])
    assert js.exit_code == 0 and json.loads(js.stdout)["manifests"] == docs
    # --replicas overrides routing.json's; launching a per-class directory says what to serve instead
    two = CliRunner().invoke(app, ["serve", per.tune_dir, "--emit", "k8s", "--replicas", "3", "--json"])
    assert {d["spec"]["replicas"] for d in json.loads(two.stdout)["manifests"] if d["kind"] == "Deployment"} == {3}
    launch = CliRunner().invoke(app, ["serve", per.tune_dir, "--dry-run"])
    assert launch.exit_code == 2 and "tuned-<class>.yaml" in launch.output and "--emit k8s" in launch.output


def test_the_dry_run_lists_the_classes(smol, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(classed_recipe(smol, tmp_path, classes=None)))
    out = CliRunner().invoke(app, ["tune", str(path), "--per-class", "--dry-run", "--json"])
    assert out.exit_code == 0, out.output
    shown = {c["name"]: c for c in json.loads(out.stdout)["classes"]}
    assert shown["chat"]["requests"] == 90 and shown["rag"]["requests"] == 30 and shown["rag"]["needed"] == 29
    assert shown["rag"]["share"] == pytest.approx(0.25) and shown["chat"]["slo"] == {"ttft_ms": 1000.0}


def test_a_tampered_routing_table_is_refused(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import read_routing

    d = tmp_path / "tuned"
    d.mkdir()
    good = {"recipe": "t", "header": "x-infertool-class", "gateway": "gw",
            "deployments": [{"configuration": "abc123", "recipe": "tuned-chat.yaml", "classes": ["chat"]}]}
    for bad in ({"header": "x: injected\nkind: Secret"}, {"gateway": "Not A Name"},
                {"deployments": [{"configuration": "abc", "recipe": "../../etc/passwd", "classes": ["chat"]}]},
                {"deployments": [{"configuration": "$(VLLM_API_KEY)", "recipe": "tuned-chat.yaml", "classes": ["chat"]}]}):
        (d / "routing.json").write_text(json.dumps({**good, **bad}))
        with pytest.raises(UsageError):
            read_routing(d)


def test_a_class_routed_to_another_classs_configuration_gets_its_own_recipe(smol, tmp_path, monkeypatch):
    """One deployment: rag (its own winner the original) is routed to chat's winner, W8A8. routing.json names
    tuned-rag.yaml for rag: W8A8 and chat's published checkpoint, with rag's SLO, traffic and load; the
    Deployment's recipe stays the configuration's own (chat's); `serve TUNE_DIR --emit k8s` takes it."""
    from infertool.tune.classes import read_routing, routing_rows, run_per_class
    from infertool.tune.records import RoutingTable

    r = validate_recipe_data(classed_recipe(smol, tmp_path, classes=["chat", {"name": "rag", "slo": {"ttft_ms": 3000}}]))
    ids = {t.candidate.label: t.id for t in space.trials(r)}
    _stand(monkeypatch, {("chat", "original"): (4, 4.1, 2.0), ("chat", W8): (4, 4.0, 2.0),
                         ("rag", "original"): (4, 5.0, 1.0), ("rag", W8): (3, 5.2, 1.0)})
    per = run_per_class(r)
    d = Path(per.tune_dir)
    table = RoutingTable.from_dict(json.loads((d / "routing.json").read_text()))
    by = {c.name: c for c in table.classes}
    assert table.one_deployment and by["rag"].winner == ids["original"] and by["rag"].configuration == ids[W8]
    assert (by["chat"].recipe, by["chat"].winner_of) == ("tuned-chat.yaml", "chat")
    assert (by["rag"].recipe, by["rag"].winner_of) == ("tuned-rag.yaml", "chat")
    assert table.deployments[0].recipe == "tuned-chat.yaml" and per.tuned["rag"] == str(d / "tuned-rag.yaml")
    chat = validate_recipe_data(yaml.safe_load((d / "tuned-chat.yaml").read_text()))
    rag = validate_recipe_data(yaml.safe_load((d / "tuned-rag.yaml").read_text()))
    # the configuration routed to, its checkpoint as published for chat's winner ...
    assert rag.quantize.scheme == "W8A8" and rag.quantize.output == chat.quantize.output
    assert rag.serve.max_num_seqs == chat.serve.max_num_seqs == 4
    # ... with rag's own SLO, traffic and load under that SLO, its runs in its own tune directory
    assert rag.name == "t-rag-tuned" and rag.bench.classes.replay == "rag" and chat.bench.classes.replay == "chat"
    assert rag.bench.slo.ttft_ms == 3000 and chat.bench.slo.ttft_ms == 1000 and rag.bench.concurrency == [1, 3]
    assert rag.run.out_dir == str((d / "classes" / "rag" / "runs").absolute())
    assert "routed to configuration" in (d / "tuned-rag.yaml").read_text().splitlines()[0]
    assert any(f"{ids[W8]} (chat's winner)" in row[3] for row in routing_rows(table) if row[0] == "rag")
    # read_routing's and routed_manifests' rules hold: one Deployment, serving chat's recipe, both classes routed
    assert read_routing(d).deployments[0].classes == ["chat", "rag"]
    out = CliRunner().invoke(app, ["serve", per.tune_dir, "--emit", "k8s", "--json"])
    assert out.exit_code == 0, out.output
    docs = json.loads(out.stdout)["manifests"]
    assert [x["kind"] for x in docs] == ["Deployment", "Service", "HTTPRoute"]
    one = CliRunner().invoke(app, ["serve", str(d / "tuned-rag.yaml"), "--emit", "k8s", "--json"])
    assert one.exit_code == 0, one.output


def test_an_old_routing_table_without_the_new_fields_still_reads(tmp_path):
    from infertool.tune.classes import read_routing, summary_lines

    d = tmp_path / "tuned"
    d.mkdir()
    (d / "routing.json").write_text(json.dumps({
        "recipe": "t", "header": "x-infertool-class", "gateway": "gw",
        "classes": [{"name": "chat", "configuration": "abc123", "recipe": "tuned-chat.yaml"}],
        "deployments": [{"configuration": "abc123", "recipe": "tuned-chat.yaml", "classes": ["chat"]}]}))
    table = read_routing(d)
    assert table.classes[0].winner_of is None and table.classes[0].speculation is None
    assert "winner_of" not in table.classes[0].to_dict() and "speculation" not in table.classes[0].to_dict()
    assert not any("crossover" in line for line in summary_lines(table))
