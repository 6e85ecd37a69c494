"""The side interface: a revision's ranks serving as one side of another revision's run.

`bench ab` and `bench gate --ab` serve two revisions of this project in one interleaved run
(bench.ab.served): each revision's `bench run` starts from its own worktree, so its ranks
import hicache/ and the rank worker from that tree, and two revisions never meet in one
interpreter. What the two processes share is this interface, versioned by INTERFACE
(docs/testing.md):

- The plan a side takes is a `bench run` command line (--preset, --repeats, --seed, --out,
  --protocols, --policies, --schedule, --requests, --bystanders), run in the side's tree
  with ENV set to `HOST:PORT:NAME`.
- Each rank connects to HOST:PORT and sends one JSON line, its hello: `interface`, `side`
  (NAME), `rank`, `world`, `pid`, `modules` (the files its serve path was imported from:
  the run checks each lies in the side's own tree) and `cells` (its plan's cells, as
  `repeat/rate/policy/protocol`: the two sides must serve the same ones).
- Then, per turn, the ranks read a line `{"go": "setup"}` or `{"go": I}` (I: the index of
  the next cell in the plan's order), do that turn, and answer `{"done": ...}` with the same
  value; a line `{"stop": WHY}`, or the connection closing, ends the side (SideAborted).
  Nothing else of a side runs while the other side's turn is served: its ranks block in a
  read, and every turn of one side waits for the other side's turn before it.
- After its last turn a rank reads one more line, `{"go": "end"}`, and only then does its
  side's end of run (rows flushed, reports written, processes ended): the run sends it once
  every turn of both sides has been served, so no side's end of run overlaps the other
  side's last serve (docs/results/2026-12-06_gate_lean_de63bc7.md).
- A side writes an ordinary run directory into --out (requests.csv, steps.csv, ranks.csv,
  summary.csv, env.json: bench.rundir.schema), which the run reads back as `bench compare`
  reads any run (bench.compare.comparison.load_run).

INTERFACE grows by one for any change to the above; bench.ab.served refuses a revision whose
INTERFACE differs from its own, in one line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

INTERFACE = 2
ENV = "HICACHE_BENCH_TURNS"
SERVE_PATH = ("hicache", "bench.run.worker", "bench.run.turns")  # whose files a hello names


class SideAborted(RuntimeError):
    """A side stops: the run that served it stopped it (a stop line, the connection closed),
    or another side of its run failed (bench.run.sglang_worlds.Turns.wait)."""


def cell_key(cell) -> str:
    """A cell as both sides' plans must agree on it."""
    return f"{cell.repeat}/{cell.rate_rps:g}/{cell.policy}/{cell.protocol}"


def modules() -> dict[str, str]:
    """The files this process's serve path was imported from."""
    return {name: str(Path(sys.modules[name].__file__).resolve()) for name in SERVE_PATH
            if name in sys.modules and getattr(sys.modules[name], "__file__", None)}


class SocketSide:
    """One rank's connection to the run serving it as a side: the turn-taking object the
    rank worker holds (setup(), serve(cell), cells(plan), as bench.run.sglang_worlds.Side). Owned by
    the rank's main thread; the socket is blocking, so a waiting rank uses no CPU."""

    def __init__(self, address: str, rank: int, world: int, plan) -> None:
        host, port, self.name = address.rsplit(":", 2)
        self.sock = socket.create_connection((host, int(port)), timeout=60.0)
        self.sock.settimeout(None)  # a turn may wait as long as the other side serves
        self.reader = self.sock.makefile("r", encoding="utf-8")
        self._send({"interface": INTERFACE, "side": self.name, "rank": rank, "world": world,
                    "pid": os.getpid(), "modules": modules(),
                    "cells": [cell_key(c) for c in plan.cells()]})

    def cells(self, plan) -> list:
        return plan.cells()

    def setup(self):
        return self._turn("setup")

    def serve(self, cell):
        return self._turn(cell.index)

    def end(self, plan) -> None:
        """Blocks until the run says every turn of both sides is served (its end line)."""
        self._await("end")

    def _turn(self, position):
        side = self

        class _Turn:
            def __enter__(self):
                side._await(position)

            def __exit__(self, kind, *exc):
                if kind is None:
                    side._send({"done": position})
        return _Turn()

    def _await(self, position) -> None:
        try:
            line = self.reader.readline()  # blocks while the other side serves: no CPU
        except OSError:
            line = ""  # the run went away
        if not line:
            raise SideAborted(f"side {self.name}: the run closed the connection before turn "
                              f"{position}")
        message = json.loads(line)
        if "stop" in message:
            raise SideAborted(f"side {self.name}: stopped by the run: {message['stop']}")
        if message.get("go") != position:
            raise SideAborted(f"side {self.name}: the run gave turn {message.get('go')!r}, "
                              f"this rank expected {position!r}")

    def _send(self, message: dict) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())


def from_env(rank: int, world: int, plan) -> SocketSide | None:
    """This rank's side when a run serves it as one (ENV set), else None."""
    address = os.environ.get(ENV)
    return SocketSide(address, rank, world, plan) if address else None
