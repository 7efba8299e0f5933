"""The metrics and the verdict of `infertool eval`, on hand-computed values (pure Python, fast)."""

from __future__ import annotations

import math

import pytest

from infertool.evaluate import metrics as M
from infertool.evaluate.core import summarize
from infertool.evaluate.paired import from_json
from infertool.data.suites import Suite, SuiteTask
from infertool.evaluate.verdict import PRESETS, Estimate, judge, thresholds, verdict


def test_normal_ppf_and_z():
    assert M.z_for(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert M.normal_ppf(0.5) == pytest.approx(0.0, abs=1e-12)
    assert M.normal_ppf(0.01) == pytest.approx(-2.326348, abs=1e-6)
    assert M.normal_ppf(0.999) == pytest.approx(3.090232, abs=1e-6)


def test_kld_hand_computed():
    # P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 0.143841
    lp_p = [math.log(0.5), math.log(0.5)]
    lp_q = [math.log(0.25), math.log(0.75)]
    assert M.kld_from_logprobs(lp_p, lp_q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-12)
    assert M.kld_from_logprobs(lp_p, lp_q) == pytest.approx(0.143841, abs=1e-6)
    assert M.kld_from_logprobs(lp_p, lp_p) == 0.0
    # from logits: log_softmax([0, ln 3]) = ln(1/4), ln(3/4)
    assert M.log_softmax([0.0, math.log(3.0)]) == pytest.approx(lp_q)


def test_topk_kld_exact_when_covered_and_a_lower_bound_otherwise():
    base = {"a": math.log(0.5), "b": math.log(0.5)}
    cand = {"a": math.log(0.25), "b": math.log(0.75)}
    kld, covered = M.topk_kld(base, cand)
    assert kld == pytest.approx(0.143841, abs=1e-6)
    assert covered == pytest.approx(1.0)
    # full distributions over 4 tokens; the server shows only the top 2 of each
    p = {"a": 0.6, "b": 0.3, "c": 0.05, "d": 0.05}
    q = {"a": 0.4, "c": 0.3, "b": 0.2, "d": 0.1}
    exact = sum(p[t] * math.log(p[t] / q[t]) for t in p)
    top_p = {"a": math.log(0.6), "b": math.log(0.3)}
    top_q = {"a": math.log(0.4), "c": math.log(0.3)}
    kld, covered = M.topk_kld(top_p, top_q)
    # b is missing from the candidate's top-2: it gets min(0.3, 1 - 0.7) = 0.3; rest bucket 0.1 vs 1 - 0.7 = 0.3
    by_hand = 0.6 * math.log(0.6 / 0.4) + 0.3 * math.log(0.3 / 0.3) + 0.1 * math.log(0.1 / 0.3)
    assert kld == pytest.approx(by_hand, rel=1e-12)
    assert covered == pytest.approx(0.9)
    assert kld <= exact


def test_topk_kld_stays_finite_when_a_rounded_top_k_sums_to_one():
    # float32 servers round: the candidate's top-2 sums a little over 1, and base's second token is not in it
    base = {"a": math.log(0.9), "b": math.log(0.1)}
    cand = {"a": math.log(0.7000001), "c": math.log(0.3)}
    kld, covered = M.topk_kld(base, cand)
    assert math.isfinite(kld) and kld > 0.5  # b gets at most the rounding: a large term, not inf
    assert covered == pytest.approx(1.0)
    # a -inf log-probability in the candidate's top-k (a masked token) does not make it inf either
    kld2, _ = M.topk_kld(base, {"a": math.log(0.9), "z": -math.inf})
    assert math.isfinite(kld2)


def test_perplexity_and_bits_per_byte():
    lp = [math.log(0.5), math.log(0.25)]
    assert M.perplexity(lp) == pytest.approx(math.sqrt(8))  # exp((ln2 + ln4)/2)
    assert M.bits_per_byte([math.log(0.5)] * 2, 2) == pytest.approx(1.0)
    assert M.bits_per_byte([math.log(0.25)] * 3, 2) == pytest.approx(3.0)


def test_ln_ppl_ratio_paired_se():
    lp_b = [-1.0, -2.0, -3.0]
    lp_c = [-1.5, -2.0, -3.5]
    # d = lp_b - lp_c = (0.5, 0, 0.5): mean 1/3; sample var = (1/36 + 1/9 + 1/36)/2 = 1/12; SE = sqrt(1/12/3) = 1/6
    m, se = M.ln_ppl_ratio(lp_b, lp_c)
    assert m == pytest.approx(1 / 3)
    assert se == pytest.approx(1 / 6)
    # a constant shift has zero paired SE although both models vary a lot from token to token
    m, se = M.ln_ppl_ratio([-1.0, -5.0, -9.0], [-1.1, -5.1, -9.1])
    assert m == pytest.approx(0.1)
    assert se == pytest.approx(0.0, abs=1e-12)
    assert math.exp(m) == pytest.approx(M.perplexity([-1.1, -5.1, -9.1]) / M.perplexity([-1.0, -5.0, -9.0]))


def test_wilson_hand_computed():
    lo, hi = M.wilson(8, 10, 0.95)
    assert lo == pytest.approx(0.49016, abs=1e-4)
    assert hi == pytest.approx(0.94332, abs=1e-4)
    lo, hi = M.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.16113, abs=1e-4)
    lo, hi = M.wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(0.83887, abs=1e-4)


