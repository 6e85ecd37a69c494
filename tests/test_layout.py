"""The house holds (docs/design.md section 1): hicache/ never imports bench/; bench/run/ (the
online half) and bench/analysis/ (the offline half) never import each other; bench/commands/
import engines, never one another (common, trace_flags, run_flags and cost_sweep are the
commands' own shared parts); argparse Namespaces stay in commands/; nothing outside
bench/rundir/ names a run directory's files; the rooms' imports form no circle; hicache/ and
sglang_adapter/ stand in rooms whose imports only point down, and bench/ enters the adapter
by its one door. And the code rules (STYLE.md, "Code"): modules of at most 400 lines,
functions of at most 80 lines and 8 parameters, `print(` in the printer and scripts/ alone,
and no issue number or commit hash of this project in a .py file. Where code has not caught
up with a rule yet, an allow-list names it; the list can only shrink (an entry that no
longer breaks its rule fails until it is taken off). The scans: tests/layout_scan.py."""

from __future__ import annotations

import ast
import re

import pytest

from bench.rundir.rundir import CONSOLE_LOG, FILES, PLOTS, SERVE_RECORD, SWEEP_FILES
from tests import layout_scan as scan

REPO = scan.REPO
SHARED_COMMAND_PARTS = {"bench.commands.common", "bench.commands.trace_flags",
                        "bench.commands.run_flags",
                        "bench.commands.cost_sweep"}  # parts of a verb, not verbs
# Every file name of a run directory (RunDir's), the A/B's console log beside it included.
RUN_FILE_NAMES = ({n for role, n in FILES.items() if role != "consensus_dir"} | set(PLOTS.values())
                  | set(SWEEP_FILES.values()) | {SERVE_RECORD, CONSOLE_LOG})
RUN_FILES = re.compile(r"""(?<!["'])["'](""" + "|".join(map(re.escape, sorted(RUN_FILE_NAMES)))
                       + r""")["']""")

pytestmark = pytest.mark.timeout(30)
MODULES = {**scan.package_modules("hicache"), **scan.package_modules("bench")}


def _edges() -> dict[str, set[str]]:
    return {name: {i for i in scan.imports_of(path) if i in MODULES}
            for name, path in MODULES.items()}


def test_hicache_never_imports_bench():
    bad = [f"{m} imports {d}" for m, deps in _edges().items() if m.startswith("hicache")
           for d in deps if d.startswith("bench")]
    assert not bad, "\n".join(bad)


def test_the_online_and_offline_halves_never_import_each_other():
    bad = [f"{m} imports {d}" for m, deps in _edges().items() for d in deps
           if {scan.bench_room(m), scan.bench_room(d)} == {"bench.run", "bench.analysis"}]
    assert not bad, "\n".join(bad)


def test_commands_import_engines_never_one_another():
    bad = [f"{m} imports {d}" for m, deps in _edges().items() if m.startswith("bench.commands.")
           for d in deps if d.startswith("bench.commands.") and d != m
           and d not in SHARED_COMMAND_PARTS]
    assert not bad, "\n".join(bad)


def test_namespaces_stay_in_commands():
    bad = [f"{p.relative_to(REPO)}:{n}" for m, p in MODULES.items()
           if m.startswith("bench") and not m.startswith("bench.commands")
           for n, line in enumerate(p.read_text().splitlines(), 1) if "Namespace" in line]
    assert not bad, "argparse.Namespace outside bench/commands/:\n" + "\n".join(bad)


def test_only_rundir_names_a_run_directorys_files():
    found = {str(p.relative_to(REPO)): scan.named_files(p.read_text(), RUN_FILES) for m, p
             in MODULES.items() if m.startswith("bench") and not m.startswith("bench.rundir")}
    bad = [f"{f}:{n}: {name}" for f, hits in found.items() for n, name in hits
           if name not in NAMES_RUN_FILES.get(f, ())]
    assert not bad, "open run files through bench.rundir.rundir.RunDir:\n" + "\n".join(bad)
    _assert_still_needed(NAMES_RUN_FILES, {f: {n for _, n in hits} for f, hits in found.items()})


def test_rooms_form_no_circle_and_the_floors_stay_few():
    rooms: dict[str, set[str]] = {}
    for m, deps in _edges().items():
        rooms.setdefault(scan.bench_room(m), set()).update(
            r for d in deps if (r := scan.bench_room(d)) not in (None, scan.bench_room(m)))
    for door in ("bench", "bench.__main__"):  # the package and its entry: above every room
        rooms.pop(door, None)
    circle = scan.find_cycle(rooms)
    assert circle is None, f"an import circle between rooms: {circle}"
    floors: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in floors:
            floors[room] = 1 + max((floor(d) for d in rooms.get(room, ()) if d in rooms),
                                   default=0)
        return floors[room]
    assert max(map(floor, rooms)) <= 7, {r: floor(r) for r in sorted(rooms)}


