"""Starts one process per rank (spawn), or joins a torchrun launch, with hard timeouts.

Locally: `launch(world_size, fn, args, timeout_s)` spawns `fn(rank, world_size, *args)` in
fresh interpreters wired through env:// on a free loopback port, collects each rank's
return value, and fails fast: when any rank exits non-zero or the deadline passes, the
others are killed and `LaunchError` names the rank(s). `launch_to_end` starts the ranks the
same way but kills none when another fails: each runs to its own end (the fault tests time
how a survivor notices a dead peer).
Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) the caller runs `fn` in-process instead.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Entry:
    """A rank's function by module and name, imported in the rank: the launching process
    need not import what only the ranks run (torch, about 1.5 s)."""

    module: str
    name: str

    def __call__(self, *args):
        return getattr(importlib.import_module(self.module), self.name)(*args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _entry(rank: int, world: int, port: int, fn, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    code = 0
    try:
        value = fn(rank, world, *args)
        results.put((rank, time.time(), "ok", value))
    except BaseException as e:
        code = 1
        results.put((rank, time.time(), "error", f"{type(e).__name__}: {e}",
                     traceback.format_exc()))
    # Flush the queue's feeder thread, then skip destructors that could block on a broken
    # process group.
    results.close()
    results.join_thread()
    os._exit(code)


def _start(world: int, fn, args: tuple, method: str = "spawn"):
    """Starts the ranks (fresh interpreters; "forkserver": forked from a server that
    imported the modules set with `set_forkserver_preload` once); returns their processes
    and the queue they report on."""
    ctx = mp.get_context(method)
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    return procs, results


def launch(world: int, fn, args: tuple = (), timeout_s: float = 120.0,
           method: str = "spawn") -> list:
    """Runs fn on `world` ranks; returns the per-rank results in rank order."""
    procs, results = _start(world, fn, args, method)
    got: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world:
            _collect(results, got)
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
            if dead:
                _collect(results, got, wait_s=1.0)
                dead = [r for r in dead if r not in got]
            errors = {r: v for r, v in got.items() if v[1] == "error"}
            if errors or dead:
                # Give the other ranks a moment to report too: the rank that fails first
                # is often the one left waiting, not the one that broke the pairing.
                _drain(results, got, procs, world, grace_s=1.5)
                errors = {r: v for r, v in got.items() if v[1] == "error"}
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in got]
                raise LaunchError(_describe(errors, dead, procs))
            if time.monotonic() > deadline:
                missing = [r for r in range(world) if r not in got]
                raise LaunchError(f"timed out after {timeout_s:.0f}s waiting for rank(s) "
                                  f"{missing}")
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world else 0.1)
            if p.is_alive():
                p.kill()
    return [got[r][2] for r in range(world)]


def launch_to_end(world: int, fn, args: tuple = (), timeout_s: float = 120.0,
                  method: str = "spawn"
                  ) -> tuple[dict[int, tuple], dict[int, tuple[int, float]]]:
    """Runs fn on `world` ranks and kills none when another fails. Returns, once every rank
    has reported or died (or at the deadline, when the ranks still running are killed and
    in neither): {rank: (wall time of its report, "ok" | "error", value or message)} and
    {rank: (exit code, wall time its death was seen)} for ranks that died without one."""
    procs, results = _start(world, fn, args, method)
    got: dict[int, tuple] = {}
    dead: dict[int, tuple[int, float]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) + len(dead) < world and time.monotonic() < deadline:
            _collect(results, got, wait_s=0.02)
            for r, p in enumerate(procs):
                if r not in got and r not in dead and p.exitcode not in (None, 0):
                    seen = time.time()
                    _drain_until(results, got, r, wait_s=0.5)  # a report put before exiting
                    if r not in got:
                        dead[r] = (p.exitcode, seen)
    finally:
        for p in procs:
            p.join(timeout=0.5)
            if p.is_alive():
                p.kill()
                p.join()
    return {r: v[:3] for r, v in got.items()}, dead


def _drain(results, got: dict, procs, world: int, grace_s: float) -> None:
    end = time.monotonic() + grace_s
    while len(got) < world and time.monotonic() < end:
        if all(p.exitcode is not None for r, p in enumerate(procs) if r not in got):
            _collect(results, got, wait_s=0.2)  # whatever they put before exiting
            return
        _collect(results, got)


def _drain_until(results, got: dict, rank: int, wait_s: float) -> None:
    """Collects reports until `rank`'s is in or `wait_s` has passed."""
    end = time.monotonic() + wait_s
    while rank not in got and time.monotonic() < end:
        _collect(results, got)


def _collect(results, got: dict, wait_s: float = 0.05) -> None:
    try:
        item = results.get(timeout=wait_s)
    except queue.Empty:
        return
    got[item[0]] = item[1:]


def _describe(errors: dict, dead: list, procs) -> str:
    # A dead rank is the cause; the errors of the others are usually its consequence.
    parts = [f"rank {r} died (exit code {procs[r].exitcode})" for r in dead]
    parts += [f"rank {r} failed: {v[2]}" for r, v in sorted(errors.items())]
    return "; ".join(parts)
