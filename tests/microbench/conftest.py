"""Micro-benchmarks run only when a marker expression names them (`-m microbench`).

pyproject's addopts deselect them with -m "not microbench", but a command-line -m (make
test-fast's "not slow") replaces that expression; this keeps them out in that case too.
"""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    if "microbench" in (config.getoption("markexpr") or ""):
        return  # the expression decides
    dropped = [i for i in items if i.get_closest_marker("microbench")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if not i.get_closest_marker("microbench")]
