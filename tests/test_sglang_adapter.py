"""SGLang's own poll on real gloo ranks (sglang_adapter, docs/sglang.md): SPEC resolution
and its one-line errors, the loader's refusal of an SGLang it cannot drive, and SGLang's
collectives counted at the torch.distributed door by calling frame, per request, held
against torch's sequence numbers and against the project's model of the same release.

The wheels come from the release cache (sglang_adapter.source.DEFAULT_CACHE: `make
sglang-fetch` fills it, CI caches it); a test whose wheel is absent is skipped, never
passed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from bench.sglang_poll.poll import PollOptions, modelled_protocol, run_polls
from sglang_adapter.decisions.poll import POLICIES, PollCase, poll_rank
from sglang_adapter.source import DEFAULT_CACHE, Source, SourceError, resolve, unpack
from tests.helpers import launch
from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent
WHEELS = DEFAULT_CACHE
PENDING = 3  # polls that find the prefetch pending, per case
DECISION = "mem_cache/unified_radix_cache.py:_can_terminate_prefetch"


def _wheel(version: str) -> Path:
    return sglang_wheel(version)


# ---- SPEC: a release, a wheel, a tree; one line on bad input -------------------------------

def test_a_release_resolves_to_its_cached_wheel():
    wheel = _wheel("0.5.23")
    src = resolve("0.5.23", WHEELS)
    assert src == Source(src.root, "0.5.23", "0.5.23", str(wheel))
    assert resolve(str(wheel)).label == "0.5.23"
    # imported from its Python files, unpacked once beside the wheel (bytecode kept)
    assert Path(src.root).parent == WHEELS / "unpacked" and resolve(str(wheel)).root == src.root
    assert (Path(src.root) / "sglang/srt/mem_cache/hicache_storage.py").is_file()
    assert not list(Path(src.root).rglob("*.so"))  # no extension modules: a zip loads none


def _tiny_wheel(folder: Path, body: str) -> Path:
    wheel = folder / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/srt/mem_cache/x.py", body)
        z.writestr("sglang/srt/mem_cache/cpp_utils/hash_binding.cpp", "// c++")
        z.writestr("sglang/srt/kernel.so", b"\x7fELF")
        z.writestr("sglang-9.9.9.dist-info/METADATA", "Name: sglang")
    return wheel


def test_a_wheel_is_unpacked_once_per_content(tmp_path):
    cache = tmp_path / "cache"
    src = resolve(str(_tiny_wheel(tmp_path, "A = 1\n")), cache)
    root = Path(src.root)
    assert src.version == "9.9.9" and src.wheel == str(tmp_path / "sglang-9.9.9-py3-none-any.whl")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp", "sglang/srt/mem_cache/x.py"]
    assert resolve(src.wheel, cache).root == src.root  # unpacked once
    other = resolve(str(_tiny_wheel(tmp_path, "A = 2\n")), cache)  # same name, new content
    assert other.root != src.root
    assert (Path(other.root) / "sglang/srt/mem_cache/x.py").read_text() == "A = 2\n"
    assert not list((cache / "unpacked").glob("*.part-*"))


def test_a_wheel_is_read_as_a_zip_where_the_cache_cannot_be_written(tmp_path):
    wheel = _tiny_wheel(tmp_path, "A = 1\n")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")  # the cache folder cannot be made under a file
    assert resolve(str(wheel), blocked).root == str(wheel)


def test_a_wheel_that_is_no_zip_is_one_line(tmp_path):
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    wheel.write_text("no zip")
    with pytest.raises(SourceError, match="not a readable wheel") as e:
        resolve(str(wheel), tmp_path / "cache")
    assert "\n" not in str(e.value)


def test_a_source_tree_resolves_from_the_checkout_or_the_package(tmp_path):
    pkg = tmp_path / "mybranch" / "python" / "sglang"
    (pkg / "srt" / "mem_cache").mkdir(parents=True)
    for spec in (tmp_path / "mybranch" / "python", pkg):
        src = resolve(str(spec))
        assert src.root == str(pkg.parent) and src.label == "tree:mybranch"


@pytest.mark.parametrize("spec, words", [
    ("", "--sglang needs"), ("nonsense", "no such release, wheel or source tree"),
    ("/etc", "no sglang package there"), (__file__, "not an sglang wheel")])
def test_bad_specs_say_one_line(spec, words):
    with pytest.raises(SourceError, match=words) as e:
        resolve(spec)
    assert "\n" not in str(e.value)


def test_no_network_is_one_line(tmp_path, monkeypatch):
    # An index nobody listens on: pip fails at once, as it does offline.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(SourceError, match=r"^no network \(or no release 0.5.23 on the index\)"):
        resolve("0.5.23", tmp_path / "cache")


def _undrivable_tree(root: Path) -> Path:
    """An SGLang tree whose decision modules import but whose cache classes lack the poll
    (as a release that renamed it would)."""
    from sglang_adapter.loader import DECISION_PATH
    for name in DECISION_PATH:
        path = root / Path(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("class UnifiedRadixCache:\n    pass\n"
                        if name.endswith("unified_radix_cache") else "")
    return root


UNDRIVABLE = ("cannot drive it, missing unified_radix_cache.UnifiedRadixCache."
              "check_prefetch_progress and hiradix_cache.HiRadixCache."
              "check_prefetch_progress; supported: 0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22, "
              "0.5.23")


def test_an_sglang_it_cannot_drive_is_named_in_one_line(tmp_path):
    tree = _undrivable_tree(tmp_path / "renamed")
    code = ("from sglang_adapter.source import resolve\n"
            "from sglang_adapter.loader import load, LoadError\n"
            f"try:\n    load(resolve({str(tree)!r}))\n"
            "except LoadError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                         capture_output=True, timeout=280).stdout.strip().splitlines()
    assert out == [f"sglang tree:renamed: {UNDRIVABLE}"]


def test_no_decision_module_can_be_a_stub():
    from sglang_adapter.loader import DECISION_PATH, stubbed
    assert not [m for m in DECISION_PATH if stubbed(m)]
    assert stubbed("triton.language") and not stubbed("tritonx")


# ---- SGLang's poll on real ranks, counted at the door ---------------------------------------

def _serve(src: Source, tp: int, pp: int, policies=POLICIES) -> list[dict]:
    cases = [PollCase(p, PENDING) for p in policies]
    return launch(tp * pp, poll_rank, (src, tp, pp, cases), timeout_s=280)


def _per_request(calls) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for site, group, op, rid, via, n in calls:
        out.setdefault(rid, Counter())[(site, group, op, via)] += n
    return out


def _rows(version: str, tp: int, pp: int) -> dict[str, dict]:
    src = resolve(str(_wheel(version)))
    rows, ok = run_polls(PollOptions(src, tp, pp, POLICIES, PENDING, modelled_protocol(src)))
    assert ok, rows
    return {r["policy"]: r for r in rows}


def test_sglang_0523_poll_at_tp2_counts_what_the_model_says():
    """Per request: one MAX per timeout poll, none for best_effort and wait_complete, as
    the project's model of sglang-0.5.23 says (T + P for timeout, 0 otherwise); every rank
    polled alike and the door's counts equal torch's sequence numbers (the row's ok)."""
    rows = _rows("0.5.23", 2, 1)
    assert {p: (r["polls"], r["sglang_per_poll"], r["model_per_poll"])
            for p, r in rows.items()} == {"best_effort": (1, 0, 0),
                                          "wait_complete": (PENDING + 1, 0, 0),
                                          "timeout": (PENDING + 1, 1, 1)}
    assert rows["timeout"]["call_sites"] == (
        f"{PENDING + 1}x all_reduce@tp mem_cache/unified_radix_cache.py:"
        "_all_reduce_attn_groups:359 < _all_reduce:386 < _can_terminate_prefetch:2311 < "
        "check_prefetch_progress:2405")
    assert rows["best_effort"]["call_sites"] == rows["wait_complete"]["call_sites"] == ""
    # check_hicache_events: one packed MIN per step (unified_radix_cache.py 3459), as modelled.
    assert {r["sglang_per_step"] for r in rows.values()} == {1.0}


@pytest.mark.slow
@pytest.mark.sglang_matrix
@pytest.mark.parametrize("version, tp, pp", [
    ("0.5.23", 1, 2), ("0.5.23", 2, 2), ("0.5.19", 2, 1), ("0.5.19", 1, 2), ("0.5.19", 2, 2),
    ("0.5.18", 2, 1), ("0.5.18", 1, 2), ("0.5.18", 2, 2)])
def test_sglang_poll_in_other_layouts_and_releases(version, tp, pp):
    rows = _rows(version, tp, pp)
    # 0.5.18 (pre27010): a MAX over TP on every wait_complete or timeout poll, no PP hop;
    # later: T + P on a timeout poll only.
    hop = (pp > 1) if version != "0.5.18" else 0
    assert rows["timeout"]["sglang_per_poll"] == (tp > 1) + hop
    assert rows["wait_complete"]["sglang_per_poll"] == ((tp > 1) if version == "0.5.18" else 0)
    for r in rows.values():  # rank 0's per-step collectives as the model has them
        assert r["sglang_per_step"] == r["model_per_step"], r
    if rows["timeout"]["sglang_per_poll"]:  # 0.5.18 at TP1 issues none
        assert "can_terminate_prefetch" in rows["timeout"]["call_sites"]


# ---- a planted change in a copy of a source tree --------------------------------------------

PLANT_AFTER = '        if self.prefetch_stop_policy == "wait_complete":\n'
PLANTED = ("            torch.distributed.all_reduce(torch.zeros(1), "
           "group=self.tp_group)  # planted\n")


def _planted_tree(wheel: Path, dest: Path) -> int:
    """The wheel's Python files unpacked to `dest` (as `resolve` unpacks it) with an
    all-reduce planted in `_can_terminate_prefetch`'s wait_complete branch; returns the
    planted line."""
    unpack(wheel, dest)
    path = dest / "sglang" / "srt" / "mem_cache" / "unified_radix_cache.py"
    text = path.read_text()
    start = text.index("def _can_terminate_prefetch")
    at = text.index(PLANT_AFTER, start) + len(PLANT_AFTER)
    path.write_text(text[:at] + PLANTED + text[at:])
    return text[:at].count("\n") + 1


@pytest.mark.slow
@pytest.mark.sglang_matrix
def test_a_planted_all_reduce_shows_per_poll_at_its_line(tmp_path):
    line = _planted_tree(_wheel("0.5.23"), tmp_path / "tree")
    src = resolve(str(tmp_path / "tree"))
    assert src.label == "tree:tree"
    results = _serve(src, 2, 1, policies=("wait_complete",))
    calls = _per_request(results[0]["calls"])["wait_complete-0"]
    assert dict(Counter({(s, g, o): n for (s, g, o, _), n in calls.items()})) == {
        (f"{DECISION}:{line}", "tp", "all_reduce"): PENDING}  # one per pending poll
    for r in results:
        assert all(c == s for c, s in r["crosscheck"].values()), r["crosscheck"]


# ---- the verb: bad input is one line and exit 2, before any rank starts ---------------------

def _verb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "sglang-poll", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=280,
                          env={**os.environ, "HICACHE_BENCH_SGLANG_CACHE": str(WHEELS)})


