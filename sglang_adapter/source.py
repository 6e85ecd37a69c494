"""Where SGLang's code comes from: `--sglang SPEC` resolved to a path Python can import
`sglang` from, never an installed package.

SPEC is one of
- a release, `0.5.23`: its wheel, fetched once with `pip download --no-deps sglang==V` into
  a cache folder (default ~/.cache/hicache-bench/sglang, or $HICACHE_BENCH_SGLANG_CACHE);
  its Python files are unpacked once into that folder (`unpack`) and imported from there;
- a wheel file (`sglang-V-*.whl`), unpacked the same way;
- a source tree: a checkout's `python/sglang/` (or `python/`), or an unpacked wheel's
  `sglang/` (or the folder holding it). This is how a pull request's branch is measured.

Bad input or no network: `SourceError`, whose message is the one line the command prints
before it exits 2.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

# Where releases' wheels are kept (CI caches this folder); the environment may move it.
DEFAULT_CACHE = Path(os.environ.get("HICACHE_BENCH_SGLANG_CACHE",
                                    Path.home() / ".cache" / "hicache-bench" / "sglang"))
RELEASE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")
WHEEL = re.compile(r"^sglang-(?P<version>[^-]+)-.*\.whl$")


class SourceError(ValueError):
    """SPEC cannot be resolved; the message is one line for the user."""


@dataclass(frozen=True)
class Source:
    """An importable SGLang: `root` is a sys.path entry (a folder, or a wheel file read as a
    zip where it could not be unpacked) holding the `sglang` package; `label` names it in
    results (`0.5.23`, `tree:<folder name>`)."""

    root: str
    label: str
    version: str | None  # the release, when known (a wheel's name); None for a tree
    wheel: str | None = None  # the wheel file `root` was unpacked from


def resolve(spec: str, cache_dir: Path | None = None) -> Source:
    """The Source for SPEC (module docstring); fetches a release's wheel when not cached."""
    spec = spec.strip()
    if not spec:
        raise SourceError("--sglang needs a release (0.5.23), a wheel file or a source tree")
    if RELEASE.match(spec):
        wheel = cached_wheel(spec, cache_dir or DEFAULT_CACHE)
        return _wheel_source(wheel, spec, cache_dir or DEFAULT_CACHE)
    path = Path(spec).expanduser()
    if path.is_file():
        match = WHEEL.match(path.name)
        if not match:
            raise SourceError(f"--sglang {spec}: not an sglang wheel (sglang-V-*.whl)")
        return _wheel_source(path.resolve(), match["version"], cache_dir or DEFAULT_CACHE)
    if path.is_dir():
        return _tree(path)
    raise SourceError(f"--sglang {spec}: no such release, wheel or source tree "
                      f"(a release looks like 0.5.23)")


def _wheel_source(wheel: Path, version: str, cache_dir: Path) -> Source:
    """The wheel unpacked in the cache folder; the wheel itself (read as a zip) where the
    folder cannot be written."""
    try:
        root = unpacked(wheel, cache_dir)
    except OSError:
        root = wheel
    except zipfile.BadZipFile:
        raise SourceError(f"--sglang {wheel}: not a readable wheel (a zip)") from None
    return Source(str(root), version, version, str(wheel))


def unpack(wheel: Path, dest: Path) -> None:
    """What a zip import serves of the wheel: the `sglang` package's Python files, and the
    sources of its page-hash extension (cpp_utils, which SGLang's own loader compiles);
    no extension modules (a zip never loads them either)."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("sglang/") and (
            n.endswith(".py") or "/mem_cache/cpp_utils/" in n)])


def unpacked(wheel: Path, cache_dir: Path) -> Path:
    """The wheel unpacked once (`unpack`) into cache_dir/unpacked/<wheel>-<its sha256>: a
    rank loads the decision path from files faster than zipimport does (3.05 s of CPU
    against 4.5, torch included), and in 2.0 s where Python may keep its bytecode there
    (docs/sglang.md). Ranks and runs racing to unpack the same wheel each unpack to a
    folder of their own and rename it into place."""
    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    name = f"{wheel.name.removesuffix('.whl')}-{digest.hexdigest()[:16]}"
    folder = cache_dir / "unpacked" / name
    if folder.is_dir():
        return folder
    part = folder.with_name(f"{folder.name}.part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    try:
        unpack(wheel, part)
        os.rename(part, folder)
    except OSError:
        if not folder.is_dir():  # not another process's folder, renamed first: a real failure
            raise
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return folder


def _tree(path: Path) -> Source:
    """A folder: the `sglang` package itself, or a folder holding it (`python/`)."""
    for pkg in (path, path / "sglang", path / "python" / "sglang"):
        if (pkg / "srt" / "mem_cache").is_dir() and pkg.name == "sglang":
            return Source(str(pkg.parent.resolve()), f"tree:{_tree_name(pkg)}", None)
    raise SourceError(f"--sglang {path}: no sglang package there (expected "
                      f"sglang/srt/mem_cache/ under it, or python/sglang/ in a checkout)")


def _tree_name(pkg: Path) -> str:
    """The checkout's folder name (python/sglang -> the folder above python/)."""
    top = pkg.parent.parent if pkg.parent.name == "python" else pkg.parent
    return top.resolve().name


def cached_wheel(version: str, cache_dir: Path) -> Path:
    """The release's wheel from the cache, downloaded into it on the first use."""
    found = sorted(cache_dir.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[-1]
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           "--disable-pip-version-check", f"sglang=={version}", "-d", str(cache_dir)]
    env = {**os.environ, "PIP_RETRIES": "0", "PIP_TIMEOUT": "15"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        raise SourceError(f"no network: pip download sglang=={version} timed out; put its "
                          f"wheel in {cache_dir} or pass a wheel file") from None
    found = sorted(cache_dir.glob(f"sglang-{version}-*.whl"))
    if done.returncode != 0 or not found:
        # pip says "no matching distribution" offline too: one message for both.
        raise SourceError(f"no network (or no release {version} on the index): pip download "
                          f"--no-deps sglang=={version} failed; put its wheel in {cache_dir} "
                          f"or pass a wheel file")
    return found[-1]


def main(argv: list[str]) -> int:
    """`python -m sglang_adapter.source SPEC...`: resolves (fetching releases once) and
    prints each path; one line and exit 2 for a SPEC that cannot be had."""
    try:
        for spec in argv:
            print(resolve(spec).root)
    except SourceError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
