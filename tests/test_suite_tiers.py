"""The test tiers select what docs/testing.md says: `pytest -m "not slow"` (make test-fast)
leaves out the opt-in markers as `make test` does, although pytest keeps only the last -m
(tests/conftest.py, OPT_IN); naming a marker (make test-stats, make sglang-check) selects it;
the files that time what they check carry `timed` (TIMED), which make test runs alone."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest, tiers


class Item:
    def __init__(self, name: str, *markers: str, stem: str = "test_plain"):
        self.name, self.markers, self.path = name, list(markers), Path(f"tests/{stem}.py")

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None

    def add_marker(self, mark) -> None:
        self.markers.append(mark.name)


ITEMS = [Item("plain"), Item("slow", "slow"), Item("rig", "sglang_matrix", "dist"),
         Item("chance", "statistical"), Item("timed", "microbench"), Item("long", "long", "slow")]


def test_the_timed_files_are_marked():
    items = [Item("ab", stem="test_gate_real"), Item("plain")]
    selected("not timed", items)
    assert items[0].markers == ["timed"] and items[1].markers == []
    assert all((conftest.REPO / "tests" / f"{stem}.py").exists() for stem in tiers.TIMED)


def selected(markexpr: str, items: list | None = None) -> tuple[list[str], list[str]]:
    dropped = []
    config = SimpleNamespace(getoption=lambda name: markexpr, hook=SimpleNamespace(
        pytest_deselected=lambda items: dropped.extend(i.name for i in items)))
    items = list(ITEMS) if items is None else items
    conftest.pytest_collection_modifyitems(config, items)
    return [i.name for i in items], dropped


@pytest.mark.parametrize("markexpr", ["not slow", "dist or not dist", ""])
def test_a_tier_leaves_out_the_opt_in_markers(markexpr):
    kept, dropped = selected(markexpr)
    assert kept == ["plain", "slow"] and dropped == ["rig", "chance", "timed", "long"]


@pytest.mark.parametrize("markexpr,kept", [("statistical", ["plain", "slow", "chance"]),
                                           ("sglang_matrix", ["plain", "slow", "rig"]),
                                           ("microbench", ["plain", "slow", "timed"]),
                                           ("long and not timed", ["plain", "slow", "long"])])
def test_naming_a_marker_selects_it(markexpr, kept):
    assert selected(markexpr)[0] == kept  # pytest's own -m then narrows it to the marker
