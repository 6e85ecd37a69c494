"""The rules' false alarms, measured: histories of identical commits (every true ratio 1),
each commit's log ratio drawn from its own interval, half-widths drawn uniformly from the
gate's quiet range (1.5 to 3 %), four gated metrics x two protocols a machine, every gate
PASS. A history with any step or any creep flagged is a false alarm of that rule.

    python -m bench.history.simulate [--histories 2000] [--commits 20,50,100] [--seed 0]

It also prints the rules' power on the plants the tests use (power).

docs/history.md quotes its table."""

from __future__ import annotations

import argparse
import math
import random

from bench.history.rules import Rules, creeps, steps
from bench.history.series import Point, Series, z_of
from bench.report.printer import say

METRICS = ("step_mean", "itl_p50", "prefetch_ttft_p50", "bystander_ttft_p50")
PROTOCOLS = ("pr27010", "pr36425")
QUIET = (0.015, 0.03)


def identical(rng: random.Random, commits: int, quiet: tuple[float, float] = QUIET,
              level: float = 0.95, plant=None) -> list[Series]:
    """One machine's history of `commits` identical commits (plant(metric, protocol, i):
    a true log ratio to add, for power checks); the same commits for every series."""
    z = z_of(level)
    shas = [f"{i:040x}" for i in range(commits)]
    out = []
    for metric in METRICS:
        for protocol in PROTOCOLS:
            pts = []
            for i, sha in enumerate(shas):
                s = rng.uniform(*quiet) / z
                y = rng.gauss(plant(metric, protocol, i) if plant else 0.0, s)
                r = math.exp(y)
                pts.append(Point(i, sha, f"t{i:05d}", r, r * math.exp(-z * s),
                                 r * math.exp(z * s), "PASS", 0.03, "a" * 40, y, s * s, 0))
            out.append(Series("sim", metric, protocol, "wait_complete", 0.03, pts))
    return out


def false_alarms(histories: int, commits: int, seed: int, rules: Rules | None = None) -> dict:
    """Share of `histories` simulated histories with a step flagged, with a creep flagged."""
    rng, rules = random.Random(seed), rules or Rules()
    step = creep = 0
    for _ in range(histories):
        series = identical(rng, commits)
        step += bool(steps(series, rules))
        creep += bool(creeps(series, rules))
    return {"histories": histories, "commits": commits, "seed": seed,
            "step": step / histories, "creep": creep / histories}


def power(histories: int, seed: int, rules: Rules | None = None) -> dict:
    """How often the rules see what the tests plant, on one of the eight series: a 5 % step
    at commit 10 of 20 (named at exactly that commit), and a creep of 1 % a commit over
    commits 6-11 of 15 (the last three held), flagged as creep."""
    rng, rules = random.Random(seed), rules or Rules()
    named = crept = 0
    for _ in range(histories):
        s = identical(rng, 20, plant=lambda m, p, i: math.log(1.05) * (
            (m, p) == (METRICS[0], PROTOCOLS[1]) and i >= 10))
        named += any(f.commit == f"{10:040x}" and f.series is s[1] for f in steps(s, rules))
        s = identical(rng, 15, plant=lambda m, p, i: math.log1p(0.01 * min(max(i - 5, 0), 6))
                      * ((m, p) == (METRICS[0], PROTOCOLS[1])))
        crept += any(f.series is s[1] for f in creeps(s, rules))
    return {"histories": histories, "step_named": named / histories,
            "creep_flagged": crept / histories}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--histories", type=int, default=2000)
    p.add_argument("--commits", default="20,50,100")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    say("| commits | histories | step: false alarms | creep: false alarms |")
    say("|---|---|---|---|")
    for n in (int(x) for x in args.commits.split(",")):
        r = false_alarms(args.histories, n, args.seed)
        say(f"| {n} | {r['histories']} | {r['step']:.2%} | {r['creep']:.2%} |")
    r = power(args.histories, args.seed)
    say(f"power over {r['histories']} histories: 5 % step named at its commit "
          f"{r['step_named']:.1%}; 1 %/commit creep over 6 commits flagged "
          f"{r['creep_flagged']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