def test_the_verb_checks_its_options_before_fetching_anything():
    done = _verb("--sglang", "9.9.9", "--tp", "0")  # a release nobody has: never fetched
    assert done.returncode == 2
    assert done.stderr.strip() == "bench sglang-poll: --tp 0 --pp 1: 1..8 ranks in all"
    done = _verb("--sglang", "0.5.23", "--policies", "eager")
    assert done.returncode == 2 and "policy 'eager'" in done.stderr
    assert "\n" not in done.stderr.strip()


def test_bad_options_are_refused_before_torch_is_imported():
    """A refusal costs no torch import (2.5 s of CPU here): the options, the hazard cells
    and the controller's layout are checked first."""
    bad = [["--tp", "0"], ["--policies", "eager"], ["--hazard", "walk-skew", "--tp", "4"],
           ["--hazard", "walk-skew", "--collective-timeout", "0"],
           ["--controller", "--pp", "2"]]
    code = ("import sys\nfrom bench.commands.sglang_poll import main\n"
            f"codes = [main(['--sglang', '9.9.9', *a]) for a in {bad!r}]\n"
            "print(codes, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                          capture_output=True, timeout=60)
    assert done.stdout.split() == ["[2,", "2,", "2,", "2,", "2]", "False"], done
    assert len(done.stderr.strip().splitlines()) == len(bad), done.stderr


def test_the_verb_refuses_an_sglang_it_cannot_drive_in_one_line(tmp_path):
    done = _verb("--sglang", str(_undrivable_tree(tmp_path / "renamed")))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"bench sglang-poll: sglang tree:renamed: {UNDRIVABLE}"]
