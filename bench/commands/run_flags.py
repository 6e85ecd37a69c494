"""`bench run`'s flags, in --help's sections by what they set: the parser the verb
(bench.commands.run) parses its command line with, and docs/options.md is built from. A
part of the verb, not a verb: every value is checked after parsing (bench.plan.resolve)."""

from __future__ import annotations

from pathlib import Path

from bench.commands import trace_flags
from bench.commands.common import CliParser, add_cache_options
from bench.plan.options import PAIRINGS, REPEAT_SEEDS
from bench.plan.presets import PRESET_HELP, PRESETS
from bench.run.plan import ALIASES
from hicache.spec.cost_model import HOST_MEMORY, POLICIES, PROTOCOLS
from hicache.spec.pinned import SCHEDULES
from hicache.spec.shapes import SHAPES
from hicache.spec.step_time import GPUS

GROUPS = {  # --help's sections: title -> what they set
    'what runs': 'the protocols and policies of the cells, and how often',
    'layout and device': "ranks, the model's shape and where its forward runs",
    'synthetic workload': 'the queue burst and its bystanders (the synthetic presets)',
    'trace replay and cache tiers': 'a Mooncake-format trace instead of the synthetic workload',
    'storage': 'the storage tier the prefetches read',
    'system': 'HiCache settings',
    'hazards and faults': 'reproduce a known hazard or kill a rank',
    'output': None,
}


def _group(p: CliParser, title: str):
    """The add_argument of --help's section `title`."""
    return p.add_argument_group(title, GROUPS[title]).add_argument


def _what_runs(a) -> None:
    """--help's section 'what runs': the cells and how often they are served."""
    a("--preset", default="default", choices=sorted(PRESETS),
      help="; ".join(f"{k}: {v}" for k, v in PRESET_HELP.items()).replace("%", "%%"))
    a("--protocols", help=f"comma list of {', '.join(PROTOCOLS)} (aliases: "
      f"{', '.join(f'{k}={v}' for k, v in ALIASES.items())}; docs/releases.md)")
    a("--policies", help=f"comma list of {', '.join(POLICIES)}")
    a("--repeats", type=int, help="repeats of every cell: whole serves, the unit an interval "
      "is taken over (the preset's)")
    a("--resolve", type=float, metavar="F", help="stages until the headline's p50 ratios each "
      "resolve F (95%% half-width) or the budget ends: --repeats the first, stage k on seed "
      "SEED + k (the default preset: 0.03; 0, or --repeats alone: one stage)")
    a("--budget-s", type=float, metavar="S", help="with --resolve: no stage starts after S s "
      "(default 300)")
    a("--budget-repeats", type=int, metavar="N", help="with --resolve: repeats in all "
      "(default 96)")
    a("--seed", type=int, default=0, help="the workload and storage noise of every protocol "
      "in a repeat: seed SEED x 1000 + r in repeat r, or SEED x 1000 in every repeat under "
      "--repeat-seeds same")
    a("--repeat-seeds", choices=REPEAT_SEEDS, help="same: every repeat replays one workload "
      "(with --schedule pinned one schedule, so repeats differ by the machine's noise "
      "alone: the default, queue and releases presets); distinct: each repeat a workload "
      "of its own, so the interval spans workloads too (every other preset)")
    a("--redo-disturbed", type=int, metavar="N", help="under a pinned schedule, serve a "
      "cell again (up to N times) when the machine lost more than 5%% of its CPU time to "
      "steal or to other processes during it, and keep the last serve (ranks.csv: attempts, "
      "steal_s, other_cpu_s, cpu_lost); 0: never (1 in the default and queue presets, 0 "
      "elsewhere)")
    a("--schedule", choices=SCHEDULES, help="pinned: arrivals, IO completions and timeouts "
      "on a virtual clock advanced by the modelled forward, one schedule per seed, so a "
      "difference is the protocol's host cost (the cost, queue and ci presets); free: "
      "on the wall clock, the end-to-end effect with its feedback through the schedule "
      "(every other preset; docs/design.md, Pinned schedules)")
    a("--pairing", choices=("serial", *PAIRINGS), help="how the protocols of a repeat "
      "serve: serial (in turn, the order rotated per repeat: the default), duet (at the same "
      "time, each on ranks of its own) or step (pr27010 / pr36425: every poll asks the first "
      "protocol too, both timed, answers checked equal; docs/usage.md, Pairing)")
    add_cache_options(a, "its protocol is the release's, e.g. sglang-0.5.23@unified",
                      several=True)
    from sglang_adapter import SGLANG_PATHS

    a("--sglang-path", choices=SGLANG_PATHS, help="with --cache sglang, what of SGLang runs: "
      "controller (its controller path is the data path too: prefetch_from_storage, its "
      "threads, drains and end path on the harness's storage, host pool and tree; 0.5.19 on, "
      "buffer_only at --pp > 1 0.5.21 on, --extra-pool 0.5.23 on), decisions (its "
      "check_hicache_events and check_prefetch_progress on the project's data path), or "
      "auto (the default: controller where the run fits it; docs/sglang.md)")
    a("--sglang-consensus", action="store_true", help="with --cache sglang: SGLang's own "
      "rank-consensus checker on in every serve, as its scheduler configures it (0.5.23 on; "
      "its collectives on its own groups, counted apart); consensus.csv says per serve "
      "whether it fired, and where, and a fired checker fails the run (docs/hazards.md)")
    a("--model-beside", action="store_true", help="with several SGLangs (--sglang A,B): "
      "the project's model of each side's release (0.5.18 pre27010, 0.5.19 pr36425) serves "
      "too, on a world of its own in the same turns and seeds, and a fidelity line per "
      "metric says whether the model's ratio lies inside SGLang's 95%% interval (preset "
      "seed-pr; docs/sglang.md, The seed PR as released)")
    a("--neighbour", metavar="SPEC", help="plant a noisy neighbour for the whole run: a "
      "process taking CPU in seeded bursts (default: cpu=0.5,burst=50ms-2s,seed=0; or "
      "cpu=F,burst=MIN-MAX,seed=N), recorded in env.json (docs/usage.md, Pairing)")