def test_the_cycle_finder_finds_a_planted_circle():
    assert scan.find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert scan.find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_file_pattern_finds_a_planted_name_and_passes_prose():
    assert RUN_FILES.search('run_dir / "requests.csv"')
    assert RUN_FILES.search("path = d / 'env.json'")
    assert RUN_FILES.search('folder / "serve.json"') and RUN_FILES.search("o / 'sweep.png'")
    assert not RUN_FILES.search('"""summary.csv\'s columns"""')


# ---- the seam (docs/design.md, "The seam"): the harness reaches the cache only through it ----

@pytest.mark.parametrize("module", ["scheduler", "system"])
def test_the_harness_reaches_the_cache_only_through_the_seam(module):
    reaches = scan.cache_reaches(REPO / "hicache" / "serve" / f"{module}.py")
    assert reaches, "the scan found no use of the cache: the test would pass vacuously"
    assert reaches <= scan.seam_members(), f"past the seam: {sorted(reaches - scan.seam_members())}"


def test_the_reach_scan_catches_a_planted_reach(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("def f(self):\n    return self.cache.controller.error\n")
    assert "controller" in scan.cache_reaches(planted) - scan.seam_members()


def test_hicache_implements_every_member_of_the_seam():
    from hicache.cache.cache import HiCache
    from hicache.spec.pinned import Pin
    src = (REPO / "hicache" / "cache" / "cache.py").read_text()
    # pin and extra_polls are instance attributes: __init__ sets them
    assigned = {t.attr for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Assign)
                for tgt in node.targets for t in ast.walk(tgt) if isinstance(t, ast.Attribute)}
    missing = [n for n in scan.seam_members() if "." not in n and not hasattr(HiCache, n)
               and n not in assigned]
    missing += [n for n in scan.seam_members() if n.startswith("pin.")
                and not hasattr(Pin, n.split(".", 1)[1])]
    assert not missing, missing


def test_the_sglang_adapter_is_a_package_of_its_own():
    """hicache/ never imports the adapter (the seam is how it comes in); the adapter never
    imports bench/ (bench selects it)."""
    adapter = scan.package_modules("sglang_adapter")
    assert adapter, "sglang_adapter/ not found: the test would pass vacuously"
    bad = [f"{m} imports {d}" for m, p in scan.package_modules("hicache").items()
           for d in scan.imports_of(p) if d.startswith("sglang_adapter")]
    bad += [f"{m} imports {d}" for m, p in adapter.items() for d in scan.imports_of(p)
            if d.startswith("bench")]
    assert not bad, "\n".join(bad)


def test_bench_reaches_sglang_through_one_door():
    """bench/ and scripts/ import SGLang's adapter from the package alone (its __init__
    lists the public names), never a submodule, never a private name of what it hands out."""
    import sglang_adapter

    files = [p for top in ("bench", "scripts") for p in sorted((REPO / top).rglob("*.py"))]
    users = [p for p in files if "sglang_adapter" in p.read_text()]
    assert len(users) > 10, "the scan found too few users of the adapter: vacuous"
    bad = [v for p in users for v in scan.door_violations(str(p.relative_to(REPO)), p.read_text(),
                                                      set(sglang_adapter.__all__))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", [
    "from sglang_adapter.decisions.poll import make_rig\n",
    "import sglang_adapter.door\n",
    "from sglang_adapter import Rig\n",
    "from sglang_adapter import make_rig\nrig = make_rig()\nrig._admit()\n"])
def test_the_door_check_catches_a_planted_way_round(planted):
    assert scan.door_violations("planted.py", planted, {"make_rig"})


def test_every_name_of_the_door_opens():
    import sglang_adapter

    missing = [n for n in sglang_adapter.__all__ if getattr(sglang_adapter, n, None) is None]
    assert not missing and len(sglang_adapter.__all__) >= 20, missing


# ---- hicache/ by concern: seven rooms on six floors, every import pointing down ----

HICACHE_FLOORS = {"spec": 0, "memory": 1, "comm": 2, "agreement": 3, "model": 3, "cache": 4,
                  "serve": 5}


def _hicache_room(module: str) -> str | None:
    return module.split(".")[1] if module.startswith("hicache.") else None


