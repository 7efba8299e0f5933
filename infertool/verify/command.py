"""`infertool verify SRC` as one call: the flags checked, a dry run's plan, a verification or a bisect, shown or as
JSON. Returns the exit code: 0 PASS (or no change, or a dry run), 1 FAIL or INCONCLUSIVE (a release fails a gate), 3 no
release could be tested."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from infertool.capability import RunContext
from infertool.errors import UsageError
from infertool.output import StageProgress, print_json
from infertool.verify import core, show
from infertool.worker import WorkerEvent


def verify_cli(source: core.Source, opts: core.VerifyOptions, *, engine: str | None = None,
               bisect: tuple[str, str] | None = None, junit: Path | None = None, as_json: bool = False,
               force: bool = False) -> int:
    """Verify ``source`` (``publish.served.verify_source``) as the command's flags say; the exit code. ``force``:
    a bisect may replace a state file that is not its own (the command checks the other outputs)."""
    if opts.url is not None:
        check_url(opts.url)
    if opts.url is not None and (engine is not None or bisect is not None):
        raise UsageError("--url scores a server already running; --engine and --bisect start their own",
                         hint="give one or the other")
    if engine is not None and bisect is not None:
        raise UsageError("--bisect tries the releases of its package itself: it takes no --engine",
                         hint="give one or the other")
    core.refuse_inside(source.folder, junit, "--junit")  # not even with --force: nothing is written in the folder
    if opts.perf_repeats is not None:
        from infertool.verify.perf import check_repeats

        check_repeats(opts.perf_repeats)
        if opts.url is not None:
            raise UsageError("--perf measures a server it starts itself (the recorded settings): it takes no --url",
                             hint="leave --url out")
    if bisect is not None:
        return _bisect(source, opts, bisect, as_json, junit=junit, force=force)
    with StageProgress("verify") as progress:
        if engine is not None:
            opts = core.with_engine(opts, engine, on_line=lambda line: progress.on_event(
                {"event": "log", "level": "info", "message": line}))
    if opts.perf_repeats is not None:
        return _perf(source, opts, junit, as_json)
    plan = core.plan(source, opts)
    if opts.dry_run and as_json:
        print_json(plan.to_dict())
    elif opts.dry_run:
        show.render_plan(plan)
    if opts.dry_run:
        return 0
    with StageProgress("verify") as progress:
        result = core.run(plan, RunContext(out_dir=opts.out_dir, on_event=progress.on_event, user="verify"))
    return _shown(result, opts, junit, as_json)


def _perf(source: core.Source, opts: core.VerifyOptions, junit: Path | None, as_json: bool) -> int:
    """--perf: the recorded bench run again and judged on speed (``verify.perf``); shown like a verification."""
    from infertool.verify import perf

    plan = perf.plan(source, opts, opts.perf_repeats or perf.REPEATS)
    if opts.dry_run:
        if as_json:
            print_json(plan.to_dict())
        else:
            show.render_plan(plan.verify)
            show.render_perf_plan(plan)
        return 0
    with StageProgress("verify --perf") as progress:
        result = perf.run(plan, RunContext(out_dir=opts.out_dir, on_event=progress.on_event, user="verify"))
    return _shown(result, opts, junit, as_json)


def _shown(result: core.VerifyResult, opts: core.VerifyOptions, junit: Path | None, as_json: bool) -> int:
    """A verification's result written as JUnit (--junit), printed (JSON or tables); its exit code."""
    from infertool.verify.junit import write_junit

    if junit is not None:
        write_junit(junit, result)
    if as_json:
        print_json(result)
    else:
        show.render(result)
    return 0 if result.accepted(opts.allow_inconclusive) else 1


def check_url(url: str) -> None:
    """--url is an http:// or https:// address with a host (ftp://, file://, a bare host:port: a UsageError, exit
    2, before any request); the message names the scheme only, never the address (it may hold a password)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        host, _ = parts.hostname, parts.port  # a port that is no number raises here
    except ValueError:  # a port that is no number, a bracket left open
        raise UsageError("--url: the address does not parse (a port that is no number, a bracket left open)",
                         hint="e.g. --url http://127.0.0.1:8000/v1") from None
    if parts.scheme.lower() in ("http", "https") and host:
        return
    scheme = parts.scheme if parts.scheme.isascii() and parts.scheme.isalnum() else ""
    what = (f"an address of scheme {scheme[:20]!r}" if scheme and scheme.lower() not in ("http", "https")
            else "an address with no host" if scheme else "an address with no scheme")
    raise UsageError(f"--url takes the http:// or https:// address of an OpenAI-compatible server, not {what}",
                     hint="e.g. --url http://127.0.0.1:8000/v1")


def _bisect(source: core.Source, opts: core.VerifyOptions, spec: tuple[str, str], as_json: bool, *,
            junit: Path | None = None, force: bool = False) -> int:
    """--bisect PACKAGE LO..HI: every release tested with its figures; 0 no change, 1 a release fails a gate
    (found, ambiguous, the first already fails), 3 no release could be tested. --dry-run: what it would test,
    without the package index or an install; 0. --junit: one testcase per release tested."""
    from infertool.verify.bisect import parse_range
    from infertool.verify.junit import write_bisect_junit

    package, span = spec
    lo, hi = parse_range(package, span)  # before the range names a folder
    where = opts.out_dir or Path("out") / "verify" / f"{source.folder.name[:100]}-bisect-{package}-{lo}..{hi}"
    if opts.dry_run:
        bp = core.plan_bisect(source, replace(opts, out_dir=None), package, span, out_dir=Path(where))
        if as_json:
            print_json({**bp.to_dict(), "junit": str(junit) if junit is not None else None})
        else:
            show.render_bisect_plan(bp, junit)
        return 0
    opts = replace(opts, out_dir=None, dry_run=False)
    with StageProgress("verify --bisect") as progress:
        def on_event(e: dict[str, Any]) -> None:  # Any: an event's JSON values
            progress.on_event({"event": "log", "level": "info", "message": show.bisect_line(package, e)}
                              if WorkerEvent.from_dict(e).event == "bisect" else e)

        verifier = core.verify_once
        if opts.perf_repeats is not None:
            from infertool.verify.perf import verify_perf

            verifier = verify_perf
        result = core.run_bisect(source, opts, package, span, out_dir=Path(where), on_event=on_event, force=force,
                                 verifier=verifier)
    if junit is not None:
        write_bisect_junit(junit, package, result)
    if as_json:
        print_json({**result.to_dict(), "state": str(Path(where) / "bisect.json")})
    else:
        show.render_bisect(package, result)
    return 3 if result.verdict == "untestable" else 0 if result.verdict == "no change" else 1