def _layout_and_device(a) -> None:
    """--help's section 'layout and device': ranks, the model and the device."""
    a("--tp", type=int, help="tensor-parallel ranks (the preset's; 2 on CPU)")
    a("--pp", type=int, help="pipeline stages (1)")
    a("--nproc", type=int, help="ranks to launch locally (default tp*pp)")
    a("--device", choices=("auto", "cpu", "cuda"), default="auto",
      help="auto: cuda when every local rank has a GPU (and NCCL), else cpu")
    a("--data-backend", choices=("nccl", "gloo"),
      help="model all-reduces: nccl (default on CUDA, one GPU per rank) or gloo (the only one "
      "on CPU; on CUDA lets ranks share GPUs, rank r on GPU r %% GPUs: not an NCCL measurement)")
    a("--model", choices=sorted(SHAPES), help="model shape (llama3-8b): KV bytes per page; "
      "the forward's modelled time on CPU, its real shape on CUDA")
    a("--gpu", choices=(*GPUS, "none"), help="GPU whose forward the CPU stand-in sleeps out "
      "(h100); none: steps last their CPU work")
    a("--step-ms", type=float, help="the modelled decode step's fixed part, ms (default: "
      "the model's roofline on --gpu, e.g. 4.5 for llama3-8b at TP2 on h100)")
    a("--kv-budget-gib", type=float,
      help="real KV pages (CUDA, non-toy model): GiB of each of the host (pinned) and device "
      "KV pools per rank; page counts follow from it (default 4)")



def _synthetic_workload(a) -> None:
    """--help's section 'synthetic workload': the queue burst and its bystanders."""
    a("--requests", type=int, help="measured requests per configuration and repeat")
    a("--rate", type=float, help="Poisson arrival rate of the prefetching requests, "
      "requests/s; inf = a burst")
    a("--bystanders", type=int, help="requests with nothing to prefetch (short prompts)")
    a("--bystander-rate", type=float, help="their Poisson arrival rate, requests/s")
    a("--output-tokens", type=int, help="tokens every request generates (64)")
    a("--max-running", type=int, help="running batch bound, max_running_requests (256)")



