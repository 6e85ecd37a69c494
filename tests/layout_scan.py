"""The source scans tests/test_layout.py holds the house with: modules and their imports, import
circles, reaches past the seam or the adapter's door, and the code rules (sizes, parameters,
prints, run files named outside RunDir, this project's issue numbers and commit hashes, the
verdict words bound outside bench/verdict/: tests/test_verdict_room.py).
Each scan reads source text or files and returns what it found; the tests judge it."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE_TOPS = ("hicache", "bench", "sglang_adapter", "scripts", "tests")
# This project's issues as prose names them: the word, a space and up to three digits;
# upstream issues are written "#34572" or "SGLang issue #34572" and have more digits.
ISSUE = re.compile(r"\b[Ii]ssues?\s+\d{1,3}\b")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


@functools.cache
def parse(text: str) -> ast.Module:
    """The syntax tree of `text`, parsed once per session (the scans read every file often)."""
    return ast.parse(text)


def package_modules(top: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module under REPO/top."""
    out = {}
    for path in sorted((REPO / top).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def code_files() -> list[Path]:
    """Every .py file of the code the house rules cover (CODE_TOPS)."""
    return [p for top in CODE_TOPS for p in sorted((REPO / top).rglob("*.py"))]


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file (lazy imports count)."""
    out = set()
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def top_imports_of(path: Path) -> set[str]:
    """What importing `path` imports at once: its module-level imports (not those inside a
    function, which run when it is called)."""
    out = set()
    for node in parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def cache_reaches(path: Path) -> set[str]:
    """Every `self.cache.X` / `cache.X` (and `...pin.Y`) a module reads or calls."""
    out = set()
    for node in ast.walk(parse(path.read_text())):
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


def door_violations(path: str, text: str, public: set[str]) -> list[str]:
    """Where `text` reaches into sglang_adapter other than through its door: a submodule
    imported, a name the door does not list, a private attribute of anything but self."""
    tree, bad, through = parse(text), [], False
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


# ---- the code rules: each scan yields (name, measure) per finding in one file's text ----

def _functions(text: str) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in ast.walk(parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def long_functions(text: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function longer than `limit` lines, nested ones included."""
    return [(f.name, f.end_lineno - f.lineno + 1) for f in _functions(text)
            if f.end_lineno - f.lineno + 1 > limit]


def parameter_count(f: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter, *args and **kwargs included, `self` and `cls` left out."""
    a = f.args
    named = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in named if n not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)


def wide_functions(text: str, limit: int) -> list[tuple[str, int]]:
    """(name, parameters) of every function taking more than `limit` parameters."""
    return [(f.name, n) for f in _functions(text) if (n := parameter_count(f)) > limit]


def print_calls(text: str) -> int:
    """How many calls of the builtin print the text makes."""
    return sum(1 for n in ast.walk(parse(text)) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Name) and n.func.id == "print")


def named_files(text: str, pattern: re.Pattern) -> list[tuple[int, str]]:
    """(line, name) of every quoted file name `pattern` finds."""
    return [(i, m.group(1)) for i, line in enumerate(text.splitlines(), 1)
            for m in pattern.finditer(line)]


def issue_numbers(text: str) -> list[tuple[int, str]]:
    """(line, text) of every mention of this project's issues by number."""
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1)
            for m in ISSUE.finditer(line)]


def hex_words(text: str) -> set[str]:
    """Words that could be abbreviated commit hashes (not plain numbers)."""
    return {w for w in HEX.findall(text) if not w.isdigit()}


def commits(words: set[str], repo: Path = REPO) -> set[str]:
    """The words that name a commit of the git repository at `repo`."""
    words = sorted(words)
    if not words:
        return set()
    done = subprocess.run(["git", "cat-file", "--batch-check"], cwd=repo, text=True,
                          input="".join(f"{w}^{{commit}}\n" for w in words),
                          capture_output=True, timeout=60, check=True)
    answers = done.stdout.splitlines()
    assert len(answers) == len(words), done.stdout[-500:]
    return {w for w, a in zip(words, answers, strict=True) if a.split()[1:2] == ["commit"]}