def test_mcnemar_exact_hand_computed():
    # b=1, c=9: 2 * P(X <= 1 | n=10, 1/2) = 2 * 11/1024
    assert M.mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert M.mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert M.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert M.mcnemar_exact(5, 5) == 1.0
    assert M.mcnemar_exact(0, 0) == 1.0
    assert 0 < M.mcnemar_exact(400, 500) < 0.002  # large n does not overflow


def test_paired_accuracy_hand_computed():
    base = [True, True, True, False, False]
    cand = [True, False, False, True, False]
    r = M.paired_accuracy(base, cand)
    assert (r.n, r.b, r.c) == (5, 2, 1)
    assert r.acc_base == pytest.approx(0.6) and r.acc_cand == pytest.approx(0.4)
    assert r.flip_rate == pytest.approx(0.6)
    assert r.net_change == pytest.approx(-0.2)
    assert r.net_change_se == pytest.approx(math.sqrt(3 - 1 / 5) / 5)
    assert r.mcnemar_p == pytest.approx(1.0)  # 2 * P(X<=1 | n=3) = 2 * 4/8


def test_distribution_percentiles():
    d = M.distribution([4.0, 1.0, 3.0, 2.0])
    assert d.median == pytest.approx(2.5)
    assert d.p90 == pytest.approx(3.7)
    assert d.max == 4.0 and d.min == 1.0
    assert d.mean == pytest.approx(2.5)
    assert d.rms == pytest.approx(math.sqrt(7.5))
    assert d.se == pytest.approx(math.sqrt((2.25 + 2.25 + 0.25 + 0.25) / 3 / 4))


def test_log_histogram_counts_everything():
    h = M.log_histogram([0.0, 1e-7, 2e-6, 0.5, 0.5, 50.0])
    assert h["under"] == 2 and h["over"] == 1 and sum(h["counts"]) == 3


def test_gate_pass_fail_inconclusive_and_n_needed():
    g = judge("max_mean_kld", 0.05, Estimate(0.02, 0.01, 0.03, 100))
    assert g.status == "PASS"
    g = judge("max_mean_kld", 0.05, Estimate(0.10, 0.08, 0.12, 100))
    assert g.status == "FAIL"
    g = judge("max_mean_kld", 0.05, Estimate(0.06, 0.04, 0.08, 100))
    # half width 0.02, distance 0.01: N * (0.02/0.01)^2 = 400
    assert g.status == "INCONCLUSIVE" and g.n_needed == 400
    g = judge("min_top1", 0.9, Estimate(0.95, 0.92, 0.97, 100))
    assert g.status == "PASS"
    g = judge("min_top1", 0.9, Estimate(0.85, 0.80, 0.89, 100))
    assert g.status == "FAIL"
    na = judge("max_acc_drop", 0.02, Estimate(None, None, None, 0))
    assert na.status == "n/a"
    status, why = verdict([g, na])
    assert status == "FAIL" and "min_top1" in why
    status, why = verdict([judge("max_mean_kld", 0.05, Estimate(0.06, 0.04, 0.08, 100))])
    assert status == "INCONCLUSIVE" and "400" in why
    assert verdict([na])[0] == "INCONCLUSIVE"
    # measured but not finite: never skipped as "not measured"
    inf = judge("max_mean_kld", 0.05, Estimate(math.inf, math.nan, math.nan, 12264))
    assert inf.status == "FAIL" and "inf" in inf.note
    assert verdict([inf, judge("min_top1", 0.9, Estimate(0.95, 0.92, 0.97, 100))])[0] == "FAIL"
    nan = judge("max_mean_kld", 0.05, Estimate(math.nan, math.nan, math.nan, 10))
    assert nan.status == "INCONCLUSIVE"


