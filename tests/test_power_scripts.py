"""The power and lean scripts (scripts/gate_power.py, scripts/gate_lean.py) that size the
served A/B gate: the planted regression, interleaved gates and resumes, the spread behind an
interval, the budget rows and the tables that join studies."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ab import sequential

REPO = Path(__file__).resolve().parent.parent


# ---- the power script's plant ----------------------------------------------------------


def test_the_power_scripts_plant_spins_a_share_of_each_step():
    """scripts/gate_power.py plants its regression into the scheduler's step as it is now:
    the anchors are found, the result compiles, and the spin is sized by the share."""
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    text = (REPO / "hicache" / "serve" / "scheduler.py").read_text()
    planted = gate_power.planted(text, 0.05)
    compile(planted, "scheduler.py", "exec")
    assert planted.count("_planted_t0 = time.perf_counter()") == 1
    assert "0.05 * (time.perf_counter() - _planted_t0)" in planted


def test_the_review_power_scripts_plant_sits_first_in_sglangs_step_hook(tmp_path):
    """scripts/review_power.py plants its spin at the start of 0.5.23's
    check_hicache_events, after its docstring; the tree compiles; the reviews interleave."""
    sys.path.insert(0, str(REPO / "scripts"))
    import review_power

    from sglang_adapter.source import DEFAULT_CACHE

    if not sorted(DEFAULT_CACHE.glob("sglang-0.5.23-*.whl")):
        pytest.skip("no sglang 0.5.23 wheel cached (make sglang-fetch)")
    tree = review_power.plant("0.5.23", 0.05, tmp_path / "tree")
    text = (tree / review_power.CACHE_FILE).read_text()
    compile(text, "unified_radix_cache.py", "exec")
    body = text[text.index(review_power.HOOK):].splitlines()
    assert body[1].strip().startswith('"""') and body[2].strip().startswith("_clock = ")
    assert "self._plant_s = 0.05 * _since" in text
    assert review_power.interleaved(2, 3, "R", "T") == [
        ("aa", "R"), ("plant", "T"), ("aa", "R"), ("plant", "T"), ("plant", "T")]


def test_the_power_scripts_gates_interleave_and_a_resume_goes_on_to_the_counts(tmp_path):
    """One gate of each kind a round, in the order asked, until each kind has its count, the
    gates already run counted; --resume of a folder that is no study is refused in one line,
    the folder untouched."""
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    kinds = [("A/A quiet", 3), ("plant 5%", 2), ("plant 10%", 1), ("A/A neighbour", 0)]
    assert gate_power.interleaved(kinds, {}) == [
        "A/A quiet", "plant 5%", "plant 10%", "A/A quiet", "plant 5%", "A/A quiet"]
    assert gate_power.interleaved(kinds, {"A/A quiet": 2, "plant 5%": 5}) == [
        "A/A quiet", "plant 10%"]
    assert gate_power.interleaved(kinds, {"A/A quiet": 3, "plant 5%": 2,
                                          "plant 10%": 1}) == []
    (tmp_path / "x").write_text("kept")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_power.py"),
                           "--resume", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "not a study to go on with" in done.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["x"]
    gate = {"label": "plant 5%", "exit": 1, "repeats": 12, "seconds": 121.4, "load_1m": 2.0,
            "intervals": {"pr27010 step_mean_ms": "1.054 [1.026, 1.083], n=12",
                          "pr27010 itl_p50_ms": "1.1 [1.0, 1.2], n=12"}}
    assert gate_power.gate_rows([gate])[-1] == (
        "| 0 | plant 5% | 1 | 12 | 121 | - | 1.054 [1.026, 1.083] |")
    stage = tmp_path / "g" / "ab" / "stages" / "00"
    for side, lost in (("a", [0.01, 0.02]), ("b", [0.03, 0.5])):
        (stage / side).mkdir(parents=True)
        (stage / side / "ranks.csv").write_text("rank,cpu_lost\n" + "".join(
            f"{i},{x}\n" for i, x in enumerate(lost)))
    assert gate_power.cpu_lost(str(tmp_path / "g")) == "2.5% / 35.9%"

def test_the_spread_behind_an_interval_is_read_back_exactly():
    """sequential.spread inverts the served A/B's t interval over paired log ratios."""
    pytest.importorskip("scipy")
    from scipy import stats

    for sd, n in ((0.043, 12), (0.02, 39)):
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        assert sequential.spread(math.exp(-half), math.exp(half), n) == pytest.approx(sd)