def _storage(a) -> None:
    """--help's section 'storage': the storage tier."""
    a("--storage", choices=("sim", "file"), default="sim",
      help="sim: pages in memory, reads timed by the latency and bandwidth below; file: "
      "real files under results/.storage")
    a("--storage-latency-ms", type=float, help="per 128-page batch read (2)")
    a("--storage-gbps", type=float, help="storage read bandwidth per rank, GB/s (3, Mooncake "
      "over TCP); a batch costs latency + its KV bytes / bandwidth")
    a("--jitter", type=float, help="per-rank storage slowdown spread, e.g. 0.5")
    a("--fail-rate", type=float, help="probability that a storage batch read fails")
    a("--stall-ms", type=float, help="extra delay of every storage read (a stalling tier)")
    a("--extra-pool", action="store_true", help="read a side-car pool after the KV pages")



def _system(a) -> None:
    """--help's section 'system': HiCache settings."""
    a("--host-memory", choices=HOST_MEMORY, help="cache (default): host memory is an L2 "
      "tier; buffer_only: staging for one load-back, and with --pp > 1 sglang-0.5.23's "
      "PP-ticket path (docs/releases.md)")
    a("--timeout-base", type=float, help="prefetch timeout base, s (default 1.0)")
    a("--consensus", action="store_true",
      help="online rank-consensus checker (docs/design.md section 6)")
    a("--timeline", action="store_true", help="record every collective, poll, storage "
      "batch and copy per thread, for `python -m bench timeline` (docs/timeline.md)")
    a("--collective-timeout", type=float, help="seconds before a collective fails (60)")
    a("--collective-delay-ms", metavar="MS", help="an added cost: every control-plane "
      "collective of the system under test (SGLang's too) first sleeps MS ms on every rank, "
      "as on a slow interconnect; c includes it (0). A comma list (0,0.5,1,2,3) is a cost "
      "sweep: every repeat serves each cost, interleaved, each cost's rows in a run "
      "directory of its own, compared in sweep.md (preset delay-sweep)")



def _hazards_and_faults(a) -> None:
    """--help's section 'hazards and faults': known hazards and planted faults."""
    a("--no-race-guard", action="store_true", help="pre27010 without PR #27550's guard")
    a("--budget-skew", type=float, help="rank-local walk horizon skew (#30760), 0..1")
    a("--land-step", type=int, help="the prefixes in storage are another writer's, landing "
      "at this scheduler step: a hit query issued before it misses them (0.5.23 retries "
      "it, docs/hazards.md 'Retries (0.5.23)'); 0: stored from the start")
    a("--land-skew-steps", type=int, help="every TP rank but 0 sees them this many steps "
      "later than rank 0 (ranks that see a miss differently)")
    a("--kill-rank", type=int, help="fault injection: this rank exits at --kill-step")
    a("--kill-step", type=int, help="the process-wide step at which --kill-rank exits")
    a("--host-work", choices=("calls", "opcodes", "none"), help="after each cell's timed "
      "serve, serve its workload once more untimed and count the scheduler thread's Python "
      "work per step and per poll (calls: function calls; opcodes: bytecodes): ranks.csv "
      "host_* columns, gated by bench gate (gate.json host_work); the ci preset's: calls")
    a("--plant", metavar="PROTOCOL:MS", help="fault injection: every step of PROTOCOL's "
      "cells whose walk polls a pending prefetch spins MS ms more (a known host cost: "
      "what a paired design must recover, docs/usage.md, Pairing); PROTOCOL:Ncalls makes N "
      "extra Python calls instead (host work of a fixed size: bench.run.host_profile counts it)")



def _output(a) -> None:
    """--help's section 'output': where results go."""
    a("--out", type=Path,
      help="results directory, new or empty (default results/<UTC>_<preset>_<sha>)")


SECTIONS = (  # --help's sections in order, each with what adds its flags
    ('what runs', _what_runs),
    ('layout and device', _layout_and_device),
    ('synthetic workload', _synthetic_workload),
    ('trace replay and cache tiers', trace_flags.add_flags),
    ('storage', _storage),
    ('system', _system),
    ('hazards and faults', _hazards_and_faults),
    ('output', _output),
)


def parser(prog: str, doc: str) -> CliParser:
    """`bench run`'s parser: its usage text `doc` (the verb's docstring), its flags in
    --help's sections (GROUPS)."""
    p = CliParser.from_doc(prog, doc)
    for title, add_flags in SECTIONS:
        add_flags(_group(p, title))
    return p