# ---- rooms and floors ----

def bench_room(module: str) -> str | None:
    """hicache is one room; bench's packages one room each; bench's top modules their own."""
    parts = module.split(".")
    if parts[0] == "hicache":
        return "hicache"
    if parts[0] != "bench":
        return None
    return ".".join(parts[:2]) if len(parts) > 1 else "bench"


def downward_violations(edges: dict[str, set[str]], floors: dict[str, int], room_of,
                        above: frozenset[str] = frozenset()) -> list[str]:
    """The imports of `edges` that do not point down: into a room (`room_of`) on the same
    floor or higher, or into a module standing `above` every room. Modules of no room
    (None) and imports within a room are not judged."""
    bad = []
    for m, deps in edges.items():
        if m in above:
            continue
        for d in sorted(deps):
            rm, rd = room_of(m), room_of(d)
            if d in above:
                bad.append(f"{m} imports {d}: it stands above every room")
            elif rm != rd and rd in floors and floors[rd] >= floors.get(rm, 99):
                bad.append(f"{m} ({rm}) imports {d} ({rd}): not a floor below")
    return bad


def seam_members() -> set[str]:
    """What the harness may reach of the cache: the seam's names, and the pinned clock's."""
    from hicache.serve.seam import CacheUnderTest, PinnedClock
    names = {n for n in vars(CacheUnderTest) if not n.startswith("_")}
    return names | {f"pin.{n}" for n in vars(PinnedClock) if not n.startswith("_")}


def torch_violations(imports: dict[str, set[str]], adapter: dict[str, Path],
                     torch_free: set[str]) -> list[str]:
    """Imports (module -> what it imports at once) of torch or numpy, or of an adapter
    module outside `torch_free`."""
    return [f"{m} imports {d}" for m in sorted(imports) for d in sorted(imports[m])
            if d.split(".")[0] in ("torch", "numpy") or d in adapter and d not in torch_free]


def a_commit_word(repo: Path = REPO) -> str:
    """A commit of the repository's as a text would name it: the newest of HEAD's ancestors
    whose 7-digit abbreviation holds a letter (one of only digits reads as a number)."""
    hashes = subprocess.run(["git", "rev-list", "--max-count=200", "HEAD"], cwd=repo, text=True,
                            capture_output=True, check=True, timeout=60).stdout.split()
    return next(h[:7] for h in hashes if not h[:7].isdigit())


# The verdict words a gate, a review and their checks say: bench/verdict/words.py binds them.
VERDICT_WORDS = frozenset({"PASS", "FAIL", "INCONCLUSIVE", "NOT JUDGED", "UNRESOLVED", "REFUSED"})


def verdict_word_constants(text: str) -> list[tuple[int, str]]:
    """(line, name) of each name a module or class body binds to a verdict word (`PASS =
    "PASS"`, `FAIL, N = "FAIL", 1`, `KEEP: str = "PASS"`)."""
    tree = parse(text)
    bodies = [tree.body, *(c.body for c in tree.body if isinstance(c, ast.ClassDef))]
    out = []
    for node in (n for body in bodies for n in body):
        if isinstance(node, ast.Assign):
            pairs = [p for t in node.targets for p in _bound(t, node.value)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs = _bound(node.target, node.value)
        else:
            continue
        out += [(node.lineno, name) for name, value in pairs if value in VERDICT_WORDS]
    return out


def _bound(target: ast.expr, value: ast.expr) -> list[tuple[str, object]]:
    """(name, constant) for each plain name `target` binds to a constant of `value`."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
            and len(target.elts) == len(value.elts):
        return [p for t, v in zip(target.elts, value.elts, strict=True) for p in _bound(t, v)]
    if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
        return [(target.id, value.value)]
    return []
