"""The house holds (docs/design.md section 1): hicache/ never imports bench/; bench/run/ (the
online half) and bench/analysis/ (the offline half) never import each other; bench/commands/
import engines, never one another (common, trace_flags, run_flags and cost_sweep are the
commands' own shared parts); argparse Namespaces stay in commands/; nothing outside
bench/rundir/ names a run directory's files; the rooms' imports form no circle; hicache/ and
sglang_adapter/ stand in rooms whose imports only point down, and bench/ enters the adapter
by its one door."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_COMMAND_PARTS = {"bench.commands.common", "bench.commands.trace_flags",
                        "bench.commands.run_flags",
                        "bench.commands.cost_sweep"}  # parts of a verb, not verbs
RUN_FILES = re.compile(r"""(?<!["'])["'](requests|steps|ranks|summary|failures|divergence)"""
                       r"""\.csv["']|(?<!["'])["'](env|calibration|progress|verdict)\.json["']""")

pytestmark = pytest.mark.timeout(30)


def _modules(top: str) -> dict[str, Path]:
    out = {}
    for path in sorted((REPO / top).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file (lazy imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _room(module: str) -> str | None:
    """hicache is one room; bench's packages one room each; bench's top modules their own."""
    parts = module.split(".")
    if parts[0] == "hicache":
        return "hicache"
    if parts[0] != "bench":
        return None
    return ".".join(parts[:2]) if len(parts) > 1 else "bench"


MODULES = {**_modules("hicache"), **_modules("bench")}


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = {i for i in _imports(path) if i in MODULES}
        edges[name] = deps
    return edges


def test_hicache_never_imports_bench():
    bad = [f"{m} imports {d}" for m, deps in _edges().items() if m.startswith("hicache")
           for d in deps if d.startswith("bench")]
    assert not bad, "\n".join(bad)


def test_the_online_and_offline_halves_never_import_each_other():
    bad = [f"{m} imports {d}" for m, deps in _edges().items() for d in deps
           if {_room(m), _room(d)} == {"bench.run", "bench.analysis"}]
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
    bad = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for m, p in MODULES.items()
           if m.startswith("bench") and not m.startswith("bench.rundir")
           for n, line in enumerate(p.read_text().splitlines(), 1) if RUN_FILES.search(line)]
    assert not bad, "open run files through bench.rundir.rundir.RunDir:\n" + "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` (as a path), None when it has none."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None
    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_rooms_form_no_circle_and_the_floors_stay_few():
    rooms: dict[str, set[str]] = {}
    for m, deps in _edges().items():
        rooms.setdefault(_room(m), set()).update(
            r for d in deps if (r := _room(d)) not in (None, _room(m)))
    for door in ("bench", "bench.__main__"):  # the package and its entry: above every room
        rooms.pop(door, None)
    assert _cycle(rooms) is None, f"an import circle between rooms: {_cycle(rooms)}"
    floors: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in floors:
            floors[room] = 1 + max((floor(d) for d in rooms.get(room, ()) if d in rooms),
                                   default=0)
        return floors[room]
    assert max(map(floor, rooms)) <= 7, {r: floor(r) for r in sorted(rooms)}


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_file_pattern_finds_a_planted_name_and_passes_prose():
    assert RUN_FILES.search('run_dir / "requests.csv"')
    assert RUN_FILES.search("path = d / 'env.json'")
    assert not RUN_FILES.search('"""summary.csv\'s columns"""')


# ---- the seam (docs/design.md, "The seam"): the harness reaches the cache only through it ----

def _seam_members() -> set[str]:
    from hicache.serve.seam import CacheUnderTest, PinnedClock
    names = {n for n in vars(CacheUnderTest) if not n.startswith("_")}
    return names | {f"pin.{n}" for n in vars(PinnedClock) if not n.startswith("_")}


def _cache_reaches(path: Path) -> set[str]:
    """Every `self.cache.X` / `cache.X` (and `...pin.Y`) a module reads or calls."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "cache" or \
                isinstance(owner, ast.Name) and owner.id == "cache":
            out.add(node.attr)
        if isinstance(owner, ast.Attribute) and owner.attr == "pin" and \
                isinstance(owner.value, ast.Attribute) and owner.value.attr == "cache":
            out.add(f"pin.{node.attr}")
    return out


@pytest.mark.parametrize("module", ["scheduler", "system"])
def test_the_harness_reaches_the_cache_only_through_the_seam(module):
    reaches = _cache_reaches(REPO / "hicache" / "serve" / f"{module}.py")
    assert reaches, "the scan found no use of the cache: the test would pass vacuously"
    assert reaches <= _seam_members(), f"past the seam: {sorted(reaches - _seam_members())}"


def test_the_reach_scan_catches_a_planted_reach(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("def f(self):\n    return self.cache.controller.error\n")
    assert "controller" in _cache_reaches(planted) - _seam_members()


def test_hicache_implements_every_member_of_the_seam():
    from hicache.cache.cache import HiCache
    from hicache.spec.pinned import Pin
    src = (REPO / "hicache" / "cache" / "cache.py").read_text()
    # pin and extra_polls are instance attributes: __init__ sets them
    assigned = {t.attr for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Assign)
                for tgt in node.targets for t in ast.walk(tgt) if isinstance(t, ast.Attribute)}
    missing = [n for n in _seam_members() if "." not in n and not hasattr(HiCache, n)
               and n not in assigned]
    missing += [n for n in _seam_members() if n.startswith("pin.")
                and not hasattr(Pin, n.split(".", 1)[1])]
    assert not missing, missing


def test_the_sglang_adapter_is_a_package_of_its_own():
    """hicache/ never imports the adapter (the seam is how it comes in); the adapter never
    imports bench/ (bench selects it)."""
    adapter = _modules("sglang_adapter")
    assert adapter, "sglang_adapter/ not found: the test would pass vacuously"
    bad = [f"{m} imports {d}" for m, p in _modules("hicache").items() for d in _imports(p)
           if d.startswith("sglang_adapter")]
    bad += [f"{m} imports {d}" for m, p in adapter.items() for d in _imports(p)
            if d.startswith("bench")]
    assert not bad, "\n".join(bad)



def _door_violations(path: str, text: str, public: set[str]) -> list[str]:
    """Where `text` reaches into sglang_adapter other than through its door: a submodule
    imported, a name the door does not list, a private attribute of anything but self."""
    tree, bad, through = ast.parse(text), [], False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [f"{path}:{node.lineno} import {a.name}" for a in node.names
                    if a.name.split(".")[0] == "sglang_adapter"]
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "sglang_adapter":
            through = True
            if node.module != "sglang_adapter":
                bad.append(f"{path}:{node.lineno} from {node.module} import ...")
            bad += [f"{path}:{node.lineno} {a.name} is not a name of the door"
                    for a in node.names if a.name not in public]
    if through:
        bad += [f"{path}:{n.lineno} .{n.attr}" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                and not n.attr.startswith("__")
                and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))]
    return bad


def test_bench_reaches_sglang_through_one_door():
    """bench/ and scripts/ import SGLang's adapter from the package alone (its __init__
    lists the public names), never a submodule, never a private name of what it hands out."""
    import sglang_adapter

    files = [p for top in ("bench", "scripts") for p in sorted((REPO / top).rglob("*.py"))]
    users = [p for p in files if "sglang_adapter" in p.read_text()]
    assert len(users) > 10, "the scan found too few users of the adapter: vacuous"
    bad = [v for p in users for v in _door_violations(str(p.relative_to(REPO)), p.read_text(),
                                                      set(sglang_adapter.__all__))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", [
    "from sglang_adapter.decisions.poll import make_rig\n",
    "import sglang_adapter.door\n",
    "from sglang_adapter import Rig\n",
    "from sglang_adapter import make_rig\nrig = make_rig()\nrig._admit()\n"])
def test_the_door_check_catches_a_planted_way_round(planted):
    assert _door_violations("planted.py", planted, {"make_rig"})


def test_every_name_of_the_door_opens():
    import sglang_adapter

    missing = [n for n in sglang_adapter.__all__ if getattr(sglang_adapter, n, None) is None]
    assert not missing and len(sglang_adapter.__all__) >= 20, missing


# ---- hicache/ by concern: seven rooms on six floors, every import pointing down ----

HICACHE_FLOORS = {"spec": 0, "memory": 1, "comm": 2, "agreement": 3, "model": 3, "cache": 4,
                  "serve": 5}


def _hicache_room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hicache"


def test_hicache_is_rooms_with_a_docstring_each():
    rooms = {p.name for p in (REPO / "hicache").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(HICACHE_FLOORS), rooms
    top = sorted(p.name for p in (REPO / "hicache").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"hicache/ holds {len(top)} top-level modules: {top}"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((REPO / "hicache" / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"hicache/{room}/ wants a one-line docstring"


def _hicache_downward_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in edges.items():
        for d in deps:
            rm, rd = _hicache_room(m), _hicache_room(d)
            if d.startswith("hicache.") and rm != rd and rd in HICACHE_FLOORS and \
                    HICACHE_FLOORS[rd] >= HICACHE_FLOORS.get(rm, 99):
                bad.append(f"{m} ({rm}) imports {d} ({rd}): not a floor below")
    return bad


def test_hicache_imports_only_point_down():
    edges = {m: d for m, d in _edges().items() if m.startswith("hicache.")}
    assert len(edges) > 30, "the scan found too few hicache modules: it would pass vacuously"
    bad = _hicache_downward_violations(edges)
    assert not bad, "\n".join(bad)


def test_the_floor_check_catches_a_planted_upward_import():
    planted = {"hicache.memory.pools": {"hicache.cache.cache"}}
    assert _hicache_downward_violations(planted)


def test_the_contract_imports_no_torch():
    bad = [f"{m} imports {d}" for m, p in _modules("hicache").items()
           if m.startswith("hicache.spec") for d in _imports(p)
           if d.split(".")[0] in ("torch", "numpy", "bench", "sglang_adapter")]
    assert not bad, "hicache/spec/ is the torch-free contract:\n" + "\n".join(bad)


def test_no_module_imports_itself_through_others():
    """No import circle between modules of hicache, bench or sglang_adapter, counting the
    imports inside functions too."""
    modules = {**MODULES, **_modules("sglang_adapter")}
    graph = {m: {d for d in _imports(p) if d in modules and d != m} for m, p in modules.items()}
    assert _cycle(graph) is None, f"an import circle: {_cycle(graph)}"


# ---- sglang_adapter/ by concern: the door and the judge, then the decisions, the controller ----

# The door's top-level modules (sources, loading, choosing, the collective count) are the
# ground floor; `serving` (it chooses between the two paths) and the package's __init__ (its
# public names, imported on first use) stand above every room, as bench's entry does.
ADAPTER_FLOORS = {"door": 0, "judge": 0, "decisions": 1, "controller": 2}
ADAPTER_ABOVE = {"sglang_adapter", "sglang_adapter.serving"}
# What choosing a target reads (the door's no-torch names): none of it imports torch.
ADAPTER_TORCH_FREE = {"sglang_adapter.source", "sglang_adapter.loader", "sglang_adapter.target",
                      "sglang_adapter.sides", "sglang_adapter.decisions",
                      "sglang_adapter.decisions.cases", "sglang_adapter.judge",
                      "sglang_adapter.judge.consensus", "sglang_adapter.controller"}


def _adapter_room(module: str) -> str:
    """A subpackage is its own room; the package's top-level modules are the door."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ADAPTER_FLOORS else "door"


def test_the_adapter_is_rooms_with_a_docstring_each():
    root = REPO / "sglang_adapter"
    rooms = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ADAPTER_FLOORS) - {"door"}, rooms
    top = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"sglang_adapter/ holds {len(top)} top-level modules: {top}"
    for room in rooms:
        doc = ast.get_docstring(ast.parse((root / room / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"sglang_adapter/{room}/: a one-line docstring"


def _adapter_downward_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in edges.items():
        if m in ADAPTER_ABOVE:
            continue
        for d in deps:
            if d in ADAPTER_ABOVE:
                bad.append(f"{m} imports {d}: it stands above every room")
                continue
            rm, rd = _adapter_room(m), _adapter_room(d)
            if rm != rd and ADAPTER_FLOORS[rd] >= ADAPTER_FLOORS[rm]:
                bad.append(f"{m} ({rm}) imports {d} ({rd}): not a floor below")
    return bad


def test_the_adapters_imports_only_point_down():
    adapter = _modules("sglang_adapter")
    edges = {m: {d for d in _imports(p) if d in adapter and d != m} for m, p in adapter.items()}
    assert sum(map(len, edges.values())) > 20, "too few adapter imports found: vacuous"
    bad = _adapter_downward_violations(edges)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", [
    {"sglang_adapter.decisions.poll": {"sglang_adapter.controller.rig"}},
    {"sglang_adapter.judge.consensus": {"sglang_adapter.decisions.cache"}},
    {"sglang_adapter.loader": {"sglang_adapter.judge.consensus"}},
    {"sglang_adapter.controller.cache": {"sglang_adapter.serving"}}])
def test_the_adapter_floor_check_catches_a_planted_upward_import(planted):
    assert _adapter_downward_violations(planted)


def _top_imports(path: Path) -> set[str]:
    """What importing `path` imports at once: its module-level imports (not those inside a
    function, which run when it is called)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_choosing_a_target_imports_no_torch():
    """The door's no-torch names (choose_for_run, choose_sides, the poll cases, the judge's
    verdict) and the rooms' own __init__ files they pass through import no torch on import."""
    adapter = _modules("sglang_adapter")
    assert ADAPTER_TORCH_FREE <= set(adapter), sorted(ADAPTER_TORCH_FREE - set(adapter))
    bad = _torch_violations({m: _top_imports(adapter[m]) for m in ADAPTER_TORCH_FREE}, adapter)
    assert not bad, "\n".join(bad)


def _torch_violations(imports: dict[str, set[str]], adapter) -> list[str]:
    return [f"{m} imports {d}" for m in sorted(imports) for d in sorted(imports[m])
            if d.split(".")[0] in ("torch", "numpy")
            or d in adapter and d not in ADAPTER_TORCH_FREE]


@pytest.mark.parametrize("planted", ["torch.distributed", "sglang_adapter.decisions.poll"])
def test_the_torch_check_catches_a_planted_import(planted):
    adapter = _modules("sglang_adapter")
    assert _torch_violations({"sglang_adapter.target": {planted}}, adapter)
