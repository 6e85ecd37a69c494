"""`bench run --cache sglang` and `bench hazards --cache sglang` without a serve: bad input is
one line and exit 2, an SGLang or a path it cannot drive is refused before any rank, and which
harness site each of SGLang's collectives plays (pure). The serves themselves are in
tests/test_sglang_run.py.
"""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from tests.sglang_wheels import sglang_wheel


@pytest.mark.parametrize("argv, says", [
    (["--cache", "sglang"], "--cache sglang needs --sglang SPEC"),
    (["--sglang", "0.5.23"], "--sglang needs --cache sglang"),
    (["--cache", "sglang", "--sglang", "nonsense"], "no such release, wheel or source tree"),
    (["--cache", "sglang", "--sglang", "0.5.23", "--protocols", "pr36425"],
     "runs the release's own protocol"),
    (["--sglang-path", "controller"], "--sglang-path needs --cache sglang")])
def test_bad_cache_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    from bench.commands.run import main

    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_an_sglang_it_cannot_drive_is_refused_before_any_rank(tmp_path, capsys):
    from bench.commands.run import main
    from tests.test_sglang_adapter import UNDRIVABLE, _undrivable_tree

    tree = _undrivable_tree(tmp_path / "renamed")
    assert main(["--cache", "sglang", "--sglang", str(tree), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"bench run: sglang tree:renamed: {UNDRIVABLE}"], err
    assert "sglang" not in sys.modules  # checked, then taken out of this process again


@pytest.mark.parametrize("argv, says", [
    (["--sglang", "0.5.23"], "--sglang needs --cache sglang"),
    (["--cache", "sglang"], "--cache sglang needs --sglang SPEC"),
    (["--cache", "sglang", "--sglang", "0.5.23", "--protocols", "pr36425"], "no --protocols")])
def test_hazards_bad_cache_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    from bench.commands.hazards import main

    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


# ---- pure: which harness site each of SGLang's collectives plays; compare per request ------

@pytest.mark.parametrize("op, site, via, expected", [
    ("all_reduce", "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359",
     "_all_reduce:386 < _can_terminate_prefetch:2311 < check_prefetch_progress:2405",
     "decision"),
    ("all_reduce", "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359",
     "_all_reduce:386 < _sync_hicache_ready_counts:3459 < check_hicache_events:3681",
     "per_step_min"),
    ("isend", "mem_cache/unified_radix_cache.py:_pp_sync:404",
     "_all_reduce:387 < _can_terminate_prefetch:2311", "pp_hop"),
    ("all_reduce", "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359",  # ticket
     "_all_reduce:386 < _check_pp_prefetch_progress:2329 < check_prefetch_progress:2397",
     "decision"),
    ("all_reduce", "mem_cache/hiradix_cache.py:_all_reduce_attn_groups:222",
     "can_terminate_prefetch:1617 < check_prefetch_progress:1643", "decision"),
    ("all_reduce", "mem_cache/hiradix_cache.py:_sync_and_clamp_prefetch_result:1590",
     "check_prefetch_progress:1658", "completion"),
    ("barrier", "mem_cache/x.py:f:1", "", "sglang:mem_cache/x.py:f:1"),
])
def test_each_sglang_collective_plays_its_harness_site(op, site, via, expected):
    from sglang_adapter.decisions.cache import site_of
    from sglang_adapter.door import Call

    assert site_of(Call(site, "tp_cpu", op, "r0", via)) == expected


def test_compare_per_request_names_both_sides_call_sites():
    from bench.compare.per_request import as_modelled, differences, section

    def frame(protocol, decisions, sites):
        return as_modelled(pd.DataFrame({
            "protocol": protocol, "policy": "timeout", "repeat": 0, "rid": ["r0", "r1"],
            "polls": [3, 2], "decision_collectives": decisions, "completion_collectives": 0,
            "pp_hops": 0, "hit_query_collectives": 1, "ack_collectives": 1,
            "call_sites": sites}))

    a = frame("sglang-0.5.23", [3, 2], ["3x all_reduce@tp_cpu decision", "2x x"])
    b = frame("sglang-0.5.23@unified", [3, 3], ["3x all_reduce@tp_cpu sglang.py:f:1", "3x y"])
    assert set(b["protocol"]) == {"sglang-0.5.23"}  # rows pair by the release's model
    n, lines = differences(a, b)
    assert n == 2 and lines == ["timeout repeat 0 r1: decision_collectives 2 -> 3; A: 2x x; "
                                "B: 3x y"]
    printed, md = section(a, b)
    assert printed[0].startswith("per request: 1 of 2 requests equal") and md[0] == \
        "## Per request"


def test_the_controller_path_is_refused_where_it_cannot_serve(tmp_path, capsys):
    from bench.commands.run import main

    # a side-car pool before 0.5.23: the release's reason, known once SGLang is resolved
    wheels = [sglang_wheel("0.5.19")]
    argv = ["--cache", "sglang", "--sglang", str(wheels[-1]), "--sglang-path", "controller",
            "--extra-pool", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "serves a side-car pool" in err, err
    assert "0.5.23 on" in err, err


@pytest.mark.parametrize("flags, says", [
    (["--extra-pool", "--host-memory", "buffer_only", "--pp", "2"],
     "serves a side-car pool (--extra-pool) with --host-memory cache only"),
    (["--host-memory", "buffer_only"], "serves buffer_only host memory at --pp > 1 only"),
    (["--write-policy", "write_back", "--host-memory", "buffer_only"],
     "serves buffer_only host memory at --pp > 1 only")])
def test_a_run_the_controller_path_cannot_serve_is_refused_before_sglang_is_read(
        flags, says, tmp_path, capsys):
    """The run's own reasons need no SGLang: refused before SPEC is resolved (a SPEC that
    names nothing would be its own error otherwise), so no import, no extension build."""
    from bench.commands.run import main

    argv = ["--cache", "sglang", "--sglang", str(tmp_path / "no-sglang-here"),
            "--sglang-path", "controller", *flags, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"--sglang-path controller {says}" in err, err
    assert not (tmp_path / "out").exists()