def test_thresholds_preset_and_overrides():
    assert thresholds({"preset": "strict"}) == PRESETS["strict"]
    t = thresholds({"preset": "standard", "max_mean_kld": 0.2})
    assert t["max_mean_kld"] == 0.2 and t["min_top1"] == PRESETS["standard"]["min_top1"]
    assert thresholds({"preset": None, "min_top1": 0.5}) == {"min_top1": 0.5}


def _self_raw(n_windows=3, n_tokens=50):
    items = []
    for w in range(n_windows):
        lp = [-(1 + ((w * 7 + i * 13) % 17) / 4) for i in range(n_tokens)]
        items.append({"id": f"w{w:04d}", "n_bytes": 4 * n_tokens, "lp_b": lp, "lp_c": list(lp),
                      "kld": [0.0] * n_tokens, "same_top1": [1] * n_tokens})
    return {"type": "perplexity", "seq_len": n_tokens + 1, "kld_kind": "full", "items": items}


def test_self_check_summary_is_kld_zero_full_agreement_and_passes():
    suite = Suite("s", "", path=None, tasks=[
        SuiteTask("corpus", "perplexity", text="x"),
        SuiteTask("mc", "multiple_choice", items=[{"id": f"q{i}", "answer": i % 2} for i in range(30)]),
        SuiteTask("gen", "generate", items=[{"id": f"g{i}", "target": str(i)} for i in range(30)]),
    ])
    raw = {
        "corpus": _self_raw(),
        "mc": {"type": "multiple_choice", "items": [
            {"id": f"q{i}", "ll_b": [-1.0, -2.0], "ll_c": [-1.0, -2.0], "n_bytes": [2, 2]} for i in range(30)]},
        "gen": {"type": "generate", "items": [{"id": f"g{i}", "out_b": f" {i}", "out_c": f" {i}"} for i in range(30)]},
    }
    tasks, records, pool, gates = summarize(suite, {n: from_json(t) for n, t in raw.items()}, {"preset": "standard"})
    t = tasks["corpus"]
    assert t.kld.mean == 0.0 and t.kld.max == 0.0
    assert t.top1_agree == 1.0 and t.ppl_ratio == 1.0 and t.ln_ppl_ratio_se == 0.0
    assert tasks["mc"].acc.flip_rate == 0.0 and tasks["mc"].same_pick == 1.0
    assert tasks["gen"].output_agreement == 1.0 and tasks["gen"].acc.acc_base == 1.0
    status = {g.name: g.status for g in gates}
    assert status["max_mean_kld"] == "PASS" and status["min_top1"] == "PASS" and status["max_ppl_ratio"] == "PASS"
    assert status["max_flip_rate"] == "PASS"  # 0 flips in 60 items: Wilson upper bound 6.0% < 10%
    # zero flips in 60 paired items cannot show the drop is below 2 points with 95% confidence... but the
    # paired SE is 0 when nothing flips, so the interval is [0, 0]: PASS
    assert status["max_acc_drop"] == "PASS"
    assert verdict(gates)[0] == "PASS"
    assert len(records) == 3 + 30 + 30 and {r["task"] for r in records} == {"corpus", "mc", "gen"}


