"""hazards.csv, hazards.md and hazards.png of a `bench hazards` run, from the same rows."""

from __future__ import annotations

from pathlib import Path

from bench.hazards.classify import (
    ABORT,
    CORRUPT,
    DEADLOCK,
    DIVERGENCE,
    FAILED,
    HARNESS,
    LIVELOCK,
    OK,
    REFUSED,
)
from bench.hazards.scenarios import SCENARIOS
from bench.hazards.side_changes import change_table, changed_first
from bench.rundir.files import write_csv_atomic, write_text_atomic
from bench.rundir.rundir import RunDir

COLUMNS = ["scenario", "issue", "protocol", "policy", "tp", "pp", "seed", "outcome", "site",
           "step", "named_s", "decision_per_poll", "collectives_per_step", "polls_per_step",
           "ring_per_step", "steps", "same_twice", "sglang_consensus", "consensus_detail",
           "exit_codes", "wall_s", "collective_timeout_s", "detail", "cell_dir"]
COLOURS = {OK: "#4c9a2a", DEADLOCK: "#c0392b", ABORT: "#7b241c", DIVERGENCE: "#e67e22",
           CORRUPT: "#8e44ad",
           LIVELOCK: "#2e86c1", FAILED: "#7f8c8d", HARNESS: "#000000", REFUSED: "#bdc3c7"}


def cell_text(row: dict) -> str:
    """One matrix cell: OK with its cost, or the outcome and where it was found."""
    if row["outcome"] == REFUSED:
        return "refused"
    if row["outcome"] == OK:
        ring = row.get("ring_per_step")  # PD prefill's admission ring, where it is on
        return (f"OK {row['decision_per_poll']:g}/poll {row['collectives_per_step']:g}/step"
                + ("" if ring is None else f" + {ring:g} ring/step"))
    where = f" {row['site']}" if row["site"] else ""
    at = f"@{row['step']}" if row["step"] is not None else ""
    return f"**{row['outcome']}**{where}{at}"


def matrix_table(rows: list[dict]) -> list[str]:
    """Markdown: scenarios down, protocols across."""
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    by = {(r["scenario"], r["protocol"]): r for r in rows}
    lines = ["| scenario | " + " | ".join(protocols) + " |",
             "|---|" + "---|" * len(protocols)]
    for s in scenarios:
        cells = [cell_text(by[(s, p)]) if (s, p) in by else "n/a" for p in protocols]
        lines.append(f"| {s} ({SCENARIOS[s].issue}) | " + " | ".join(cells) + " |")
    return lines


def write(out: Path, rows: list[dict], header: list[str], sides: bool = False,
          consensus: bool = False) -> None:
    """`sides`: the rows are several SGLangs' (bench.hazards.side_changes), the cells that changed
    from the first side's come first; `consensus`: SGLang's checker's verdict counts too."""
    write_csv_atomic(RunDir(out).file("hazards"), rows, COLUMNS)
    lead = ["## Changed between the sides", "", *change_table(rows, consensus), "",
            "## Every cell", ""] if sides else []
    lines = _markdown(changed_first(rows, consensus) if sides else rows, header, lead)
    write_text_atomic(out / "hazards.md", "\n".join(lines) + "\n")
    _figure(out / "hazards.png", rows)


def _markdown(rows: list[dict], header: list[str], lead: list[str]) -> list[str]:
    lines = ["# Hazard matrix", "", *header, "", *lead, *matrix_table(rows), "",
             "Cells: OK with decision collectives per poll and the scheduler's agreement "
             "collectives (decision, completion, per-step MIN) per step, on rank 0; otherwise "
             "the outcome, the call site and the step where it was found first.", "",
             "## Scenarios", ""]
    for name in dict.fromkeys(r["scenario"] for r in rows):
        s = SCENARIOS[name]
        lines.append(f"- **{name}** ({s.issue}, TP 2 x PP {s.pp}, {s.policy}): {s.what}")
    lines += ["", "## What each cell found", ""]
    for r in rows:
        if r["outcome"] != OK:
            named = f", named after {r['named_s']} s in the failed collective" \
                if r["named_s"] is not None else ""
            lines.append(f"- {r['scenario']} x {r['protocol']}: {r['outcome']}{named}; "
                         f"{r['detail']} (exit codes {r['exit_codes']})")
    return lines


def _figure(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.3 * len(protocols) + 2, 0.7 * len(scenarios) + 1.6))
    for r in rows:
        x, y = protocols.index(r["protocol"]), scenarios.index(r["scenario"])
        ax.add_patch(plt.Rectangle((x, y), 0.95, 0.9, color=COLOURS[r["outcome"]]))
        label = f"{r['collectives_per_step']:g}/step" if r["outcome"] == OK else r["outcome"]
        ax.text(x + 0.47, y + 0.45, label, ha="center", va="center", color="white", fontsize=7)
    ax.set_xlim(0, len(protocols))
    ax.set_ylim(len(scenarios), 0)
    ax.set_xticks([i + 0.47 for i in range(len(protocols))], protocols, rotation=40, ha="right")
    ax.set_yticks([i + 0.45 for i in range(len(scenarios))],
                  [f"{s} ({SCENARIOS[s].issue})" for s in scenarios])
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()],
              bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=7)
    ax.set_title("Protocols x hazards: outcome (OK: collectives per step, rank 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


HAZARD, HARNESS_FAILED = 1, 3  # exit codes besides 0 (OK) and 2 (bad input)


def past_bound(rows: list[dict]) -> int:
    """Cells the launcher killed at their bound (a rank's exit code `-`)."""
    return sum("-" in str(r.get("exit_codes", "")).split() for r in rows)


def exit_code(rows: list[dict], alike: bool, worse_cells: int) -> tuple[int, str]:
    """(exit code, verdict word) of a run: the harness's failure first (the matrix is not
    whole), then a hazard that fails the run (a hang past a cell's bound, outcomes that
    differ between two runs, a side worse than the reference), else 0. A cell refused
    before serving (REFUSED) is neither: the page names it."""
    if any(r["outcome"] == HARNESS for r in rows):
        return HARNESS_FAILED, "FAILED (harness)"
    if past_bound(rows) or not alike or worse_cells:
        return HAZARD, "FAILED (hazard)"
    return 0, "OK"
