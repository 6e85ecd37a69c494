"""Imports SGLang's HiCache decision path from a Source (a wheel read as a zip, or a tree)
into this process, unchanged.

What runs real and what is stubbed (docs/sglang.md):
- every module on the decision path (DECISION_PATH) imports whole from the source; one that
  fails to import, or that would come from a stub, is an error (`LoadError`), never a stub;
- third-party packages the decision path never calls (GPU kernels, tokenizers, the HTTP
  server, ...) and SGLang's own GPU-kernel, grammar and tool-call packages are permissive
  stub modules (STUBBED): importable, every attribute a stub that can be called,
  subclassed, indexed or used as a decorator;
- `sglang/__init__.py` (the public frontend API: `sglang.lang`, HF patches) is not run:
  `sglang` is a bare package over the source's folder;
- `torch.compile` is a pass-through while SGLang imports (decorated kernels are never run).

One SGLang per process: the import is global (sys.modules). A rank imports it once.
"""

from __future__ import annotations

import abc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from dataclasses import dataclass

from sglang_adapter.source import Source

SUPPORTED = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# The small pure-Python packages SGLang's cache path imports whole (pyproject's `sglang`
# extra; `make sglang-fetch` installs them where missing).
DEPS = ("msgspec", "dill", "packaging")

# Third-party packages (and SGLang's own non-decision packages) served as stubs.
STUBBED = (
    "sgl_kernel", "triton", "flashinfer", "transformers", "zmq", "vllm", "orjson", "psutil",
    "pybase64", "requests", "starlette", "pydantic_core", "pydantic", "tvm_ffi",
    "torchvision", "IPython", "tqdm", "huggingface_hub", "sentencepiece", "safetensors",
    "compressed_tensors", "regex", "gguf", "openai", "partial_json_parser", "setproctitle",
    "uvloop", "fastapi", "uvicorn", "xgrammar", "outlines", "llguidance", "einops",
    "sglang.kernels", "sglang.srt.parser", "sglang.srt.function_call",
    "sglang.srt.constrained",
)

UNIFIED = "sglang.srt.mem_cache.unified_radix_cache"
HIRADIX = "sglang.srt.mem_cache.hiradix_cache"
# Modules that must import whole, real, from the source (any SGLang); HIRADIX too where the
# source ships it (0.5.23 does not).
DECISION_PATH = (
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.hicache_storage",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.mem_cache.utils",
    UNIFIED,
)
# The cache class each release builds for a plain model, and what the adapter calls on it:
# UnifiedRadixCache from 0.5.19 on (its poll decides in _can_terminate_prefetch), else
# HiRadixCache (0.5.18: pre27010's poll, can_terminate_prefetch). The first that has every
# name is driven.
FAMILIES = {
    "unified": (UNIFIED, "UnifiedRadixCache", (
        "check_prefetch_progress", "_can_terminate_prefetch", "_all_reduce", "_pp_sync",
        "check_hicache_events")),
    "hiradix": (HIRADIX, "HiRadixCache", (
        "check_prefetch_progress", "can_terminate_prefetch", "_all_reduce_attn_groups",
        "check_hicache_events", "_parse_storage_backend_extra_config")),
}

class LoadError(RuntimeError):
    """This SGLang cannot be driven; the message is one line for the user."""


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _StubMeta(abc.ABCMeta):
    """A stub class: any attribute is another stub; an ABC so it mixes with SGLang's ABCs."""

    def __getattr__(cls, name):
        if _dunder(name):
            raise AttributeError(name)
        return _stub(name)()

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs \
                and not isinstance(args[0], _Stub):
            return args[0]  # used as a bare decorator
        return type.__call__(cls, *args, **kwargs)

    def __getitem__(cls, key):
        return cls


class _Stub(metaclass=_StubMeta):
    """A stub value: callable (a decorator passes its function through), subclassable
    (`__mro_entries__`), indexable, iterable (empty), a context manager."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if _dunder(name):
            raise AttributeError(name)
        return _stub(name)()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _stub("result")()

    def __mro_entries__(self, bases):
        return (type(self),)

    def __getitem__(self, key):
        return _stub("item")()

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _stub(name: str) -> type:
    return _StubMeta(name, (_Stub,), {})


class StubModule(types.ModuleType):
    """A module named in STUBBED: every attribute a stub."""

    def __getattr__(self, name):
        if _dunder(name):
            raise AttributeError(name)
        return _stub(name)()


def stubbed(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in STUBBED)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `sglang` as a bare package over the source, and the STUBBED names."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path, target=None):
        if name == "sglang" or stubbed(name):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name == "sglang":
            module = types.ModuleType("sglang")
            module.__path__ = [f"{self.root}/sglang"]
            return module
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


@dataclass(frozen=True)
class Loaded:
    source: Source
    modules: dict[str, types.ModuleType]
    family: str  # a key of FAMILIES: the cache class driven

    def attr(self, module: str, name: str):
        return getattr(self.modules[module], name)

    @property
    def cache_class(self) -> type:
        module, cls, _ = FAMILIES[self.family]
        return self.attr(module, cls)


def load(source: Source) -> Loaded:
    """Imports the decision path from `source` (module docstring); LoadError when a module
    fails, is a stub, comes from elsewhere, or no cache class has what FAMILIES names."""
    if "sglang" in sys.modules:
        raise LoadError("an sglang is already imported in this process (one per process)")
    import torch.utils.flop_counter  # noqa: F401  (before triton is a stub: torch probes it)
    sys.meta_path.insert(0, _Finder(source.root))
    real_compile, torch.compile = torch.compile, _passthrough_compile
    try:
        with warnings.catch_warnings():  # "Only CUDA ... supports AWQ" and its kind
            warnings.simplefilter("ignore")
            modules = {name: _import(name, source) for name in DECISION_PATH}
            if importlib.util.find_spec(HIRADIX) is not None:
                modules[HIRADIX] = _import(HIRADIX, source)
    finally:
        torch.compile = real_compile
    return Loaded(source, modules, _family(source, modules))


def unload() -> None:
    """Takes SGLang and the stub modules out of this process again (the finder, and every
    `sglang*` and STUBBED module), so what runs next here (the report's matplotlib, which
    probes IPython) sees the real world; objects still holding them keep working."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")
                 or stubbed(n)]:
        del sys.modules[name]


