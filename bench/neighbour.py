"""A noisy neighbour you can plant: a seeded process that takes CPU in bursts.

Shared machines (CI runners, dev boxes, burstable VMs) lose CPU in bursts of 0.1-4 s, and
a burst lands on one side's serve and not the other's. To measure what a design does
under such a machine on any machine, quiet or not, `Neighbour` starts one separate process
(its own interpreter: it never shares the ranks' GIL) that alternates busy bursts (a spin
on one core) and idle gaps:

- burst lengths are drawn log-uniform in [burst_min_s, burst_max_s];
- each gap is exponential with mean burst x (1 - cpu) / cpu, so over a long run the
  process takes `cpu` of one core, in bursts;
- every draw comes from `numpy.random.default_rng(seed)`: one seed, one pattern.

SPEC (`--neighbour SPEC`): `off`, `default` (cpu=0.5,burst=50ms-2s,seed=0), or a comma list
of `cpu=F` (0 < F <= 1), `burst=MIN-MAX` (durations like 50ms, 2s, 0.3), `seed=N`.
`python -m bench.neighbour SPEC [--seconds S]` runs one in the foreground (scripts, tests).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.report.printer import say_err

DEFAULT = "cpu=0.5,burst=50ms-2s,seed=0"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)?$")


class SpecError(ValueError):
    """A bad neighbour spec; the message is one line."""


@dataclass(frozen=True)
class NeighbourSpec:
    cpu: float = 0.5  # long-run share of one core
    burst_min_s: float = 0.05
    burst_max_s: float = 2.0
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.cpu <= 1:
            raise SpecError(f"--neighbour cpu must be in (0, 1], got {self.cpu}")
        if not 0 < self.burst_min_s <= self.burst_max_s:
            raise SpecError(f"--neighbour burst must be MIN-MAX with 0 < MIN <= MAX, got "
                            f"{self.burst_min_s}-{self.burst_max_s}")

    @property
    def text(self) -> str:
        return (f"cpu={self.cpu:g},burst={self.burst_min_s * 1e3:g}ms-"
                f"{self.burst_max_s * 1e3:g}ms,seed={self.seed}")

    def pattern(self, n: int) -> list[tuple[float, float]]:
        """The first n (burst_s, gap_s) pairs this seed draws."""
        rng = np.random.default_rng(self.seed)
        lo, hi = np.log(self.burst_min_s), np.log(self.burst_max_s)
        out = []
        for _ in range(n):
            burst = float(np.exp(rng.uniform(lo, hi)))
            gap = float(rng.exponential(burst * (1 - self.cpu) / self.cpu)) \
                if self.cpu < 1 else 0.0
            out.append((burst, gap))
        return out


def _seconds(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise SpecError(f"--neighbour: {text!r} is not a duration (e.g. 50ms, 2s, 0.3)")
    return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


def parse(text: str | None) -> NeighbourSpec | None:
    """The spec `text` asks for; None for off (or no text). SpecError when it is bad."""
    if text is None or text.strip() in ("", "off", "none"):
        return None
    text = DEFAULT if text.strip() == "default" else text
    kw: dict[str, object] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, eq, value = item.partition("=")
        if not eq:
            raise SpecError(f"--neighbour: {item!r} is not KEY=VALUE (cpu=, burst=, seed=)")
        try:
            if key == "cpu":
                kw["cpu"] = float(value)
            elif key == "seed":
                kw["seed"] = int(value)
            elif key == "burst":
                lo, dash, hi = value.partition("-")
                if not dash:
                    raise SpecError(f"--neighbour burst={value!r}: expected MIN-MAX, e.g. "
                                    f"50ms-2s")
                kw["burst_min_s"], kw["burst_max_s"] = _seconds(lo), _seconds(hi)
            else:
                raise SpecError(f"--neighbour: unknown key {key!r} (cpu, burst, seed)")
        except ValueError as e:
            raise SpecError(str(e) if isinstance(e, SpecError) else
                            f"--neighbour {key}={value!r}: {e}") from None
    return NeighbourSpec(**kw)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def serve(spec: NeighbourSpec, seconds: float | None = None) -> None:
    """The neighbour's loop (in its own process): bursts and gaps until SIGTERM or
    `seconds`."""
    start = time.monotonic()
    i, batch = 0, spec.pattern(4096)
    while seconds is None or time.monotonic() - start < seconds:
        burst, gap = batch[i % len(batch)]
        _spin(burst)
        time.sleep(gap)
        i += 1


def _process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process from /proc (None where it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Neighbour:
    """Starts the neighbour process on enter and stops it on exit; `record()` says what
    ran (for env.json): the spec, its wall time and the CPU seconds it took."""

    def __init__(self, spec: NeighbourSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        self.cpu_s: float | None = None
        self.wall_s: float | None = None

    def __enter__(self) -> Neighbour:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.neighbour", self.spec.text],
                                     cwd=str(Path(__file__).resolve().parents[1]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.cpu_s = _process_cpu_s(self.proc.pid)
        self.wall_s = time.monotonic() - self.t0
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def record(self) -> dict:
        share = None if not (self.cpu_s is not None and self.wall_s) else \
            round(self.cpu_s / self.wall_s, 3)
        return {**asdict(self.spec), "spec": self.spec.text, "wall_s": _round(self.wall_s),
                "cpu_s": _round(self.cpu_s), "cpu_share_measured": share}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def main(argv: list[str]) -> int:
    seconds = None
    if len(argv) == 3 and argv[1] == "--seconds":
        seconds = float(argv[2])
    elif len(argv) != 1:
        say_err("usage: python -m bench.neighbour SPEC [--seconds S]")
        return 2
    try:
        spec = parse(argv[0])
    except SpecError as e:
        say_err(f"bench.neighbour: {e}")
        return 2
    if spec is None:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(spec, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
