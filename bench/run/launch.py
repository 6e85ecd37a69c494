"""Starts one process per rank (spawn), or joins a torchrun launch, with hard timeouts.

Locally: `launch(world_size, fn, args, timeout_s)` spawns `fn(rank, world_size, *args)` in
fresh interpreters wired through env:// on a free loopback port, collects each rank's
return value, and fails fast: when any rank exits non-zero or the deadline passes, the
others are killed and `LaunchError` names the rank(s). `launch_to_end` starts the ranks the
same way but kills none when another fails: each runs to its own end (the fault tests time
how a survivor notices a dead peer). `launch_worlds` runs several such launches at once (the
sides of a run, its duet lanes), naming each world that failed.
Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) the caller runs `fn` in-process instead.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable
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


def reserve_port() -> socket.socket:
    """A loopback port held for a launch: bound with SO_REUSEADDR and never listening, so
    the kernel hands it to no other bind(0) nor to an outgoing connection, while rank 0's
    TCPStore (which sets SO_REUSEADDR too) can still bind and listen on it. A port merely
    found free (bound, read, closed) can be taken by another test's gloo connection in the seconds
    before rank 0 binds it; rank 0 then fails to bind and the others wait on a stranger."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


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
    imported the modules set with `set_forkserver_preload` once); returns their processes,
    the queue they report on and the socket holding their port (the caller closes it once
    the ranks have ended)."""
    ctx = mp.get_context(method)
    results = ctx.Queue()
    held = reserve_port()
    port = held.getsockname()[1]
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, results), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
    except BaseException:
        held.close()
        raise
    return procs, results, held


def launch(world: int, fn, args: tuple = (), timeout_s: float = 120.0,
           method: str = "spawn") -> list:
    """Runs fn on `world` ranks; returns the per-rank results in rank order."""
    procs, results, held = _start(world, fn, args, method)
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
        held.close()
    return [got[r][2] for r in range(world)]


def launch_worlds(world: int, fn, worlds: list[tuple[str, tuple]], timeout_s: float,
                  on_failure: Callable[[], None]) -> list[str]:
    """Several worlds of `world` ranks at once, each `launch(world, fn, args)` in a thread of
    this process, for `worlds` as (name, args). A world that fails is named in the errors
    ("NAME: why") and `on_failure()` is called, so the worlds waiting on it stop waiting.
    Returns the errors ([] when every world ended OK)."""
    errors: list[str] = []

    def one(name: str, args: tuple) -> None:
        try:
            launch(world, fn, args, timeout_s=timeout_s)
        except LaunchError as e:
            errors.append(f"{name}: {e}")
            on_failure()

    threads = [threading.Thread(target=one, args=w) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


class Deadline:
    """`timeout_s` from now; or, with `started`, `start_s` from now until `started()` first
    turns true, then `timeout_s` from the moment it was seen to."""

    def __init__(self, timeout_s: float, started=None, start_s: float = 0.0,
                 clock=time.monotonic):
        self.timeout_s, self.started, self.clock = timeout_s, started, clock
        self.at = clock() + (timeout_s if started is None else start_s)

    def passed(self) -> bool:
        now = self.clock()
        if self.started is not None and self.started():
            self.at, self.started = now + self.timeout_s, None
        return now >= self.at


def launch_to_end(world: int, fn, args: tuple = (), timeout_s: float = 120.0,
                  method: str = "spawn", started=None, start_s: float = 0.0
                  ) -> tuple[dict[int, tuple], dict[int, tuple[int, float]]]:
    """Runs fn on `world` ranks and kills none when another fails. Returns, once every rank
    has reported or died (or at the deadline, when the ranks still running are killed and
    in neither): {rank: (wall time of its report, "ok" | "error", value or message)} and
    {rank: (exit code, wall time its death was seen)} for ranks that died without one.

    The deadline is `timeout_s` from the start; with `started` (a callable that turns true
    once every rank has passed its start-up), `start_s` bounds the start-up and `timeout_s`
    runs from the moment it ended: a start-up slowed by a loaded machine (imports, on
    shared cores) is never taken for a hung rank."""
    procs, results, held = _start(world, fn, args, method)
    got: dict[int, tuple] = {}
    dead: dict[int, tuple[int, float]] = {}
    deadline = Deadline(timeout_s, started, start_s)
    try:
        while len(got) + len(dead) < world and not deadline.passed():
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
        held.close()
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
