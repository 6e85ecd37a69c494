"""What `bench run --cache sglang --sglang SPEC` serves with, resolved once before any rank
starts: where SGLang is read from, the cache class its release builds, and the project
protocol that models that release (the harness's data path runs it: sglang_adapter.cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.cost_model import RELEASE_MODELS, modelled
from sglang_adapter.loader import LoadError, load, unload
from sglang_adapter.source import Source, SourceError, resolve

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

    @property
    def name(self) -> str:
        """The protocol column of its rows, e.g. sglang-0.5.23@unified."""
        return f"sglang-{self.label}@{self.family}"

    @property
    def source(self) -> Source:
        return Source(self.root, self.label, self.version)


def resolve_target(spec: str) -> Target:
    """SPEC resolved and its decision path imported once here (this process), so an SGLang
    that cannot be had or driven is refused before any rank starts: SourceError or
    LoadError, whose message is the one line for the user."""
    source = resolve(spec)
    try:
        loaded = load(source)
    finally:
        unload()  # this process only checks it; each rank imports its own
    return Target(source.root, source.label, source.version, loaded.family,
                  modelled_protocol(source))


__all__ = ["LoadError", "SourceError", "Target", "resolve_target", "MODELLED"]
