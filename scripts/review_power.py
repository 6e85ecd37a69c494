"""Usage: python scripts/review_power.py [--aa N] [--plants N] [--share F] [--release R]
                                       [--scenarios S] [--review-args ARGS]
                                       [--out DIR | --resume DIR] [--lock FILE]

Measures `bench review`'s timing verdicts on this machine as a CI job would meet them: --aa
reviews of one SGLang release against itself (`base=R,head=R`: every timing FAIL is a false
alarm, every INCONCLUSIVE a job rerun) and --plants reviews of the release against a copy of
its tree (`head=TREE`) whose `UnifiedRadixCache.check_hicache_events`, called once per
scheduler step, spins `--share` (default 0.05) of the time since its previous call minus its
own last spin: each step grows by that share of itself, with no collective added. A FAIL of
the step check is a catch. Each review runs the hazard cells --scenarios (default walk-skew:
the timing half is what is measured, and the cells add minutes) and its default stages, or
those --review-args sets (one quoted string of `bench review` options, e.g. '--budget-s 900').

The reviews run interleaved, an A/A then a plant, so a study cut short keeps both kinds.
`--lock FILE` (default /tmp/hicache-cpu.lock) is taken exclusively around each review;
other work that takes it shared (`flock -s FILE CMD`) waits for the review in flight.
Every review's decision.json (its verdict, and per timing check its interval, pairs and
method, and the machine's cpu_lost) is read, never its console; the table is printed and
written to DIR/review_power.md, the rows to DIR/review_power.json. `--resume DIR` goes on
until each kind has the counts asked for. A review takes 15 to 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.rundir.files import write_json_atomic, write_text_atomic  # noqa: E402
from sglang_adapter import SourceError, resolve  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from gate_power import holding  # noqa: E402

HOOK = "    def check_hicache_events(self) -> None:\n"
CACHE_FILE = Path("sglang") / "srt" / "mem_cache" / "unified_radix_cache.py"


def planted_source(share: float) -> str:
    """The lines planted at the start of check_hicache_events (after its docstring): the
    real clock, whatever SGLang's module `time` reads in the harness."""
    return (
        "        _clock = __import__('time').perf_counter\n"
        "        _now = _clock()\n"
        "        _since = (_now - getattr(self, '_plant_at', _now)\n"
        "                  - getattr(self, '_plant_s', 0.0))\n"
        f"        self._plant_s = {share!r} * _since if 0 < _since < 1.0 else 0.0\n"
        "        while _clock() < _now + self._plant_s:\n"
        "            pass\n"
        "        self._plant_at = _now\n")


def plant(release: str, share: float, dest: Path) -> Path:
    """The release's tree (as `bench run --sglang` finds it, fetching a wheel not yet cached)
    copied to dest with the step's spin planted; dest."""
    try:
        root = Path(resolve(release).root)
    except SourceError as e:
        raise SystemExit(f"review_power: {e}") from None
    if root.is_dir():
        shutil.copytree(root, dest)
    else:  # a wheel read as a zip
        with zipfile.ZipFile(root) as z:
            z.extractall(dest)
    path = dest / CACHE_FILE
    text = path.read_text()
    start = text.index(HOOK)
    body = text.index('"""', text.index('"""', start) + 3) + 4  # past the docstring's line
    path.write_text(text[:body] + planted_source(share) + text[body:])
    return dest


def review(kind: str, head: str, args, index: int) -> dict:
    out = args.out / f"{kind}_{index:02d}"
    cmd = [sys.executable, "-m", "bench", "review", "--sglang",
           f"base={args.release},head={head}", "--scenarios", args.scenarios, "--out", str(out),
           *shlex.split(args.review_args)]
    with holding(args.lock):
        t0 = time.monotonic()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        seconds = round(time.monotonic() - t0, 1)
    (args.out / f"{kind}_{index:02d}.log").write_text(done.stdout + done.stderr)
    path = out / "decision.json"
    found = json.loads(path.read_text()) if path.exists() else {}
    row = {"kind": kind, "index": index, "exit": done.returncode, "seconds": seconds,
           "verdict": found.get("verdict", f"no decision.json (exit {done.returncode})"),
           "pairs": found.get("pairs"), "cpu_lost_p50": (found.get("disturbance") or {})
           .get("cpu_lost_p50"), "metrics": found.get("metrics", [])}
    print(f"{kind} {index}: {row['verdict']} (exit {row['exit']}) in {seconds:.0f} s, "
          f"{row['pairs']} pairs", flush=True)
    return row


def interleaved(aa: int, plants: int, release: str, tree: str) -> list[tuple[str, str]]:
    """(kind, head) of each review in the order run: an A/A, then a plant, round by round."""
    return [k for i in range(max(aa, plants))
            for k in (((("aa", release),) if i < aa else ())
                      + ((("plant", tree),) if i < plants else ()))]


def table(rows: list[dict]) -> list[str]:
    out = ["| review | verdict | pairs | seconds | cpu lost p50 | step (wait_complete, timeout) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{m['verdict']} {m['ratio']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"
                          for m in r["metrics"] if m["metric"] == "step_mean"
                          and m.get("low") is not None)
        lost = "" if r["cpu_lost_p50"] is None else f"{r['cpu_lost_p50']:.1%}"
        out.append(f"| {r['kind']} {r['index']} | {r['verdict']} | {r['pairs']} | "
                   f"{r['seconds']:.0f} | {lost} | {steps or 'none'} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=5)
    ap.add_argument("--plants", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.05)
    ap.add_argument("--release", default="0.5.23")
    ap.add_argument("--scenarios", default="walk-skew")
    ap.add_argument("--review-args", default="")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--resume", type=Path)
    ap.add_argument("--lock", type=Path, default=Path("/tmp/hicache-cpu.lock"))
    args = ap.parse_args(argv)
    if not 0 < args.share < 1:
        ap.error(f"--share must lie in (0, 1), got {args.share}")
    args.out = (args.resume or args.out
                or REPO / "results" / f"review_power_{time.strftime('%Y%m%dT%H%M%SZ')}")
    args.out.mkdir(parents=True, exist_ok=True)
    state = args.out / "review_power.json"
    rows = json.loads(state.read_text())["rows"] if state.exists() else []
    tree = args.out / "planted"
    if args.plants and not tree.exists():
        plant(args.release, args.share, tree)
    for kind, head in interleaved(args.aa, args.plants, args.release, str(tree)):
        done = [r for r in rows if r["kind"] == kind]
        if len(done) >= (args.aa if kind == "aa" else args.plants):
            continue
        rows.append(review(kind, head, args, len(done)))
        write_json_atomic(state, {"release": args.release, "share": args.share,
                                  "scenarios": args.scenarios,
                                  "review_args": args.review_args, "rows": rows})
    lines = table(rows)
    write_text_atomic(args.out / "review_power.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
