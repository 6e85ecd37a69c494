"""Release names on the command line, the presets' protocol sets and the releases preset
(docs/releases.md): plans only, no rank is started."""

from __future__ import annotations

from bench.commands.run import build_plan, parser
from bench.plan.presets import PRESETS

FIVE = ("pre27010", "pr27010", "pr36425", "step-batched", "step-clock")


def _plan(*argv: str):
    return build_plan(parser().parse_args(list(argv)))


def test_release_aliases():
    plan = _plan("--protocols", "sglang-0.5.18,sglang-0.5.19,sglang-0.5.23")
    assert plan.protocols == ("pre27010", "pr36425", "sglang-0.5.23")
    assert _plan("--protocols", "before,after").protocols == ("pr27010", "pr36425")
    # an alias and its protocol name are one protocol
    assert _plan("--protocols", "after,sglang-0.5.19,pr36425").protocols == ("pr36425",)


def test_every_protocol_presets_keep_the_five():
    """cost (make bench's pinned shape before the headline went end to end) and ci ran
    "every protocol" before sglang-0.5.23 existed: their cost stays."""
    for name in ("cost", "ci"):
        assert PRESETS[name](0)["protocols"] == FIVE, name
        assert _plan("--preset", name).protocols == FIVE, name
    assert _plan("--preset", "pp").protocols == FIVE  # the plan's own default


def test_releases_preset():
    plan = _plan("--preset", "releases")
    assert (plan.tp, plan.pp, plan.policies) == (2, 2, ("wait_complete",))
    assert plan.protocols == ("pr27010", "pr36425", "sglang-0.5.23")
    assert plan.repeats >= 5  # pairs for a between-repeat interval
    cfg = plan.config(plan.cells()[0])
    assert cfg.host_memory == "buffer_only" and cfg.pp == 2


def test_host_memory_flag_reaches_every_configuration():
    plan = _plan("--protocols", "sglang-0.5.23,after", "--host-memory", "buffer_only")
    assert {plan.config(c).host_memory for c in plan.cells()} == {"buffer_only"}
    assert _plan().config(_plan().cells()[0]).host_memory == "cache"
