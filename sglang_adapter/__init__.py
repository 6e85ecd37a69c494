"""SGLang's own HiCache code on the harness's ranks (docs/sglang.md).

A package of its own: `hicache/` never imports it, and it never imports `bench/`. This file
is its one door: bench/ and scripts/ import adapter names from `sglang_adapter` alone, each
listed below (tests/test_layout.py holds them to it). A name is imported from its module on
first use, so choosing a target (`choose_for_run`, `choose_sides`, the option checks) costs no
torch import; the rank-side names (`Door`, `make_rig`, `poll_rank`, ...) bring torch in.

Inside: `source` resolves `--sglang SPEC`; `loader` imports SGLang's decision path from it,
unchanged; `door` counts every collective SGLang issues where it calls torch.distributed, by
its calling frame; `poll` drives SGLang's own poll on real gloo ranks; `controller` its
cache controller's threads; `serving` the cache a `bench run --cache sglang` rank serves
with; `consensus` SGLang's own rank-consensus checker; `sides` several SGLangs in one run.
"""

from __future__ import annotations

import importlib

# name -> (module, its name there)
_DOOR = {
    # choosing what runs (no torch)
    "CACHES": ("target", "CACHES"),
    "SGLANG_PATHS": ("target", "SGLANG_PATHS"),
    "MODELLED": ("target", "MODELLED"),
    "ChoiceError": ("target", "ChoiceError"),
    "Target": ("target", "Target"),
    "choose": ("target", "choose"),
    "choose_for_run": ("target", "choose_for_run"),
    "controller_unfit": ("target", "controller_unfit"),
    "modelled_protocol": ("target", "modelled_protocol"),
    "resolve_target": ("target", "resolve_target"),
    "run_unfit": ("target", "run_unfit"),
    "choose_sides": ("sides", "choose_sides"),
    "is_side_list": ("sides", "is_list"),
    "parse_sides": ("sides", "parse"),
    "Source": ("source", "Source"),
    "SourceError": ("source", "SourceError"),
    "resolve": ("source", "resolve"),
    "LoadError": ("loader", "LoadError"),
    "load": ("loader", "load"),
    "POLICIES": ("cases", "POLICIES"),
    "STEP_S": ("cases", "STEP_S"),
    "PollCase": ("cases", "PollCase"),
    "ships_checker": ("consensus", "ships_checker"),
    "consensus_verdict": ("consensus", "verdict"),
    "consensus_collectives": ("consensus", "collectives"),
    # on a rank (torch)
    "Door": ("door", "Door"),
    "make_rig": ("poll", "make_rig"),
    "poll_rank": ("poll", "poll_rank"),
    "ControllerCase": ("controller", "ControllerCase"),
    "controller_rank": ("controller", "controller_rank"),
    "cache_factory": ("serving", "factory"),
}

__all__ = sorted(_DOOR)


def __getattr__(name: str):
    if name not in _DOOR:
        raise AttributeError(f"module 'sglang_adapter' has no public name {name!r}")
    module, attr = _DOOR[name]
    value = getattr(importlib.import_module(f"sglang_adapter.{module}"), attr)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


def __dir__() -> list[str]:
    return __all__
