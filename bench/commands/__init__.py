"""The verbs of `python -m bench`, one module each: name -> (arguments, one-line help,
module).

Each module has `main(argv) -> int` (0 OK, 1 a check failed, 2 bad input: a
bench.errors.UserError, caught once by common.run_verb); the engine it drives lives in
bench/'s package for that concern (plan/, run/, analysis/, compare/, ab/, gate/, project/,
hazards/, sglang_poll/, timeline/). `python -m bench` builds its usage text, dispatch and the
unknown-verb message from this one table.
"""

from __future__ import annotations

VERBS: dict[str, tuple[str, str, str]] = {
    "run": ("[options]", "the main job (see `python -m bench run --help`)",
            "bench.commands.run"),
    "report": ("RUN_DIR", "rebuild summary, plots and report.md from a run's CSVs",
               "bench.commands.report"),
    "gate": ("RUN_DIR", "CI perf gate against results/baseline", "bench.commands.gate"),
    "compare": ("RUN_A RUN_B", "two runs side by side: counts and timing ratios B/A",
                "bench.commands.compare"),
    "fidelity": ("CANDIDATE_RUN FREE_RUN", "does a run's headline match a free-running run's "
                 "(its ratios inside the free intervals)", "bench.commands.fidelity"),
    "ab": ("REV_A REV_B", "two revisions interleaved on this machine: counts and B/A with "
           "between-repeat intervals", "bench.commands.ab"),
    "bisect": ("GOOD BAD --metric M", "the first commit that made a metric worse (ab at each "
               "step)", "bench.commands.bisect"),
    "history": ("add DIR DECISION_JSON | DIR", "the gate's memory: keep each decision.json; "
                "per-commit ratios, steps, creep", "bench.commands.history"),
    "noise": ("[--runs N]", "a preset's run-to-run noise: intervals and their coverage",
              "bench.commands.noise"),
    "microbench": ("RUN_DIR", "micro-benchmarks (pytest-benchmark) saved with a run",
                   "bench.commands.microbench"),
    "project": ("RUN_DIR", "predicted step overhead and ITL inflation at TP 2-64, PP 1-4",
                "bench.commands.project"),
    "timeline": ("RUN_DIR [--cell P/POLICY/R] [--steps A:B]", "a run's per-rank timeline: "
                 "timeline.pftrace (ui.perfetto.dev) and a PNG", "bench.commands.timeline"),
    "hazards": ("[--protocols P,..] [--scenarios S,..]", "the open PRs' protocols x hazard "
                "scenarios: deadlock, divergence or corrupt pages, or OK with its cost",
                "bench.commands.hazards"),
    "review": ("--sglang BASE,HEAD", "the page a reviewer of a pull request to SGLang reads: "
               "a run of both sides and their hazard cells", "bench.commands.review"),
    "sglang-poll": ("--sglang SPEC [--tp N] [--pp N]", "SGLang's own poll (a release, wheel "
                    "or source tree) on this machine's ranks, counted at its call sites, "
                    "against the project's model", "bench.commands.sglang_poll"),
    "devcheck": ("...", "device checks of scripts/gpu_check.sh (H2D, load-back, forward)",
                 "bench.commands.devcheck"),
}