def test_the_chance_left_unresolved_matches_simulated_gates():
    """left_unresolved against 4,000 simulated stops at n pairs (a fixed seed: the same
    draws every run), with no lean and with a lean towards the threshold; more pairs leave
    less undecided, and a check far from its threshold is never left."""
    pytest.importorskip("scipy")
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(60)
    edge = math.log(1.03)
    for n, lean in ((24, 0.0), (24, 0.01), (42, 0.01)):
        x = rng.normal(math.log(1 + lean), 0.043, size=(4000, n))
        half = stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
        simulated = float(np.mean(np.abs(x.mean(axis=1) - edge) < half))
        model = sequential.left_unresolved(0.043, 0.03, n, lean)
        assert model == pytest.approx(simulated, abs=0.015), (n, lean)
    assert (sequential.left_unresolved(0.043, 0.03, 48)
            < sequential.left_unresolved(0.043, 0.03, 24))
    assert sequential.left_unresolved(0.01, 0.10, 24) < 1e-12


def test_the_power_scripts_budget_rows_size_the_budget_from_the_quiet_aas():
    """budget_rows reads only the quiet A/As' intervals; a row per check with its spread and
    lean, and a last row (any check) at least each check's chance; [] with no quiet A/A."""
    pytest.importorskip("scipy")
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    def gate(label, step, ttft):
        return {"label": label, "intervals": {"p step_mean_ms": step,
                                              "p prefetch_ttft_p50_ms": ttft}}
    results = [gate("A/A quiet", "1.010 [0.996, 1.024], n=24", "1.00 [0.97, 1.03], n=24"),
               gate("A/A quiet", "0.998 [0.985, 1.011], n=36", "1.01 [0.98, 1.04], n=36"),
               gate("plant 5%", "1.050 [1.020, 1.080], n=12", "1.05 [1.0, 1.1], n=12")]
    rows = gate_power.budget_rows(results, {"step_mean": 0.03, "prefetch_ttft_p50": 0.05},
                                  budgets=(24, 48))
    assert len(rows) == 2 + 2 + 1
    step = rows[3].split(" | ")
    assert step[0] == "| p step_mean_ms" and step[1] == "3%" and step[3].startswith("+0.40% [")
    cells = [[float(c.strip(" |%")) for c in row.split(" | ")[-2:][0].split(" / ")]
             for row in rows[2:]]
    assert cells[-1][0] >= max(c[0] for c in cells[:-1])
    assert gate_power.budget_rows(results[2:], {}) == []