def test_small_accuracy_suite_is_inconclusive_with_the_n_that_decides():
    suite = Suite("s", "", path=None, tasks=[SuiteTask("mc", "multiple_choice", items=[{"id": f"q{i}", "answer": 0} for i in range(100)])])
    items = []
    for i in range(100):
        # 6 items flip right->wrong, 4 wrong->right: a 2-point drop measured on 100 items
        cb = i < 6 if i < 10 else True
        cc = i >= 6 if i < 10 else True
        items.append({"id": f"q{i}", "ll_b": [-1.0, -2.0] if cb else [-2.0, -1.0],
                      "ll_c": [-1.0, -2.0] if cc else [-2.0, -1.0], "n_bytes": [1, 1]})
    tasks, _, pool, gates = summarize(suite, {"mc": from_json({"type": "multiple_choice", "items": items})},
                                      {"preset": None, "max_acc_drop": 0.05})
    acc = tasks["mc"].acc
    assert (acc.b, acc.c) == (6, 4) and acc.net_change == pytest.approx(-0.02)
    g = gates[0]
    assert g.status == "INCONCLUSIVE" and g.n_needed and g.n_needed > 100


def test_wilson_n_needed():
    # 0 flips: the Wilson upper bound z^2/(n+z^2) drops below 10 % from n = 35 on
    n = M.wilson_n_needed(0.0, 0.10, upper=True)
    assert n == 35
    assert M.wilson(0, 35)[1] <= 0.10 < M.wilson(0, 34)[1]
    n = M.wilson_n_needed(0.95, 0.90, upper=False)
    assert M.wilson(0.95 * n, n)[0] >= 0.90 > M.wilson(0.95 * (n - 1), n - 1)[0]
    assert M.wilson_n_needed(0.2, 0.1, upper=True) is None
    g = judge("max_flip_rate", 0.10, Estimate(0.0, *M.wilson(0, 8), 8), confidence=0.95)
    assert g.status == "INCONCLUSIVE" and g.n_needed == 35


def test_gates_from_pooled_metrics_by_hand():
    from infertool.evaluate.core import estimates, make_gates
    from infertool.evaluate.result import Pooled

    pool = Pooled.from_dict({"tokens": {"kld": {"mean": 0.02, "se": 0.005}, "tokens": 1000, "top1_agree": 0.93, "top1_agree_ci": [0.91, 0.95],
                       "ppl_ratio": 1.02, "ppl_ratio_ci": [1.01, 1.03], "kld_kind": "full"},
            "items": {"n": 200, "net_change": -0.01, "net_change_ci": [-0.03, 0.01], "flip_rate": 0.05,
                      "flip_rate_ci": [0.03, 0.09]}})
    est = estimates(pool, 0.95)
    # mean KLD 0.02 +- 1.959964 x SE 0.005
    assert est["max_mean_kld"].lo == pytest.approx(0.0102002, abs=1e-7) and est["max_mean_kld"].n == 1000
    # accuracy drop = -net change: 0.01 in [-0.01, 0.03]
    assert (est["max_acc_drop"].value, est["max_acc_drop"].lo, est["max_acc_drop"].hi) == (0.01, -0.01, 0.03)
    gates = {g.name: g for g in make_gates(pool, {"preset": "standard"})}
    assert [gates[n].status for n in ("max_mean_kld", "min_top1", "max_ppl_ratio", "max_flip_rate")] == ["PASS"] * 4
    # the drop's interval straddles 0.02: half width 0.02, distance 0.01 -> 200 x (0.02 / 0.01)^2 = 800 items
    assert gates["max_acc_drop"].status == "INCONCLUSIVE" and gates["max_acc_drop"].n_needed == 800
    assert gates["max_acc_drop"].unit == "items" and gates["min_top1"].metric == "same top-1"
    status, why = verdict(list(gates.values()))
    assert status == "INCONCLUSIVE" and "800" in why
    only_items = make_gates(Pooled(items=pool.items), {"preset": "standard"})
    assert {g.name for g in only_items if g.status == "n/a"} == {"max_mean_kld", "min_top1", "max_ppl_ratio",
                                                                  "min_recovery", "max_decode_kld", "min_json_valid",
                                                                  "min_tool_call_valid", "max_adapter_kld"}
