"""The test-only fault hook (re-exported by ``infertool.atomic``; docs/development.md, "Faults"): a test sets
``INFERTOOL_FAULT=POINT[:N[:enospc]]`` for a process, and at the N-th time that process meets ``fault(POINT)`` it
kills itself with SIGKILL (or, with ``:enospc``, raises OSError(ENOSPC) as a full disk would). Unset, ``fault``
is one string comparison. The points: ``write`` (a file whole in its temporary, not yet renamed over the target),
``copy`` (a file partly copied), ``swap`` (a folder complete, about to be renamed into place), ``swapped`` (in
place, the one it replaced not yet removed), and the names callers give (``bisect-outcome``)."""

from __future__ import annotations

import errno
import os
import signal
from collections import Counter

_FAULT = os.getenv("INFERTOOL_FAULT", "").split(":")  # POINT[:N[:enospc]]: a test's fault, read once
_FAULTS_MET: Counter[str] = Counter()


def fault(point: str, path: str | os.PathLike[str] | None = None) -> None:
    """A test's fault at ``point`` (write, copy, swap, swapped, or a name a caller gives): nothing unless
    ``INFERTOOL_FAULT`` names it; at its N-th meeting (default 1) the process kills itself (SIGKILL, said on
    stderr first) or, with ``:enospc``, raises OSError(ENOSPC) for ``path`` as a full disk would."""
    if _FAULT[0] != point:
        return
    _FAULTS_MET[point] += 1
    n = _FAULTS_MET[point]
    if str(n) != (_FAULT[1] if len(_FAULT) > 1 and _FAULT[1] else "1"):
        return
    if _FAULT[2:] == ["enospc"]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    os.write(2, f"INFERTOOL_FAULT: killed at {point} #{n} ({path})\n".encode(errors="replace"))
    os.kill(os.getpid(), signal.SIGKILL)
