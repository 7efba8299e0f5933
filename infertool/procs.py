"""Processes and ports, in one place: every server and worker infertool starts leads its own process
group, and is stopped by ``stop_group``; every free port comes from ``free_port``.

Pure standard library (Linux /proc); nothing here imports another infertool package.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from typing import Callable, Sequence

# Gentle first (a worker turns SIGINT into KeyboardInterrupt and cleans up; vLLM shuts its engine down on
# SIGTERM), then firm. The first wait is the caller's grace period.
DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc (Linux)."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may contain spaces, so split after the last ')'
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) used so far by the live processes of a process group, from /proc (Linux):
    the difference of two readings is what the group used in between (a member that exits meanwhile takes
    its share with it)."""
    ticks = 0
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it
    tells a process from a later one that got a recycled pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def stop_group(pgid: int, grace_s: float = 10.0, *, poll: Callable[[], int | None] | None = None,
               signals: Sequence[int] = DEFAULT_SIGNALS, later_wait_s: float = 5.0) -> bool:
    """Signal a process group until none of it is left: each of ``signals`` in turn, waiting ``grace_s``
    after the first and ``later_wait_s`` after each later one. True when no member is left.

    ``poll`` (a Popen's poll) reaps our own child so that it does not linger as a zombie. The group leader
    may exit first: its children (a vLLM engine core, a compile worker) are still in the group and are
    stopped with it.
    """
    def gone() -> bool:
        if poll is not None:
            poll()
        return not group_members(pgid)

    for i, sig in enumerate(signals):
        if gone():
            return True
        try:
            os.killpg(pgid, sig)
            if sig != signal.SIGKILL:
                os.killpg(pgid, signal.SIGCONT)  # a paused group (``PausedGroups``) must run to handle it
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        deadline = time.monotonic() + (grace_s if i == 0 else later_wait_s)
        while time.monotonic() < deadline:
            if gone():
                return True
            time.sleep(0.05)
    return gone()


# The guard of paused groups: SIGTERM (sent by Linux when its parent dies, PR_SET_PDEATHSIG = 1, or by resume)
# continues every group it was given, then it exits. "ready" says the death signal and the handler are set.
_GUARD = ("import ctypes,os,signal,sys\n"
          "def cont(*_):\n"
          "    for g in sys.argv[2:]:\n"
          "        try:\n"
          "            os.killpg(int(g),signal.SIGCONT)\n"
          "        except OSError:\n"
          "            pass\n"
          "    os._exit(0)\n"
          "signal.signal(signal.SIGTERM,cont)\n"
          "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGTERM)\n"
          "os.getppid()==int(sys.argv[1]) or cont()\n"
          "print('ready',flush=True)\n"
          "while True:\n"
          "    signal.pause()\n")


GUARD_START_S = 60.0  # a bare Python start: well under a second on these machines


class PausedGroups:
    """Process groups frozen with SIGSTOP until ``resume()``: an idle server takes no CPU and never wakes up
    between the threads of an engine timed or run beside it (an idle vLLM server used 0.01 of a core on a
    2-core machine, yet one just started slowed an in-process eval beside it by 11 %). A guard process
    (outside the groups, tied to this one) continues them if this process dies first, so that their own
    death signal (``tied``) can act: a paused server never outlives infertool."""

    def __init__(self, pgids: Sequence[int]):
        import select
        import subprocess
        import sys

        self.pgids = [int(g) for g in pgids]
        guard = subprocess.Popen([sys.executable, "-I", "-c", _GUARD, str(os.getpid()), *map(str, self.pgids)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
        self._guard: subprocess.Popen[bytes] | None = guard
        out = guard.stdout
        assert out is not None  # stdout=PIPE
        ready, _, _ = select.select([out], [], [], GUARD_START_S)
        if not ready or out.readline().strip() != b"ready":  # in place before anything stops
            guard.kill()
            guard.wait()
            out.close()
            self._guard = None
            raise OSError("the guard of paused servers did not start")
        for g in self.pgids:
            try:
                os.killpg(g, signal.SIGSTOP)
            except OSError:
                pass

    def resume(self) -> None:
        """Continue the groups (idempotent)."""
        if self._guard is None:
            return
        for g in self.pgids:
            try:
                os.killpg(g, signal.SIGCONT)
            except OSError:
                pass
        guard, self._guard = self._guard, None
        guard.terminate()
        guard.wait()
        if guard.stdout is not None:
            guard.stdout.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (bind to port 0 on ``host``, loopback by default)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (a port in TIME_WAIT is usable, one with a listener
    is not: vLLM's uvicorn sets SO_REUSEADDR too). Raises OSError for an address that is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


# Runs first in the child: ask Linux for SIGTERM when the parent dies (PR_SET_PDEATHSIG = 1), give up when it
# already has, then become the real command (the death signal survives exec).
_TIE = ("import ctypes,os,signal,sys\n"
        "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGTERM)\n"
        "os.getppid()==int(sys.argv[1]) or sys.exit(143)\n"
        "os.execvp(sys.argv[2],sys.argv[2:])\n")


def tied(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that it gets SIGTERM if this process dies without stopping it (SIGKILL, a Ray
    worker killed with its job, a crash): a vLLM server or a worker never outlives the infertool that started
    it. Linux only (elsewhere ``argv`` as it is). A detached server is started without it."""
    import sys

    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-c", _TIE, str(os.getpid()), *argv]