def test_hicache_is_rooms_with_a_docstring_each():
    rooms = {p.name for p in (REPO / "hicache").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(HICACHE_FLOORS), rooms
    top = sorted(p.name for p in (REPO / "hicache").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"hicache/ holds {len(top)} top-level modules: {top}"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((REPO / "hicache" / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"hicache/{room}/ wants a one-line docstring"


def test_hicache_imports_only_point_down():
    edges = {m: d for m, d in _edges().items() if m.startswith("hicache.")}
    assert len(edges) > 30, "the scan found too few hicache modules: it would pass vacuously"
    bad = scan.downward_violations(edges, HICACHE_FLOORS, _hicache_room)
    assert not bad, "\n".join(bad)


def test_the_floor_check_catches_a_planted_upward_import():
    planted = {"hicache.memory.pools": {"hicache.cache.cache"}}
    assert scan.downward_violations(planted, HICACHE_FLOORS, _hicache_room)


def test_the_contract_imports_no_torch():
    bad = [f"{m} imports {d}" for m, p in scan.package_modules("hicache").items()
           if m.startswith("hicache.spec") for d in scan.imports_of(p)
           if d.split(".")[0] in ("torch", "numpy", "bench", "sglang_adapter")]
    assert not bad, "hicache/spec/ is the torch-free contract:\n" + "\n".join(bad)


def test_no_module_imports_itself_through_others():
    """No import circle between modules of hicache, bench or sglang_adapter, counting the
    imports inside functions too."""
    modules = {**MODULES, **scan.package_modules("sglang_adapter")}
    graph = {m: {d for d in scan.imports_of(p) if d in modules and d != m}
             for m, p in modules.items()}
    assert scan.find_cycle(graph) is None, f"an import circle: {scan.find_cycle(graph)}"


# ---- sglang_adapter/ by concern: the door and the judge, then the decisions, the controller ----

# The door's top-level modules (sources, loading, choosing, the collective count) are the
# ground floor; `serving` (it chooses between the two paths) and the package's __init__ (its
# public names, imported on first use) stand above every room, as bench's entry does.
ADAPTER_FLOORS = {"door": 0, "judge": 0, "decisions": 1, "controller": 2}
ADAPTER_ABOVE = frozenset({"sglang_adapter", "sglang_adapter.serving"})
# What choosing a target reads (the door's no-torch names): none of it imports torch.
ADAPTER_TORCH_FREE = {"sglang_adapter.source", "sglang_adapter.loader", "sglang_adapter.target",
                      "sglang_adapter.side_specs", "sglang_adapter.decisions",
                      "sglang_adapter.decisions.cases", "sglang_adapter.judge",
                      "sglang_adapter.judge.consensus", "sglang_adapter.controller"}


def _adapter_room(module: str) -> str:
    """A subpackage is its own room; the package's top-level modules are the door."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ADAPTER_FLOORS else "door"


def _adapter_violations(edges: dict[str, set[str]]) -> list[str]:
    return scan.downward_violations(edges, ADAPTER_FLOORS, _adapter_room, ADAPTER_ABOVE)


def test_the_adapter_is_rooms_with_a_docstring_each():
    root = REPO / "sglang_adapter"
    rooms = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ADAPTER_FLOORS) - {"door"}, rooms
    top = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"sglang_adapter/ holds {len(top)} top-level modules: {top}"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((root / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"sglang_adapter/{room}/: a one-line docstring"


def test_the_adapters_imports_only_point_down():
    adapter = scan.package_modules("sglang_adapter")
    edges = {m: {d for d in scan.imports_of(p) if d in adapter and d != m}
             for m, p in adapter.items()}
    assert sum(map(len, edges.values())) > 20, "too few adapter imports found: vacuous"
    bad = _adapter_violations(edges)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", [
    {"sglang_adapter.decisions.poll": {"sglang_adapter.controller.rig"}},
    {"sglang_adapter.judge.consensus": {"sglang_adapter.decisions.cache"}},
    {"sglang_adapter.loader": {"sglang_adapter.judge.consensus"}},
    {"sglang_adapter.controller.cache": {"sglang_adapter.serving"}}])
def test_the_adapter_floor_check_catches_a_planted_upward_import(planted):
    assert _adapter_violations(planted)


def test_choosing_a_target_imports_no_torch():
    """The door's no-torch names (choose_for_run, choose_sides, the poll cases, the judge's
    verdict) and the rooms' own __init__ files they pass through import no torch on import."""
    adapter = scan.package_modules("sglang_adapter")
    assert ADAPTER_TORCH_FREE <= set(adapter), sorted(ADAPTER_TORCH_FREE - set(adapter))
    bad = scan.torch_violations({m: scan.top_imports_of(adapter[m]) for m in ADAPTER_TORCH_FREE},
                                adapter, ADAPTER_TORCH_FREE)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", ["torch.distributed", "sglang_adapter.decisions.poll"])
def test_the_torch_check_catches_a_planted_import(planted):
    adapter = scan.package_modules("sglang_adapter")
    assert scan.torch_violations({"sglang_adapter.target": {planted}}, adapter,
                                 ADAPTER_TORCH_FREE)


# ---- the code rules (STYLE.md, "Code"): sizes, parameters, the printer, no project history ----

MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 400, 80, 8
# Allow-lists: what broke a rule when it came in. Each can only shrink.
LONG_MODULES: set[str] = set()
LONG_FUNCTIONS: dict[str, set[str]] = {}
WIDE_FUNCTIONS: dict[str, set[str]] = {}
# The printer: bench/report/printer.py; everything in bench/ writes through it. tests/ print
# from rank processes; scripts/ print their own tables. Listed: the adapter's own command line
# (`python -m sglang_adapter.source`, make's way to fetch releases), which may not import bench.
PRINTERS = {"bench/report/printer.py"}
PRINTING = {"sglang_adapter/source.py"}
# Run files named outside RunDir (none now).
NAMES_RUN_FILES: dict[str, set[str]] = {}


def _code() -> dict[str, str]:
    texts = {str(p.relative_to(REPO)): p.read_text() for p in scan.code_files()}
    assert len(texts) > 200, "the scan found too few files: it would pass vacuously"
    return texts


def _assert_still_needed(allowed: dict[str, set[str]], found: dict[str, set[str]]) -> None:
    stale = [f"{f}: {sorted(names - found.get(f, set()))}" for f, names in allowed.items()
             if names - found.get(f, set())]
    assert not stale, "these keep the rule now: take them off its allow-list\n" + "\n".join(stale)


def test_no_module_is_over_400_lines():
    sizes = {f: len(t.splitlines()) for f, t in _code().items()}
    bad = [f"{f}: {n} lines" for f, n in sizes.items()
           if n > MAX_MODULE_LINES and f not in LONG_MODULES]
    assert not bad, "split these by concern:\n" + "\n".join(bad)
    _assert_still_needed({f: {"long"} for f in LONG_MODULES},
                         {f: {"long"} for f, n in sizes.items() if n > MAX_MODULE_LINES})


@pytest.mark.parametrize("measure, limit, allowed", [
    (scan.long_functions, MAX_FUNCTION_LINES, LONG_FUNCTIONS),
    (scan.wide_functions, MAX_PARAMETERS, WIDE_FUNCTIONS)], ids=["lines", "parameters"])
def test_no_function_is_over_the_limit(measure, limit, allowed):
    """At most 80 lines, at most 8 parameters (`self`/`cls` not counted; a dataclass's
    fields are not a function's parameters: pass one instead)."""
    found = {f: measure(t, limit) for f, t in _code().items()}
    bad = [f"{f}: {name} ({n})" for f, hits in found.items() for name, n in hits
           if name not in allowed.get(f, ())]
    assert not bad, f"over {limit}:\n" + "\n".join(bad)
    _assert_still_needed(allowed, {f: {name for name, _ in hits} for f, hits in found.items()})


def test_only_the_printer_and_scripts_print():
    found = {f: {"print"} for f, t in _code().items() if not f.startswith(("scripts/", "tests/"))
             and f not in PRINTERS and scan.print_calls(t)}
    bad = sorted(set(found) - PRINTING)
    assert not bad, "print through the printer (bench/report/printer.py):\n" + "\n".join(bad)
    _assert_still_needed({f: {"print"} for f in PRINTING}, found)


def test_no_issue_number_or_commit_hash_of_this_project_in_the_code():
    """History is git's and docs/results/'s (SGLang's issues and commits are fine)."""
    texts = _code()
    bad = [f"{f}:{n}: {hit}" for f, t in texts.items() for n, hit in scan.issue_numbers(t)]
    if (REPO / ".git").exists():
        words = {f: scan.hex_words(t) for f, t in texts.items()}
        ours = scan.commits(set().union(*words.values()))
        bad += [f"{f}: {w}" for f, ws in words.items() for w in sorted(ws & ours)]
    assert not bad, "\n".join(bad)


def test_the_rule_scans_catch_planted_breaches():
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    assert scan.long_functions(f"def f():\n{body}", MAX_FUNCTION_LINES) == [("f", 82)]
    assert scan.wide_functions("def f(self, a, b, c, d, e, g, h, *k, **kw): pass", 8) == [("f", 9)]
    assert not scan.wide_functions("class C:\n    def f(self, a, b, c, d, e, g, h, i): pass", 8)
    assert scan.print_calls("def f():\n    print('x')\n") == 1
    assert not scan.print_calls("log = print")
    assert scan.issue_numbers(f"{'Issue'} {50}'s sweep")
    assert not scan.issue_numbers("SGLang issue #34572")
    if (REPO / ".git").exists():
        named = scan.a_commit_word()
        assert scan.commits(scan.hex_words(f"measured at {named}")) == {named}
        assert not scan.commits(scan.hex_words("a tensor of 1234567 rows, 0000000 padding"))
