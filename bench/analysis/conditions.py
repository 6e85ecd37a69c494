"""What a run's timings were measured under, said beside the headline: its stages (a run
staged to resolve), the serve design (serial or duet), the planted noisy neighbour
(env.json), and c beside the cells against the c measured before them (calibration.json's
`beside`, bench.run.calibrate)."""

from __future__ import annotations


def condition_lines(env: dict | None, calib: dict | None) -> list[str]:
    return [x for x in (stage_line(env), pairing_line(env), neighbour_line(env),
                        beside_line(calib)) if x]


def stage_line(env: dict | None) -> str | None:
    """A run staged to resolve (env.json `stages`: bench.ab.protocols): its target,
    budget and stages; None for a run of one stage."""
    stages = (env or {}).get("stages")
    if not stages:
        return None
    plan = env.get("plan") or {}
    each = ", ".join(f"{s['repeats']} on seed {s['seed']}" for s in stages)
    return (f"Staged to resolve {plan.get('resolve') or 0:.1%} on the headline's p50s "
            f"(no stage started after {plan.get('budget_s') or 0:.0f} s, at most "
            f"{plan.get('budget_repeats')} repeats): {len(stages)} stage(s), repeats {each}; "
            f"{sum(s['repeats'] for s in stages)} repeats in "
            f"{sum(s['seconds'] for s in stages):.0f} s.")


def pairing_line(env: dict | None) -> str | None:
    plan = (env or {}).get("plan") or {}
    if plan.get("pairing") != "duet":
        return None
    return ("Duet: the protocols of each repeat served at the same time, each on ranks of "
            "its own (each ratio pairs serves that ran together; absolute times are of "
            "sides sharing the cores).")


def neighbour_line(env: dict | None) -> str | None:
    n = (env or {}).get("neighbour")
    if not n:
        return None
    took = "" if n.get("cpu_s") is None else \
        f"; it took {n['cpu_s']:.1f} CPU s in {n['wall_s']:.0f} s ({n['cpu_share_measured']:.2f} " \
        f"of a core)"
    return f"Planted neighbour: {n['spec']}{took}."


def beside_line(calib: dict | None) -> str | None:
    b = (calib or {}).get("beside") or {}
    if not b.get("c_ms"):
        return None
    line = (f"c beside the cells: {b['c_ms']:.3f} ms [{b['c_ci_low_ms']:.3f}, "
            f"{b['c_ci_high_ms']:.3f}] (median of {b['cells']} cells' means; their p10-p90 "
            f"{b['cell_mean_p10_ms']:.3f}-{b['cell_mean_p90_ms']:.3f} ms, pooled p25 "
            f"{b['p25_ms']:.3f}, p50 {b['p50_ms']:.3f} ms)")
    if b.get("upfront_differs"):
        return (f"{line}: the c the model used ({b['upfront_mean_ms']:.3f} ms, before the "
                f"cells) DIFFERS from it; its band is off by the ratio of the two.")
    if "upfront_mean_ms" in b:
        return f"{line}: the c before the cells ({b['upfront_mean_ms']:.3f} ms) agrees."
    return line + "."
