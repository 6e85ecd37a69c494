"""Two revisions as sides of one run: each side's `bench run` from its own tree, their turns
conducted from here over bench.run.turns' interface.

Each side is a whole `bench run` process started in its revision's worktree (cwd and
PYTHONPATH that tree), so its ranks import that revision's hicache/ and rank worker. The
sides start together; their ranks connect here and say who they are (the hello), and
nothing serves until every rank of both sides has. Then the turns: each side's setup (its
groups and calibration) alone, in an order drawn from the seed; then, for every cell of the
plan, A's serve and B's serve of that cell back to back, the side that goes first drawn per
repeat from the seed (as many repeats A-first as B-first). While one side serves, the
other's ranks block in a read. After the last turn each side writes its own run directory
and exits.

Every run checks that each rank's serve path came from its own side's tree (the hello's
`modules`), that both sides plan the same cells, and that both exited 0.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.ab.procs import _end, settle
from bench.analysis.plot_switch import NO_PLOTS
from bench.run import turns
from bench.rundir.files import ResultFileError
from bench.rundir.rundir import RunDir

START_S = 240.0  # every rank of both sides connected (imports on shared cores are slow)
TURN_S = 600.0  # one turn: a setup or one serve (bench run bounds its serves well below)
END_S = 300.0  # after the last turn: each side writes its reports and exits


class ConductError(ResultFileError):
    """A side that could not be served (refused its flags, died, broke the interface): one
    line, naming the side."""


@dataclass
class SideProc:
    """One side: its name (a or b), tree, run directory, process and ranks' connections."""

    name: str
    root: Path
    out: Path
    proc: subprocess.Popen | None = None
    conns: dict[int, socket.socket] = field(default_factory=dict)
    readers: dict[int, object] = field(default_factory=dict)  # each connection's lines
    hellos: dict[int, dict] = field(default_factory=dict)
    log: object = None

    def tail(self) -> str:
        log = RunDir(self.out).console_log()
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        return lines[-1] if lines else "(no output)"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ConductError(f"side {self.name.upper()}: bench run exited "
                               f"{self.proc.returncode} before its turns ended: {self.tail()}")


