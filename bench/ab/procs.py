"""A clean process table for every block run of `bench ab`: each run starts its own
session, and the next run starts only once no process of that session is alive (rank
processes of a run still exiting while the next one starts would load its first seconds).

Linux only reads the process table (/proc); elsewhere nothing is waited for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

SETTLE_S = 30.0  # a run's leftovers may take this long to exit, then they are ended
POLL_S = 0.1


def run_in_session(cmd: list[str], cwd: Path, env: dict, log, timeout_s: float
                   ) -> tuple[int, int]:
    """Runs `cmd` as the leader of a new session; returns (exit code, 124 on timeout;
    processes of its session still alive when it exited)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc.pid)
        proc.wait()
        code = 124
    return code, settle(proc.pid)


def session_pids(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    if not proc.is_dir():
        return []
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def settle(sid: int, wait_s: float = SETTLE_S) -> int:
    """Waits until session `sid` has no live process, ending what is left after `wait_s`
    (the session's process group: processes this ab started); returns how many were alive
    at the first look (0: the run left nothing behind)."""
    alive = session_pids(sid)
    lingered, deadline = len(alive), time.monotonic() + wait_s
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = session_pids(sid)
    if alive:
        _end(sid)
        while session_pids(sid) and time.monotonic() < deadline + 5.0:
            time.sleep(POLL_S)
    return lingered


def _end(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
