"""Usage: python scripts/gate_history.py [--commits 10] [--branch main]
                                       [--baseline results/baseline] [--machine NAME]
                                       [--out DIR | --resume DIR [--again-inconclusive]]
                                       [--lock FILE]

Runs the gate over the last --commits first-parent commits of --branch, oldest first, and
keeps each result in a history (bench history): each commit is side B and the baseline
revision (--baseline's gate.json, `ab.revision`) side A, served the way `bench gate --ab`
serves them (gate.json's `ab` settings), judged by this tree's gate. Per commit: its own
`bench run --preset ci --host-work calls` (the exact checks read it) in a scratch clone
checked out at the commit, then this tree's `bench gate RUN --baseline B --ab` with the
commit, not this working tree, as side B; then `bench history add` (--commit names the
commit: decision.json's own `commit` is the tree that judged). The page is drawn at the end
into DIR/page.

A commit the gate refuses (exit 2: a plan unlike the baseline's, a tree older than the side
interface) is recorded and skipped. `--resume DIR` goes on with an earlier sitting (its
commits, clone and history kept), regating any commit whose gate did not finish; with
`--again-inconclusive` also each commit whose gate ended INCONCLUSIVE (its first record kept
under `earlier`, its first A/B folder as ab.N, its first result in the history).
`--lock FILE` (default /tmp/hicache-cpu.lock) is taken exclusively around each gate, as
scripts/gate_power.py does. A gate takes 2 to 8 minutes on 2 cores: run it on a quiet
machine. Writes DIR/gate_history.json (every gate: exit, seconds, lock wait, load) and
DIR/history (the history).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate_power import holding  # noqa: E402  (the machine's CPU lock, one owner)

from bench.rundir.files import write_json_atomic  # noqa: E402
from bench.rundir.rundir import RunDir  # noqa: E402

SEAM = "Revision(WORKTREE, None)"  # how bench.gate.ab names side B (this working tree)


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"gate_history: {' '.join(cmd[:4])} failed: {done.stderr.strip()[-500:]}")
    return done


def first_parents(repo: Path, branch: str, n: int) -> list[str]:
    """The branch's newest n first-parent commits, oldest first."""
    out = sh(["git", "rev-list", "--first-parent", f"--max-count={n}", branch, "--"], repo)
    return out.stdout.split()[::-1]


def todo(state: dict) -> list[str]:
    """The commits still to gate: those with no finished gate (an exit code) recorded."""
    return [c for c in state["commits"] if state["gates"].get(c, {}).get("exit") is None]


def ci_run(clone: Path, commit: str, out: Path) -> Path:
    """The commit's own ci run (made once), checked out in the scratch clone."""
    run = out / "runs" / commit[:12]
    if not RunDir(run).has("summary"):
        sh(["git", "checkout", "-q", "--detach", commit], clone)
        base = [sys.executable, "-m", "bench", "run", "--preset", "ci", "--out", str(run)]
        if sh(base + ["--host-work", "calls"], clone, check=False).returncode != 0:
            sh(base, clone, check=False)  # a commit before --host-work: the ceilings NOT JUDGED
    return run


def gate(commit: str, run: Path, baseline: Path) -> int:
    """This tree's `bench gate RUN --ab` with `commit` as side B, in a child process (the
    seam patched there only); its exit code."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--gate-one", commit, str(run),
           str(baseline)]
    return subprocess.run(cmd, cwd=REPO).returncode


def gate_one(commit: str, run: str, baseline: str) -> int:
    """In the child: serve `commit` instead of this working tree as side B, then gate."""
    import inspect

    import bench.gate.ab as gate_ab
    from bench.ab.revisions import WORKTREE, Revision, resolve
    from bench.commands.gate import main as gate_main

    if SEAM not in inspect.getsource(gate_ab):
        sys.exit(f"gate_history: bench.gate.ab no longer names side B as {SEAM}: update SEAM")
    b = resolve(commit, REPO)
    gate_ab.Revision = lambda name, sha: b if name == WORKTREE else Revision(name, sha)
    return gate_main([run, "--baseline", baseline, "--ab"])


def keep(history: Path, run: Path, commit: str, machine: str | None) -> str:
    """`bench history add` of the gate's decision.json, keyed by `commit`."""
    decision = run / "ab" / "decision.json"
    if not decision.exists():
        return "no decision.json (the gate stopped before judging)"
    cmd = [sys.executable, "-m", "bench", "history", "add", str(history), str(decision),
           "--commit", commit] + (["--machine", machine] if machine else [])
    done = sh(cmd, REPO, check=False)
    return (done.stdout or done.stderr).strip()


