"""Several SGLangs in one run (`--sglang base=0.5.23,pr=~/sglang-pr/python`): the list
parsed, each SPEC resolved as `--sglang SPEC` is (sglang_adapter.target), and every side put
on one data path, before any rank starts.

Each side is a protocol row of the run: its name (the protocol column) is `LABEL=` before
its SGLang's own name (`base=sglang-0.5.23@unified`), or that name alone when unlabelled;
the first side is the reference. Two sides never share an interpreter (their modules
would meet under one name, `sglang`): each serves on rank processes of its own
(bench.run.sglang_worlds).
"""

from __future__ import annotations

import re
from dataclasses import replace

from sglang_adapter.source import SourceError, resolve
from sglang_adapter.target import ChoiceError, Target, choose_for_run

LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")  # no '=', '@', ',' or ':' in a label


def parse(text: str) -> list[tuple[str | None, str]]:
    """[(label or None, SPEC)] of `--sglang SPEC[,SPEC...]`, each SPEC optionally
    `LABEL=SPEC`; ChoiceError (one line) for an empty item, a label with no SPEC, a bad or
    repeated label."""
    sides = []
    for item in text.split(","):
        label, sep, spec = item.strip().partition("=") if "=" in item else ("", "", item)
        label, spec = label.strip(), spec.strip()
        if sep and not label:
            raise ChoiceError(f"--sglang {item.strip()!r}: a label before '=' (LABEL=SPEC)")
        if not spec:
            raise ChoiceError(f"--sglang {item.strip() or text!r}: "
                              + (f"label {label!r} has no SPEC (LABEL=SPEC)" if label
                                 else "an empty SPEC in the list"))
        if sep and not LABEL.match(label):
            raise ChoiceError(f"--sglang {item.strip()!r}: a label is a letter, then letters, "
                              "digits, '_', '.' or '-'")
        sides.append((label or None, spec))
    labels = [label for label, _ in sides if label]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ChoiceError(f"--sglang: label {repeated[0]!r} names two sides")
    return sides


def is_list(text: str | None) -> bool:
    """Whether `--sglang` names sides (a list or a label) rather than one SGLang."""
    return bool(text) and ("," in text or "=" in text)


def choose_sides(spec: str, protocols_given: bool, pairing_given: bool, path: str | None,
                 pp: int, system: dict) -> tuple[Target, ...]:
    """Every side's Target, on one path: where one side cannot take SGLang's controller
    path every side takes the decisions path (never a controller-path side against a
    decisions-path one); under `--sglang-path controller` a side that cannot is an error.
    ChoiceError (one line) for any side that cannot be had or driven, two sides of one
    name, or --protocols / --pairing (each side runs its own protocol)."""
    if protocols_given or pairing_given:
        raise ChoiceError("--cache sglang runs each side's own protocol: no --protocols"
                          f"{' or --pairing' if pairing_given else ''}")
    sides = parse(spec)
    for label, one in sides:  # every SPEC found (fast) before any SGLang is imported
        try:
            resolve(one)
        except SourceError as e:
            raise ChoiceError(f"{e} (side {label or one})") from None
    targets = []
    for label, one in sides:
        try:
            target = choose_for_run("sglang", one, False, False, path, pp, system)
        except ChoiceError as e:
            raise ChoiceError(f"{e} (side {label or one})") from None
        targets.append(replace(target, side=label))
    names = [t.name for t in targets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ChoiceError(f"--sglang: two sides are both {twice[0]}; label them "
                          "(a=SPEC,b=SPEC) for an A/A")
    controller = all(t.controller for t in targets)
    return tuple(replace(t, controller=controller) for t in targets)


__all__ = ["ChoiceError", "choose_sides", "is_list", "parse"]
