"""How a rank gets SGLang's cache: `factory(target)`, the CacheFactory (hicache.serve.seam)
a `--cache sglang` serve builds its cache with. Apart from the two caches it chooses
between (sglang_adapter.decisions.cache's decisions path, sglang_adapter.controller.cache's
controller path, a subclass of it), so that neither imports the other's chooser: no import
circle."""

from __future__ import annotations

import functools

from sglang_adapter.controller.cache import ControllerCache
from sglang_adapter.decisions.cache import SGLangCache, SGLangCode
from sglang_adapter.door import Door
from sglang_adapter.judge import consensus
from sglang_adapter.loader import load, native_hash
from sglang_adapter.source import DEFAULT_CACHE
from sglang_adapter.target import Target


@functools.cache
def _loaded(target: Target):
    """SGLang imported once per process (sglang_adapter.loader: one per process)."""
    if target.consensus_dir is not None:
        consensus.enable()  # SGLang's decorators choose at import whether to wrap
    loaded = load(target.source)
    if target.controller:  # SGLang names storage pages with its own compiled extension
        native_hash(target.source, str(DEFAULT_CACHE))
    door = Door(target.root)
    door.install()
    return loaded, door


def factory(target: Target):
    """The CacheFactory (hicache.serve.seam) of a `--cache sglang` run; loads SGLang in this
    process on its first call. With `target.controller` SGLang's controller path is the
    data path too (sglang_adapter.controller.cache)."""
    loaded, door = _loaded(target)
    cls = ControllerCache if target.controller else SGLangCache
    return functools.partial(_built, cls, door, loaded, target=target)


def _built(cls, door: Door, loaded, *args, target: Target):
    """One serve's cache; `target` a keyword, so a run may hand a serve a target of its own
    (its consensus folder: bench.run.worker._checked)."""
    return cls(*args, sglang=SGLangCode(target, door, loaded))