def test_the_power_scripts_tables_join_studies_and_refuse_differing_thresholds(tmp_path):
    """--tables prints one set of tables over several studies' gates and writes nothing;
    studies whose thresholds differ are refused in one line (exit 2)."""
    gate = {"label": "A/A quiet", "exit": 0, "repeats": 24, "seconds": 250.0, "states": {},
            "intervals": {"p step_mean_ms": "1.004 [0.990, 1.018], n=24"}}
    for name, step in (("one", 0.03), ("two", 0.03), ("odd", 0.05)):
        (tmp_path / name / "baseline").mkdir(parents=True)
        (tmp_path / name / "gate_power.json").write_text(json.dumps({"results": [gate]}))
        (tmp_path / name / "baseline" / "gate.json").write_text(
            json.dumps({"thresholds": {"step_mean": step}}))
    script = [sys.executable, str(REPO / "scripts" / "gate_power.py"), "--tables"]
    done = subprocess.run(script + [str(tmp_path / "one"), str(tmp_path / "two")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| A/A quiet | 2 | 0 | 0 | 2 | 24 | 250 |" in done.stdout
    assert "| p step_mean_ms | 3% |" in done.stdout
    done = subprocess.run(script + [str(tmp_path / "one"), str(tmp_path / "odd")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "thresholds differ" in done.stderr
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["baseline",
                                                                    "gate_power.json"]


def fake_gate(root: Path, ratio: dict[str, float]) -> Path:
    """A gate's folder as `bench gate --ab` leaves it: one stage, each side's steps.csv and
    ranks.csv; B's step is A's times `ratio[protocol]` (alternately 0.1 % over and under);
    A serves first but for the second protocol of odd repeats."""
    stage = {"index": 0, "dirs": {s: str(root / "ab" / "stages" / "00" / s) for s in "ab"}}
    (root / "ab").mkdir(parents=True)
    (root / "ab" / "ab.json").write_text(json.dumps({"stages": [stage]}))
    for k, side in enumerate("ab"):
        out = Path(stage["dirs"][side])
        out.mkdir(parents=True)
        steps, ranks = ["protocol,repeat,t_s,step_ms"], ["protocol,repeat,other_cpu_s,wall_s"]
        for r in range(6):
            for j, protocol in enumerate(ratio):
                ms = 10.0 * (ratio[protocol] * (1 + (-1) ** r / 1000) if side == "b" else 1)
                t = 100 * r + 10 * j + (1 - k if j == 1 and r % 2 else k)  # B first there
                steps += [f"{protocol},{r},{t},{ms}", f"{protocol},{r},{t + 1},{ms}"]
                ranks.append(f"{protocol},{r},{0.01 * (r + k)},2.0")
        (out / "steps.csv").write_text("\n".join(steps) + "\n")
        (out / "ranks.csv").write_text("\n".join(ranks) + "\n")
    return root


def test_the_lean_script_reads_a_studys_pairs_and_refuses_what_is_no_study(tmp_path):
    """scripts/gate_lean.py: each protocol's lean over the quiet A/As' pairs, the serve order
    read from the serves' clocks (where B goes first it follows its own serve, and A's next
    serve follows A's);
    a folder that is no study is refused in one line (exit 2)."""
    pytest.importorskip("scipy")
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_lean

    gate = fake_gate(tmp_path / "g", {"p1": 1.01, "p2": 1.0})
    (tmp_path / "gate_power.json").write_text(json.dumps(
        {"results": [{"label": "A/A quiet", "dir": str(gate)}]}))
    pairs = gate_lean.gates([tmp_path])
    assert len(pairs) == 12 and pairs["b_first"].sum() == 3
    assert pairs.groupby("protocol")["follows"].apply(list).to_dict() == {
        "p1": [0, 0, -1, 0, -1, 0], "p2": [0, 1, 0, 1, 0, 1]}
    rows = gate_lean.report(pairs)
    assert rows[2].startswith("| p1 | 6 | +1.00% [") and rows[3].startswith("| p2 | 6 | -0.00% [")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_lean.py"),
                           str(tmp_path / "g")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


# ---- the designs script ----------------------------------------------------------------


def _designs_pairs(path: Path, sd: float) -> Path:
    """Pairs of two configurations, every metric's log ratio spread by `sd` about 0 (fixed
    seed); a pr27010 pair's serves twice as long as a pr36425 one's."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for config, wall in (("pr27010/wait_complete", 4.0), ("pr36425/wait_complete", 2.0)):
        for r in range(60):
            rows.append({"run": "r/ab", "config": config, "repeat": r,
                         **{m: rng.normal(0, sd) for m in ("step_mean_ms", "itl_p50_ms",
                                                           "prefetch_ttft_p50_ms",
                                                           "bystander_ttft_p50_ms")},
                         "wall_a": wall, "wall_b": wall, "pair_s": 12.0})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_the_designs_script_passes_quiet_aas_fails_plants_and_prices_a_pair(tmp_path):
    """On tight pairs every A/A PASSes at the first look and every 10 % plant FAILs; on wide
    pairs an A/A is left undecided at a small budget; a pair of one configuration costs its
    share of the walls (2 of 6 s of 12 s here)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_designs
    import pandas as pd

    tight = pd.read_csv(_designs_pairs(tmp_path / "tight.csv", 0.005))
    one = {"one": (["pr36425/wait_complete"], 420.0)}
    th = {m: t for m, t in zip(gate_designs.METRICS, (0.03, 0.05, 0.05, 0.10), strict=True)}
    got = gate_designs.simulate(tight, one, 20, [0.10], th, seed=1).set_index("kind")
    assert got.loc["A/A", "PASS"] == 1 and got.loc["A/A", "median pairs"] == 12
    assert got.loc["plant 10%", "FAIL"] == 1
    assert gate_designs.pair_seconds(tight, ["pr36425/wait_complete"]) == pytest.approx(4.0)
    wide = pd.read_csv(_designs_pairs(tmp_path / "wide.csv", 0.2))
    small = {"small": (["pr36425/wait_complete"], 60.0)}
    got = gate_designs.simulate(wide, small, 20, [], th, seed=1).set_index("kind")
    assert got.loc["A/A", "undecided"] > 0.5


def test_the_designs_script_refuses_a_design_without_pairs_in_one_line(tmp_path):
    path = _designs_pairs(tmp_path / "p.csv", 0.01)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_designs.py"),
                           "simulate", str(path), "--design", "x=pr99999:100"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "gate_designs: --design 'x=pr99999:100': no pairs of pr99999/wait_complete (have "
        "pr27010/wait_complete, pr36425/wait_complete)"]