def _family(source: Source, modules: dict[str, types.ModuleType]) -> str:
    missing = []
    for family, (module, cls, names) in FAMILIES.items():
        found = getattr(modules.get(module), cls, None)
        lacking = [n for n in names if not hasattr(found, n)]
        if not lacking:
            return family
        missing.append(f"{module.rsplit('.', 1)[-1]}.{cls}.{lacking[0]}")
    raise LoadError(f"sglang {source.label}: cannot drive it, missing "
                    f"{' and '.join(missing)}; supported: {', '.join(SUPPORTED)}")


def _passthrough_compile(fn=None, **kwargs):
    return fn if fn is not None else (lambda f: f)


def _import(name: str, source: Source) -> types.ModuleType:
    assert not stubbed(name), f"{name} is on the decision path and must never be a stub"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name in DEPS:  # a new user's venv: say the command that fixes it
            raise LoadError(f"sglang {source.label}: SGLang's cache path imports "
                            f"{', '.join(DEPS)} whole and this Python lacks {e.name}: run "
                            f"`make sglang-fetch` (or pip install {' '.join(DEPS)})") from e
        raise _failed(name, source, e) from e
    except Exception as e:  # any failure of a decision module is the user's one line
        raise _failed(name, source, e) from e
    origin = getattr(module, "__file__", None) or ""
    if isinstance(module, StubModule) or not origin.startswith(source.root):
        raise LoadError(f"sglang {source.label}: {name} did not come from {source.root}")
    return module


def _failed(name: str, source: Source, e: Exception) -> LoadError:
    return LoadError(f"sglang {source.label}: {name} does not import whole "
                     f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                     f"supported: {', '.join(SUPPORTED)}")


NATIVE_HASH = "sglang.srt.mem_cache.cpp_utils.native_hash"


def native_hash(source: Source, cache_dir: str) -> None:
    """Builds SGLang's own page-hash extension (`cpp_utils/hash_binding.cpp`, which names
    every storage page: `get_storage_hash_str`) with SGLang's own loader
    (`native_hash._load_native_hash_module`, its flags, torch's JIT build, cached in torch's
    extension folder). A wheel read as a zip (where it could not be unpacked,
    sglang_adapter.source) holds a source the compiler cannot read: it is copied out to
    `cache_dir` first and the loader pointed at the copy for that one call. LoadError (one
    line) when it cannot be built."""
    import hashlib
    import os
    import shutil
    import zipfile

    module = importlib.import_module(NATIVE_HASH)
    origin = module.__file__
    if source.root.endswith(".whl"):
        folder = os.path.join(cache_dir, f"native-{os.path.basename(source.root)}")
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, "hash_binding.cpp")
        if not os.path.exists(target):
            with zipfile.ZipFile(source.root) as wheel, \
                    wheel.open("sglang/srt/mem_cache/cpp_utils/hash_binding.cpp") as src, \
                    open(target + ".part", "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(target + ".part", target)
        module.__file__ = os.path.join(folder, "native_hash.py")
    # One build folder per source: torch names the build by the extension's name alone, so
    # two sources (a wheel and a planted tree, two checkouts) would rebuild one folder in
    # turn, and SGLang's loader clears a build it takes for stale while another process
    # loads it. Scoped to this call: nothing else this process builds moves.
    before = os.environ.get("TORCH_EXTENSIONS_DIR")
    from torch.utils.cpp_extension import get_default_build_root

    key = hashlib.sha1(os.path.dirname(os.path.abspath(module.__file__)).encode()).hexdigest()
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(before or get_default_build_root(),
                                                      f"hicache-{key[:12]}")
    try:
        module._load_native_hash_module()
    except Exception as e:
        cause = e.__cause__ or e
        raise LoadError(f"sglang {source.label}: its page-hash extension does not build "
                        f"({type(cause).__name__}: {str(cause).splitlines()[0][:160]})") from e
    finally:
        module.__file__ = origin
        if before is None:
            os.environ.pop("TORCH_EXTENSIONS_DIR", None)
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = before
