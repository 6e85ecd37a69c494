"""`bench run --cache sglang` (sglang_adapter.decisions.cache, docs/sglang.md): SGLang 0.5.23's own
check_hicache_events and check_prefetch_progress behind the harness's seam, served the
harness's workload, against `--cache project` with the protocol that models the release,
one seed, pinned: per request the same polls and decision, completion, hit-query and ack
collectives; SGLang's collectives named by file:function:line; the run's self-checks hold.

The wheel comes from the release cache (make sglang-fetch; CI caches it); absent, the
end-to-end test is skipped, never passed. Bad input and refusals: tests/test_sglang_refusals.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hicache.spec.cost_model import Setting, expected_per_request, per_step
from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent
# A small pinned serve with every policy; slow reads (60 ms a batch) and a short timeout
# budget, so timeout polls reach SGLang's decision MAX and some prefetches end at a poll
# (timed out), others at their final ack.
RUN = ["--preset", "ci", "--requests", "6", "--bystanders", "2",
       "--output-tokens", "4", "--repeats", "1", "--seed", "3", "--schedule", "pinned",
       "--timeout-base", "0.004", "--storage-latency-ms", "60"]
PER_REQUEST = ["polls", "decision_collectives", "completion_collectives",
               "hit_query_collectives", "ack_collectives", "pp_hops", "terminated_by",
               "prefetched_tokens", "hit_tokens"]
DECISION_SITE = ("all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:"
                 "359 < _all_reduce:386 < _can_terminate_prefetch:2311 < "
                 "check_prefetch_progress:2405")


def _bench_run(out: Path, *argv: str, timeout: float = 500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "run", *argv, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "BENCH_NO_PLOTS": "1"})


# The releases and the project protocol that models each (docs/releases.md); the decision
# site SGLang's timeout poll reaches in each. 0.5.19 and 0.5.18 run in make sglang-check.
RELEASES = [
    pytest.param(("0.5.23", "sglang-0.5.23", "unified", (2, 1), DECISION_SITE), id="0.5.23"),
    pytest.param(("0.5.19", "pr36425", "unified", (2, 1),
                  "all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:"
                  "289 < _all_reduce:325 < _can_terminate_prefetch:1857 < "
                  "check_prefetch_progress:1870"), marks=pytest.mark.sglang_matrix, id="0.5.19"),
    pytest.param(("0.5.18", "pre27010", "hiradix", (2, 1),
                  "all_reduce@tp_cpu mem_cache/hiradix_cache.py:_all_reduce_attn_groups:222 < "
                  "can_terminate_prefetch:1617 < check_prefetch_progress:1643"),
                 marks=pytest.mark.sglang_matrix, id="0.5.18"),
    pytest.param(("0.5.23", "sglang-0.5.23", "unified", (1, 2),
                  "isend@pp_cpu mem_cache/unified_radix_cache.py:_pp_sync:404 < _all_reduce:387 "
                  "< _can_terminate_prefetch:2311 < check_prefetch_progress:2405"),
                 marks=pytest.mark.sglang_matrix, id="0.5.23-tp1pp2"),
    pytest.param(("0.5.23", "sglang-0.5.23", "unified", (2, 2), DECISION_SITE),
                 marks=pytest.mark.sglang_matrix, id="0.5.23-tp2pp2"),
    # PP > 1 takes the controller path above (auto); SGLang's decisions there too
    pytest.param(("0.5.23", "sglang-0.5.23", "unified", (2, 2), DECISION_SITE, "decisions"),
                 marks=pytest.mark.sglang_matrix, id="0.5.23-tp2pp2-decisions"),
    # SGLang's decisions on the project's data path where the controller path also fits
    pytest.param(("0.5.23", "sglang-0.5.23", "unified", (2, 1), DECISION_SITE, "decisions"),
                 marks=pytest.mark.sglang_matrix, id="0.5.23-decisions"),
]


@pytest.fixture(scope="module", params=RELEASES)
def both_runs(request, tmp_path_factory):
    """One seed served by SGLang's code of a release and by the project's model of it."""
    release, protocol, family, (tp, pp), site, *rest = request.param
    path = rest[0] if rest else "auto"
    wheels = [sglang_wheel(release)]
    root = tmp_path_factory.mktemp(f"sglang_run_{release}")
    out = {"name": f"sglang-{release}@{family}", "site": site, "protocol": protocol,
           "layout": (tp, pp)}
    layout = ["--tp", str(tp), "--pp", str(pp)]
    # SGLang's side serves the seed twice (repeat 1 replays repeat 0: --repeat-seeds same).
    twice = ["--repeats", "2", "--repeat-seeds", "same"]
    runs = [("sglang", ["--cache", "sglang", "--sglang", str(wheels[-1]), *twice,
                        "--sglang-path", path]),
            ("project", ["--protocols", protocol])]
    for name, extra in runs:
        done = _bench_run(root / name, *RUN, *layout, *extra)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out[name] = root / name
    # SGLang's controller path is the data path where the run fits it (--sglang-path auto:
    # 0.5.19 on, its page-hash extension builds here), else SGLang's decisions on the
    # project's data path; the run's plan says which ran.
    plan = json.loads((root / "sglang" / "env.json").read_text())["plan"]
    out["controller"] = bool(plan["sglang"]["controller"])
    return out


def _requests(run: Path, repeat: int = 0) -> pd.DataFrame:
    df = pd.read_csv(run / "requests.csv")
    return df[df["repeat"] == repeat].set_index(["policy", "rid"]).sort_index()


@pytest.mark.slow  # two 2-rank serves, one importing SGLang on each rank: about 2 minutes
def test_sglang_and_project_agree_per_request(both_runs):
    sgl, proj = _requests(both_runs["sglang"]), _requests(both_runs["project"])
    assert set(sgl["protocol"]) == {both_runs["name"]}
    assert sgl.index.equals(proj.index)
    differ = (sgl[PER_REQUEST] != proj[PER_REQUEST]) & \
        ~(sgl[PER_REQUEST].isna() & proj[PER_REQUEST].isna())
    assert not differ.any().any(), sgl[PER_REQUEST][differ.any(axis=1)].join(
        proj[PER_REQUEST][differ.any(axis=1)], rsuffix="_project").to_string()
    # The run exercised SGLang's decision: timeout polls that reached its MAX.
    timeout = sgl.loc["timeout"]
    voted = timeout["decision_collectives"] + timeout["pp_hops"]  # TP MAX and/or PP hop
    assert voted.sum() > 0
    assert (sgl.loc["best_effort", "decision_collectives"] == 0).all()
    if not both_runs["name"].startswith("sglang-0.5.18"):  # PR #36425: no vote to wait
        assert (sgl.loc["wait_complete", "decision_collectives"] == 0).all()
    assert set(timeout["terminated_by"]) >= {"poll"}
    named = timeout[voted > 0]["call_sites"]
    assert named.str.contains(both_runs["site"], regex=False).all(), named.tolist()


@pytest.mark.slow  # the same serves (module fixture)
def test_a_second_serve_of_the_seed_gives_the_same_counts(both_runs):
    first, second = (_requests(both_runs["sglang"], r) for r in (0, 1))
    columns = [*PER_REQUEST, "call_sites"]
    assert len(first) and first[columns].fillna("").equals(second[columns].fillna(""))
    steps = pd.read_csv(both_runs["sglang"] / "steps.csv")
    digests = steps.groupby(["policy", "repeat"])["schedule_digest"].last().unstack()
    assert (digests[0] == digests[1]).all()  # one schedule per seed, SGLang deciding


@pytest.mark.slow  # the same two serves (module fixture)
def test_sglang_run_self_checks_hold(both_runs):
    run = both_runs["sglang"]
    ranks = pd.read_csv(run / "ranks.csv")
    assert ranks["crosscheck_ok"].all()  # SGLang's collectives counted == torch's seq numbers
    requests = pd.read_csv(run / "requests.csv")
    assert requests["ranks_agree"].all() and requests["data_ok"].all()
    assert (run / "verdict.json").exists()
    # Per step SGLang's own reductions beside the harness's step agreement (docs/sglang.md):
    # what the release's model has per step, once more (rank 0; the polls' hops cancel).
    steps = pd.read_csv(run / "steps.csv")
    steps = steps[steps["repeat"] == 0].set_index(["policy", "step"])
    project = pd.read_csv(both_runs["project"] / "steps.csv").set_index(["policy", "step"])
    if both_runs["controller"]:
        # SGLang frees a cut read's host slots in its release drain, at a step: the serve
        # steps on, idle, until they are back (the project frees them after its last step)
        after = steps.loc[steps.index.difference(project.index)]
        assert (after[["polled", "scheduled", "waiting", "running"]] == 0).all().all()
        steps = steps.loc[project.index]
    assert steps.index.equals(project.index)
    extra = sum(per_step(both_runs["protocol"], *both_runs["layout"]))
    sites = ["per_step_min", "pp_hop"]
    assert (steps[sites].sum(axis=1) - project[sites].sum(axis=1) == extra).all()


@pytest.mark.slow  # the same two serves (module fixture)
def test_compare_pairs_the_runs_request_by_request(both_runs, tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "compare", str(both_runs["project"]),
                           str(both_runs["sglang"]), "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    n = len(_requests(both_runs["sglang"]))
    assert f"per request: {n} of {n} requests equal in every count" in done.stdout, \
        done.stdout[-3000:] + done.stderr[-2000:]
    # The one count that differs, per step: SGLang's own MIN beside the harness's agreement
    # (compare's step counts hold no PP hop: at TP1 x PP2 they are equal).
    tp = both_runs["layout"][0]
    assert done.returncode == int(tp > 1), done.stdout[-3000:]
    assert (tp == 1) or "step_collectives_per_step" in done.stdout
    assert "## Per request" in (tmp_path / "compare.md").read_text()


@pytest.mark.slow  # one 2-rank serve importing a source tree on each rank: about 30 s
@pytest.mark.sglang_matrix  # make sglang-check: CI keeps the release's serves (CI time)
def test_a_planted_all_reduce_shows_in_bench_run_at_its_line(tmp_path):
    from tests.test_sglang_adapter import _planted_tree

    wheels = [sglang_wheel("0.5.23")]
    line = _planted_tree(wheels[-1], tmp_path / "tree")
    done = _bench_run(tmp_path / "run", *RUN, "--tp", "2", "--policies", "wait_complete",
                      "--cache",
                      "sglang", "--sglang", str(tmp_path / "tree"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "run" / "requests.csv")
    assert set(rows["protocol"]) == {"sglang-tree:tree@unified"}
    polled = rows[rows["polls"] > 0]
    assert len(polled) and (polled["decision_collectives"] == polled["polls"]).all()
    planted = f"x all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_can_terminate_prefetch:" \
        f"{line} < check_prefetch_progress:"
    for polls, sites in zip(polled["polls"], polled["call_sites"], strict=True):
        assert f"{polls}{planted}" in sites, sites
    assert pd.read_csv(tmp_path / "run" / "ranks.csv")["crosscheck_ok"].all()


@pytest.mark.slow  # one 2-rank serve that fails at its collective timeout: about 25 s
@pytest.mark.sglang_matrix  # make sglang-check (CI time); sglang-poll's cells run in CI
def test_budget_skew_deadlocks_sglangs_decision_and_names_its_line(tmp_path):
    """#30760 on SGLang's own poll through bench run: rank 1's walk stops early, rank 0's
    timeout poll enters SGLang's decision MAX alone; the run fails naming SGLang's line."""
    sglang_wheel("0.5.23")
    done = _bench_run(tmp_path / "run", *RUN, "--tp", "2", "--policies", "timeout",
                      "--budget-skew", "0.9", "--collective-timeout", "5", "--cache",
                      "sglang", "--sglang", "0.5.23")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "FAILED: rank 0 failed: CollectiveError: SGLang's collective all_reduce at " \
        f"{DECISION_SITE.split(' ', 1)[1]}, call site 'decision' on group 'tp_cpu'" \
        in done.stdout, done.stdout


@pytest.mark.slow  # one 2-rank hazard cell importing SGLang on each rank: about 20 s
@pytest.mark.sglang_matrix  # make sglang-check (CI time); sglang-poll's cells run in CI
def test_hazards_on_sglangs_decisions_find_38273_where_the_model_does(tmp_path):
    """bench hazards --cache sglang: ongoing-skew (#38273) deadlocks on SGLang's decision
    MAX (rank 0's ongoing_prefetch holds a request rank 1's does not), as the model's cell."""
    sglang_wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--scenarios", "ongoing-skew", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = pd.read_csv(tmp_path / "hazards.csv").iloc[0]
    assert (row["protocol"], row["outcome"]) == ("sglang-0.5.23@unified", "deadlock"), \
        str(row.to_dict())
    # The step, the request (gloo may pair rank 0's decision for r00 with rank 1's for r01
    # silently first) and which rank's timeout the classifier names vary with the free
    # schedule; rank 0 always ends waiting alone in SGLang's decision MAX.
    rank0 = json.loads((Path(row["cell_dir"]) / "rank0.json").read_text())
    assert "SGLang's collective all_reduce at mem_cache/unified_radix_cache.py:" \
        "_all_reduce_attn_groups:359 < _all_reduce:386 < _can_terminate_prefetch:2311" \
        in rank0["error"], rank0["error"]


# --sglang-path controller (auto where it fits): SGLang's own controller path as the data
# path (sglang_adapter.controller.cache): its hit query and acks on the groups it makes,
# named at its lines (0.5.23's).
HIT_SITE = ("all_reduce@sglang_hit managers/cache_controller.py:_all_reduce:447 < "
            "_sync_prefetch_hit_query:1502 < prefetch_thread_func:1356")
ACK_SITE = ("all_reduce@sglang_ack managers/cache_controller.py:_all_reduce:447 < "
            "_reduce_prefetch_ack:1482 < _reduce_prefetch_ack:1922 < "
            "prefetch_sync_thread_func:1947")


def _controller(both_runs):
    if not both_runs["controller"]:
        pytest.skip("SGLang's decisions on the project's data path ran here (--sglang-path "
                    "decisions, or the run or this machine does not fit the controller path)")
    return both_runs["sglang"]


@pytest.mark.slow  # the same serves (module fixture)
def test_controller_run_self_checks_hold_with_sglangs_own_groups(both_runs):
    run = _controller(both_runs)
    ranks = pd.read_csv(run / "ranks.csv")
    # the counter, SGLang's hit and ack groups included, equals torch's sequence numbers
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    assert (ranks["hit_query"] > 0).all() and (ranks["ack"] > 0).all()
    # SGLang's teardown (`detach_storage_backend`) destroys the groups each serve's attach
    # made: every rank's process holds as many threads before its second repeat as before
    # its first (left standing, each serve's four groups added twelve gloo threads)
    assert (ranks.groupby("rank")["threads"].nunique() == 1).all(), ranks["threads"].tolist()
    requests = pd.read_csv(run / "requests.csv")
    assert requests["ranks_agree"].all() and requests["data_ok"].all()
    assert json.loads((run / "verdict.json").read_text())["ok"]


@pytest.mark.slow  # the same serves (module fixture)
def test_controller_run_costs_what_the_model_says_given_its_polls(both_runs):
    """Every request's decision, completion, hit-query and ack collectives, SGLang's own
    (its threads and drains deciding how each prefetch went), against the project's model
    of 0.5.23 priced on what SGLang did with it."""
    sgl = _requests(_controller(both_runs))
    assert set(sgl["protocol"]) == {both_runs["name"]}
    tp, pp = both_runs["layout"]
    for (policy, rid), r in sgl.iterrows():
        hit_pages = r["hit_tokens"] // r["page_size"] if r["io_issued"] else 0
        want = expected_per_request(Setting(both_runs["protocol"], policy, tp, pp), r["polls"],
                                    hit_pages, r["op_issued"], r["io_issued"],
                                    r["terminated_by"] == "poll")
        got = (r["decision_collectives"], r["completion_collectives"], r["pp_hops"],
               r["hit_query_collectives"], r["ack_collectives"])
        assert got == (want.decision, want.completion, want.pp_hops, want.hit_query,
                       want.ack), (policy, rid, r["terminated_by"], r["polls"])
    acked = sgl[sgl["ack_collectives"] > 0]
    # one MIN per group SGLang copied: the stage's TP ranks, at PP > 1 the PP column's too
    groups = ["_pp"] * (pp > 1) + [""] * (tp > 1)
    issued = sgl[sgl["op_issued"]]
    assert len(acked) and (issued["hit_query_collectives"] == len(groups)).all()
    if both_runs["name"].startswith("sglang-0.5.23@"):
        for suffix in groups:
            assert issued["call_sites"].str.contains(
                HIT_SITE.replace("sglang_hit ", f"sglang_hit{suffix} "), regex=False).all()
            assert acked["call_sites"].str.contains(
                ACK_SITE.replace("sglang_ack ", f"sglang_ack{suffix} "), regex=False).all()
    assert set(sgl.loc["timeout", "terminated_by"]) >= {"poll"}  # its decision MAX, too
    assert sgl.loc["timeout", "call_sites"].str.contains(both_runs["site"], regex=False).any()