def first_sides(seed: int, repeats: int) -> list[str]:
    """Per repeat, the side that serves first: half the repeats each (the odd one a coin),
    in an order drawn from the seed."""
    rng = random.Random(f"bench-ab-served:{seed}")
    sides = ["a", "b"] * (repeats // 2) + [rng.choice("ab")] * (repeats % 2)
    rng.shuffle(sides)
    return sides


def turn_order(cells: list[str], first: list[str]) -> list[tuple[str, object]]:
    """(side, position) in the order served: the setups (A first when repeat 0's first side
    is A), then every cell by both sides, repeat r's first side first."""
    setup = ["a", "b"] if first[0] == "a" else ["b", "a"]
    order: list[tuple[str, object]] = [(s, "setup") for s in setup]
    for i, key in enumerate(cells):
        one = first[int(key.split("/", 1)[0])]
        order += [(one, i), ("b" if one == "a" else "a", i)]
    return order


def inside(path: str, root: Path) -> bool:
    return Path(root).resolve() in Path(path).resolve().parents


class Conductor:
    """The listening socket and both sides; `serve` runs one stage of the run."""

    def __init__(self, sides: list[SideProc]) -> None:
        self.sides = {s.name: s for s in sides}
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def start(self, command: list[str]) -> None:
        """Starts both sides' `bench run COMMAND --out DIR`, each in its own tree."""
        for s in self.sides.values():
            s.out.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, NO_PLOTS: "1", turns.ENV: f"{self.address}:{s.name}",
                   "PYTHONPATH": os.pathsep.join(
                       [str(s.root), *filter(None, [os.environ.get("PYTHONPATH")])])}
            s.log = open(RunDir(s.out).console_log(), "w")
            s.proc = subprocess.Popen(
                [sys.executable, "-m", "bench", "run", *command, "--out", str(s.out)],
                cwd=s.root, env=env, stdout=s.log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def connect(self) -> list[str]:
        """Accepts every rank of both sides; returns the cells both plan (checked equal)."""
        deadline = time.monotonic() + START_S
        self.listener.settimeout(1.0)
        while not all(s.hellos and len(s.hellos) == next(iter(s.hellos.values()))["world"]
                      for s in self.sides.values()):
            for s in self.sides.values():
                s.check_alive()
            if time.monotonic() > deadline:
                raise ConductError(f"the sides' ranks did not all connect within {START_S:.0f}s")
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self._hello(conn)
        return self._same_cells()

    def _hello(self, conn: socket.socket) -> None:
        conn.settimeout(60.0)
        reader = conn.makefile("r", encoding="utf-8")
        line = reader.readline()
        conn.settimeout(None)
        try:
            hello = json.loads(line)
        except json.JSONDecodeError:
            raise ConductError(f"a rank sent no hello of the side interface: {line[:80]!r}") \
                from None
        s = self.sides.get(hello.get("side"))
        if s is None:
            raise ConductError(f"a rank named an unknown side {hello.get('side')!r}")
        if hello.get("interface") != turns.INTERFACE:
            raise ConductError(f"side {s.name.upper()} speaks side interface "
                               f"{hello.get('interface')}, this run {turns.INTERFACE}")
        for name, path in hello.get("modules", {}).items():
            if not inside(path, s.root):
                raise ConductError(f"side {s.name.upper()} rank {hello['rank']} imported "
                                   f"{name} from {path}, outside its tree {s.root}")
        missing = set(turns.SERVE_PATH) - set(hello.get("modules", {}))
        if missing:
            raise ConductError(f"side {s.name.upper()} rank {hello['rank']} did not say "
                               f"where it imported {', '.join(sorted(missing))} from")
        s.conns[hello["rank"]], s.hellos[hello["rank"]] = conn, hello
        s.readers[hello["rank"]] = reader

    def _same_cells(self) -> list[str]:
        a, b = (next(iter(s.hellos.values()))["cells"] for s in self.sides.values())
        if a != b:
            diff = next((f"{x} against {y}" for x, y in zip(a, b, strict=False) if x != y),
                        f"{len(a)} cells against {len(b)}")
            raise ConductError(f"the two sides plan different cells: {diff}")
        return a

    def turn(self, name: str, position) -> float:
        """Serves one turn of side `name`; returns its seconds."""
        s, t0 = self.sides[name], time.monotonic()
        for conn in s.conns.values():
            conn.sendall((json.dumps({"go": position}) + "\n").encode())
        pending, readers = dict(s.conns), s.readers
        with selectors.DefaultSelector() as sel:
            for r, c in pending.items():
                sel.register(c, selectors.EVENT_READ, r)
            while pending:
                if time.monotonic() - t0 > TURN_S:
                    raise ConductError(f"side {name.upper()}: turn {position} ran past "
                                       f"{TURN_S:.0f}s")
                for key, _ in sel.select(timeout=1.0):
                    r = key.data
                    line = readers[r].readline()
                    if not line:
                        s.check_alive()
                        raise ConductError(f"side {name.upper()} rank {r} closed its "
                                           f"connection in turn {position}: {s.tail()}")
                    if json.loads(line).get("done") != position:
                        raise ConductError(f"side {name.upper()} rank {r} answered {line!r} "
                                           f"to turn {position}")
                    sel.unregister(key.fileobj)
                    pending.pop(r)
                s.check_alive()
        return time.monotonic() - t0

    def end(self) -> None:
        """Tells every rank of both sides that every turn is served: each side may now end
        its run (bench.run.turns, interface 2's end line)."""
        for s in self.sides.values():
            for conn in s.conns.values():
                conn.sendall(b'{"go": "end"}\n')

    def finish(self) -> dict[str, int]:
        """Ends both sides' runs (the end line), then waits for them to write their runs and
        exit; their exit codes."""
        self.end()
        codes = {}
        for s in self.sides.values():
            try:
                codes[s.name] = s.proc.wait(timeout=END_S)
            except subprocess.TimeoutExpired:
                codes[s.name] = 124
            settle(s.proc.pid)
        return codes

    def close(self) -> None:
        """Stops whatever is left (on an error: the ranks read a stop line) and closes."""
        for s in self.sides.values():
            for conn in s.conns.values():
                try:
                    conn.sendall(b'{"stop": "the run ended"}\n')
                except OSError:
                    pass
                conn.close()
            if s.proc is not None and s.proc.poll() is None:
                _end(s.proc.pid)
                s.proc.wait()
            if s.log is not None:
                s.log.close()
        self.listener.close()
