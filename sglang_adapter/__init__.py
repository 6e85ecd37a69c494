"""SGLang's own HiCache code on the harness's ranks (docs/sglang.md).

A package of its own: `hicache/` never imports it, and it never imports `bench/`. This file
is its one door: bench/ and scripts/ import adapter names from `sglang_adapter` alone, each
listed below (tests/test_layout.py holds them to it). A name is imported from its module on
first use, so choosing a target (`choose_for_run`, `choose_sides`, the option checks) costs no
torch import; the rank-side names (`Door`, `make_rig`, `poll_rank`, ...) bring torch in.

Inside, by concern (tests/test_layout.py holds the floors: every import points down):
- the door, its top-level modules: `source` resolves `--sglang SPEC`; `loader` imports
  SGLang's decision path from it, unchanged; `target` what a run serves with; `side_specs`
  several SGLangs in one run; `door` counts every collective SGLang issues where it calls
  torch.distributed, by its calling frame; `serving` the cache a `bench run --cache sglang`
  rank serves with (above every room: it chooses between the two paths);
- `judge/`: `consensus`, SGLang's own rank-consensus checker;
- `decisions/`: `cases` (one poll case, no torch), `poll` (SGLang's own poll on real gloo
  ranks), `cache` (its decisions behind the harness's seam, on the project's data path);
- `controller/`: `rig` (its cache controller's threads on real gloo ranks), `stand_ins`
  (their memory-less host pool and tree core), `storage` (the backend SGLang reads
  through), `pinned` (a pinned schedule for its drains), `cache` (the controller path as a
  run's data path), `project_stand_ins` (its host pool and tree core over the harness's),
  `writes` (its write path).
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
    "unservable": ("target", "unservable"),
    "choose_sides": ("side_specs", "choose_sides"),
    "is_side_list": ("side_specs", "is_list"),
    "parse_sides": ("side_specs", "parse"),
    "Source": ("source", "Source"),
    "SourceError": ("source", "SourceError"),
    "resolve": ("source", "resolve"),
    "LoadError": ("loader", "LoadError"),
    "load": ("loader", "load"),
    "POLICIES": ("decisions.cases", "POLICIES"),
    "STEP_S": ("decisions.cases", "STEP_S"),
    "PollCase": ("decisions.cases", "PollCase"),
    "ships_checker": ("judge.consensus", "ships_checker"),
    "consensus_verdict": ("judge.consensus", "verdict"),
    "consensus_collectives": ("judge.consensus", "collectives"),
    # on a rank (torch)
    "Door": ("door", "Door"),
    "make_rig": ("decisions.poll", "make_rig"),
    "poll_rank": ("decisions.poll", "poll_rank"),
    "ControllerCase": ("controller.rank", "ControllerCase"),
    "controller_rank": ("controller.rank", "controller_rank"),
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
