"""What the SGLang tests need of this machine, checked in one place: the `sglang` extra in
this venv (not in some other clone's) and a release's wheel in the cache. `make test` fetches
both first wherever the package index is reachable (the Makefile's sglang-ready), so a skip
here means this machine could not get them, and its reason says which and how to retry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sglang_adapter.source import DEFAULT_CACHE

EXTRA = ("msgspec", "dill", "packaging")  # pyproject's `sglang` extra


def missing_extra() -> list[str]:
    return [m for m in EXTRA if importlib.util.find_spec(m) is None]


def sglang_wheel(version: str) -> Path:
    """The cached wheel of release `version`; skips, naming what is missing, when this venv
    lacks the extra or the cache lacks the wheel."""
    if lacking := missing_extra():
        pytest.skip(f"this venv lacks the sglang extra ({', '.join(lacking)}) and make test "
                    "could not install it (no package index?): make sglang-fetch")
    found = sorted(DEFAULT_CACHE.glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel in {DEFAULT_CACHE} and make test could not "
                    f"fetch it (no package index?): make sglang-fetch SGLANG={version}")
    return found[-1]
