"""One writer at a time in an output folder: ``hold_out`` (verify's --out, a bisect's state folder)."""

from __future__ import annotations

from pathlib import Path

from infertool.atomic import FolderBusy, FolderHold, hold_dir
from infertool.errors import UsageError


def hold_out(out_dir: Path, what: str) -> FolderHold | None:
    """This process's hold on the output folder ``out_dir`` (``atomic.hold_dir``), kept while it writes there: a
    UsageError (exit 2) naming the folder when another process writes into it now (a killed one holds nothing).
    None: this process holds it already."""
    try:
        return hold_dir(out_dir)
    except FolderBusy:
        raise UsageError(f"another infertool {what} is writing into {out_dir} now: not writing into it at once",
                         hint="wait for it to end, or give this one another --out") from None