def setup(args: argparse.Namespace) -> tuple[Path, dict]:
    """The sitting's folder and state: a new one (--out) or --resume's."""
    if args.resume is not None:
        out = args.resume.resolve()
        return out, json.loads((out / "gate_history.json").read_text())
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or REPO / "results" / f"gate_history_{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    commits = first_parents(REPO, args.branch, args.commits)
    if len(commits) < args.commits:
        sys.exit(f"gate_history: {args.branch} has {len(commits)} first-parent commits")
    sh(["git", "clone", "-q", "--no-checkout", str(REPO), str(out / "repo")], out)
    state = {"branch": args.branch, "commits": commits, "baseline": str(args.baseline.resolve()),
             "machine": args.machine, "gates": {}}
    write_json_atomic(out / "gate_history.json", state)
    return out, state


def set_aside(run: Path) -> None:
    """An earlier gate's A/B folder in `run` moved to ab.N (kept): the gate writes a new one."""
    ab = run / "ab"
    if ab.exists():
        n = 1 + sum(1 for _ in run.glob("ab.*"))
        ab.rename(run / f"ab.{n}")


def again_inconclusive(state: dict) -> list[str]:
    """Mark each commit whose gate ended INCONCLUSIVE (exit 77) to be gated again, its record
    moved under `earlier`; the commits marked."""
    marked = [c for c, g in state["gates"].items() if g.get("exit") == 77]
    for commit in marked:
        state.setdefault("earlier", {}).setdefault(commit, []).append(state["gates"].pop(commit))
    return marked


def run_all(out: Path, state: dict, lock: Path, gate_fn=gate, run_fn=ci_run) -> None:
    """Gate every commit still to do, saving the state after each (resumable)."""
    history, baseline = out / "history", Path(state["baseline"])
    left = todo(state)
    print(f"gate_history: {out}: {len(state['commits']) - len(left)} commits gated, "
          f"{len(left)} to go", flush=True)
    for commit in left:
        run = run_fn(out / "repo", commit, out)
        set_aside(run)
        t_wait = time.monotonic()
        with holding(lock):
            waited, load, t0 = time.monotonic() - t_wait, os.getloadavg()[0], time.monotonic()
            code = gate_fn(commit, run, baseline)
        kept = keep(history, run, commit, state.get("machine")) if code in (0, 1, 77) \
            else "refused by the gate (exit 2): not kept"
        state["gates"][commit] = {"exit": code, "seconds": round(time.monotonic() - t0, 1),
                                  "lock_wait_s": round(waited, 1), "load_1m_before": load,
                                  "run": str(run), "kept": kept}
        write_json_atomic(out / "gate_history.json", state)
        print(f"gate_history: {commit[:10]}: exit {code} in "
              f"{state['gates'][commit]['seconds']:.0f}s (waited {waited:.0f}s): {kept}",
              flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].splitlines()[0])
    p.add_argument("--commits", type=int, default=10)
    p.add_argument("--branch", default="main")
    p.add_argument("--baseline", type=Path, default=REPO / "results" / "baseline")
    p.add_argument("--machine")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path)
    where.add_argument("--resume", type=Path)
    p.add_argument("--again-inconclusive", action="store_true")
    p.add_argument("--lock", type=Path, default=Path("/tmp/hicache-cpu.lock"))
    args = p.parse_args(argv)
    if args.commits < 1:
        sys.exit("gate_history: --commits must be >= 1")
    if not (args.baseline / "gate.json").is_file():
        sys.exit(f"gate_history: --baseline {args.baseline} holds no gate.json")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"gate_history: --out {args.out} is not an empty folder: pick a new one")
    if args.resume is not None and not (args.resume / "gate_history.json").is_file():
        sys.exit(f"gate_history: --resume {args.resume} holds no gate_history.json")
    if args.again_inconclusive and args.resume is None:
        sys.exit("gate_history: --again-inconclusive goes with --resume DIR")
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--gate-one"]:
        return gate_one(*argv[1:4])
    args = parse_args(argv)
    out, state = setup(args)
    if args.again_inconclusive:
        print(f"gate_history: gating again {len(again_inconclusive(state))} INCONCLUSIVE",
              flush=True)
    run_all(out, state, args.lock)
    if (out / "history" / "history.json").exists():
        done = sh([sys.executable, "-m", "bench", "history", str(out / "history"), "--out",
                   str(out / "page"), "--branch", state["branch"]], REPO, check=False)
        print((done.stdout + done.stderr).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
