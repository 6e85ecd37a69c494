"""The test tiers select what docs/testing.md says: `pytest -m "not slow"` (make test-fast)
leaves out the opt-in markers as `make test` does, although pytest keeps only the last -m
(tests/conftest.py, OPT_IN); naming a marker (make test-stats, make sglang-check) selects it."""

from types import SimpleNamespace

import pytest

from tests import conftest


class Item:
    def __init__(self, name: str, *markers: str):
        self.name, self.markers = name, markers

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


ITEMS = [Item("plain"), Item("slow", "slow"), Item("rig", "sglang_matrix", "dist"),
         Item("chance", "statistical"), Item("timed", "microbench")]


def selected(markexpr: str) -> tuple[list[str], list[str]]:
    dropped = []
    config = SimpleNamespace(getoption=lambda name: markexpr, hook=SimpleNamespace(
        pytest_deselected=lambda items: dropped.extend(i.name for i in items)))
    items = list(ITEMS)
    conftest.pytest_collection_modifyitems(config, items)
    return [i.name for i in items], dropped


@pytest.mark.parametrize("markexpr", ["not slow", "dist or not dist", ""])
def test_a_tier_leaves_out_the_opt_in_markers(markexpr):
    kept, dropped = selected(markexpr)
    assert kept == ["plain", "slow"] and dropped == ["rig", "chance", "timed"]


@pytest.mark.parametrize("markexpr,kept", [("statistical", ["plain", "slow", "chance"]),
                                           ("sglang_matrix", ["plain", "slow", "rig"]),
                                           ("microbench", ["plain", "slow", "timed"])])
def test_naming_a_marker_selects_it(markexpr, kept):
    assert selected(markexpr)[0] == kept  # pytest's own -m then narrows it to the marker
