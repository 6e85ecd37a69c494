"""What `bench run --cache sglang --sglang SPEC` serves with, resolved once before any rank
starts: where SGLang is read from, the cache class its release builds, and the project
protocol that models that release (the harness's data path runs it: sglang_adapter.decisions.cache).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hicache.spec.cost_model import RELEASE_MODELS, modelled
from sglang_adapter.loader import LoadError, load, native_hash, unload
from sglang_adapter.source import DEFAULT_CACHE, Source, SourceError, resolve

# The protocol the project models each supported release's poll with (docs/releases.md).
MODELLED = {name.removeprefix("sglang-"): proto for name, proto in RELEASE_MODELS.items()}


def modelled_protocol(source: Source) -> str:
    """The release's modelled protocol; a tree or other release: the newest's."""
    return modelled(f"sglang-{source.version}@")


@dataclass(frozen=True)
class Target:
    """An SGLang a run can drive (picklable: it travels to the ranks in the plan)."""

    root: str  # the wheel or folder `sglang` is imported from
    label: str  # 0.5.23, or tree:<folder>
    version: str | None
    family: str  # unified | hiradix (sglang_adapter.loader.FAMILIES)
    protocol: str  # the project protocol of the release: the data path's
    # --sglang-path controller: SGLang's controller path is the data path too
    # (sglang_adapter.controller.cache); else the project's (sglang_adapter.decisions.cache)
    controller: bool = False
    native_error: str | None = None  # why SGLang's page-hash extension does not build here
    # SGLang's own rank-consensus checker on, its journals and log in this folder
    # (sglang_adapter.judge.consensus); None: off, as a server runs by default
    consensus_dir: str | None = None
    # its label among several SGLangs in one run (sglang_adapter.side_specs)
    side: str | None = None

    @property
    def name(self) -> str:
        """The protocol column of its rows, e.g. sglang-0.5.23@unified; a labelled side's
        with its label first, base=sglang-0.5.23@unified (hicache.spec.cost_model.modelled
        reads the release after the label)."""
        own = f"sglang-{self.label}@{self.family}"
        return f"{self.side}={own}" if self.side else own

    @property
    def source(self) -> Source:
        return Source(self.root, self.label, self.version)


def resolve_target(spec: str, native: bool = False) -> Target:
    """SPEC resolved and its decision path imported once here (this process), so an SGLang
    that cannot be had or driven is refused before any rank starts: SourceError or
    LoadError, whose message is the one line for the user. `native`: also build SGLang's
    page-hash extension here (its controller path names storage pages with it; built once,
    then torch's extension cache), recording why it does not build in `native_error`."""
    source = resolve(spec)
    error = None
    try:
        loaded = load(source)
        if native and loaded.family == "unified":
            try:
                native_hash(source, str(DEFAULT_CACHE))
            except LoadError as e:
                error = str(e).split("does not build ", 1)[-1]
    finally:
        unload()  # this process only checks it; each rank imports its own
    return Target(source.root, source.label, source.version, loaded.family,
                  modelled_protocol(source), native_error=error)


# The system under test a verb serves with (hicache.serve.seam): the project's HiCache, or
# SGLang's own decisions behind the seam.
CACHES = ("project", "sglang")


class ChoiceError(ValueError):
    """--cache / --sglang cannot be served; the message is one line for the user."""


def choose(cache: str, spec: str | None, protocols_given: bool,
           pairing_given: bool = False, native: bool = False) -> Target | None:
    """The Target of `--cache sglang --sglang SPEC` (None for `--cache project`), checked
    once before any rank starts; ChoiceError (one line) when the options do not fit or
    the SGLang cannot be had or driven."""
    if cache not in CACHES:
        raise ChoiceError(f"--cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if cache == "project":
        if spec is not None:
            raise ChoiceError("--sglang needs --cache sglang")
        return None
    if not spec:
        raise ChoiceError("--cache sglang needs --sglang SPEC (a release such as 0.5.23, a "
                          "wheel file or a source tree)")
    if protocols_given or pairing_given:
        raise ChoiceError("--cache sglang runs the release's own protocol: no --protocols"
                          f"{' or --pairing' if pairing_given else ''}")
    try:
        return resolve_target(spec, native)
    except (SourceError, LoadError) as e:
        raise ChoiceError(str(e)) from None


# What of SGLang `--cache sglang` runs (docs/sglang.md): its controller path as the data
# path too (sglang_adapter.controller.cache), or its decisions on the project's data path
# (sglang_adapter.decisions.cache); auto: the controller where the run fits it.
SGLANG_PATHS = ("auto", "controller", "decisions")


def controller_unfit(target: Target, pp: int, system: dict) -> str | None:
    """Why SGLang's controller path behind the seam cannot serve a run of this layout and
    HiCacheConfig overrides (`system`), in words for one line; None when it can."""
    return ("needs a release with UnifiedRadixCache (0.5.19 on)" if target.family != "unified"
            else f"needs SGLang's page-hash extension, which does not build here "
            f"{target.native_error}"
            if target.native_error else
            "serves buffer_only at --pp > 1 on SGLang's PP-ticket path: a release with it "
            "(0.5.21 on)" if _ticketed(pp, system) and target.version in NO_TICKETS
            else "serves a side-car pool (--extra-pool) on 0.5.23's per-pool storage "
            "interface, checked there only (0.5.23 on)"
            if system.get("extra_pool") and target.version in NO_SIDECAR
            else run_unfit(pp, system))


def unservable(target: Target, pp: int, system: dict) -> str | None:
    """Why neither of SGLang's paths can serve a run of this layout and HiCacheConfig
    overrides on this release, in words for one line (None: one can): buffer_only at
    --pp > 1 needs the PP-ticket path (0.5.21 on), which the decisions path drives too
    (sglang_adapter.decisions.poll `register_ticket`)."""
    if _ticketed(pp, system) and target.version in NO_TICKETS:
        return ("buffer_only at --pp > 1 needs SGLang's PP-ticket path (0.5.21 on), which "
                "this release lacks (no PPPrefetchState)")
    return None


# Releases with UnifiedRadixCache but no PP-ticket path (PPPrefetchState: 0.5.21 on).
NO_TICKETS = ("0.5.19", "0.5.20")
# Releases whose side-car path the controller path was not checked against (0.5.23's
# sidecar specs, v2 per-pool storage calls and side-car ack are what it drives).
NO_SIDECAR = ("0.5.19", "0.5.20", "0.5.21", "0.5.22")


def _ticketed(pp: int, system: dict) -> bool:
    return pp > 1 and system.get("host_memory", "cache") == "buffer_only"


def run_unfit(pp: int, system: dict) -> str | None:
    """controller_unfit's reasons that are the run's, whatever the SGLang: known before
    SGLang is imported or its page-hash extension built. Any PP size serves (docs/sglang.md,
    "Its layouts"), and the write path under write_through and write_back
    (sglang_adapter.controller.writes); buffer_only at PP > 1 serves on SGLang's PP-ticket
    path (sglang_adapter.controller.tickets), at PP 1 it does not: its hits then go
    through BufferModePipeline's hit drain, staging and anchor pins, not driven here. A
    side-car pool serves (SGLang's own sidecar spec: sglang_adapter.controller.rig) with host
    memory a cache tier; a PP ticket's side-car transfers are not driven here."""
    buffer_only = system.get("host_memory", "cache") != "cache"
    return (f"serves buffer_only host memory at --pp > 1 only ({_BUFFER_ONLY})" if
            buffer_only and pp == 1 else
            "serves a side-car pool (--extra-pool) with --host-memory cache only (a PP "
            "ticket's side-car transfers are not driven here)"
            if buffer_only and system.get("extra_pool") else None)


_BUFFER_ONLY = ("at --pp 1 buffer_only hits go through SGLang's BufferModePipeline hit "
                "drain, not driven here")


def pick_path(target: Target | None, path: str | None, pp: int, system: dict
              ) -> Target | None:
    """The Target with `--sglang-path` applied (None: auto): the controller path where the
    run fits it and the path allows it; ChoiceError (one line) when it was asked for and
    cannot serve, or given without --cache sglang."""
    if target is None:
        if path is not None:
            raise ChoiceError("--sglang-path needs --cache sglang")
        return None
    why = controller_unfit(target, pp, system)
    if path == "controller" and why is not None:
        raise ChoiceError(f"--sglang-path controller {why}")
    return replace(target, controller=path != "decisions" and why is None)


def choose_for_run(cache: str, spec: str | None, protocols_given: bool, pairing_given: bool,
                   path: str | None, pp: int, system: dict) -> Target | None:
    """`bench run`'s choose: the Target with `--sglang-path` applied (pick_path), SGLang's
    page-hash extension built here first where the controller path may serve the run. A
    run the controller path cannot serve whatever the SGLang (run_unfit) is refused
    `--sglang-path controller` before SGLang is imported."""
    why = run_unfit(pp, system)
    if path == "controller" and why is not None and cache == "sglang" and spec:
        raise ChoiceError(f"--sglang-path controller {why}")
    target = choose(cache, spec, protocols_given, pairing_given,
                    native=path != "decisions" and why is None)
    return pick_path(target, path, pp, system)


__all__ = ["CACHES", "SGLANG_PATHS", "ChoiceError", "LoadError", "SourceError", "Target",
           "choose", "choose_for_run", "controller_unfit", "pick_path", "resolve_target",
           "run_unfit", "unservable",
           "MODELLED"]
