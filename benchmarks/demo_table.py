"""README's demo table, made from a demo run's results/summary/metrics.csv (never typed).

    .venv/bin/python benchmarks/demo_table.py results/summary/metrics.csv            # print it
    .venv/bin/python benchmarks/demo_table.py results/summary/metrics.csv --readme README.md
    .venv/bin/python benchmarks/demo_table.py FULL/metrics.csv --readme README.md \
        --block demo-full-table

With --readme the table between README's `<!-- demo-table -->` and `<!-- /demo-table -->`
lines (or the --block's) is replaced; benchmarks/demo_metrics.csv and demo_full_metrics.csv
keep the metrics.csv each table came from (tests/test_readme.py checks they agree)."""

from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from pathlib import Path


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if abs(value) < 10 else f"{value:.0f}"


def _rejection(t: dict[str, float], name: str) -> str:
    bound = "≥ " if t.get(f"{name}_is_lower_bound") == 1.0 else ""
    return bound + _fmt(t[name]) if name in t else "–"


def demo_table(rows: list[dict[str, str]]) -> str:
    """Markdown: per dataset the runs ranked by the headline metric (macro AUC, mean Dice)."""
    tables: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(dict)
    for r in rows:
        if r["split"] == "test":
            run = tables[(r["domain"], r["dataset"])].setdefault(r["run"], {})
            run[r["metric"]] = float(r["value"])
    out = []
    for (domain, dataset), runs in sorted(tables.items()):
        if domain == "jets":
            signals = sorted({m[len("rej50_"):-len("_vs_QCD")] for t in runs.values()
                              for m in t if re.fullmatch(r"rej50_\w+_vs_QCD", m)})  # fmt: skip
            out += [f"| {dataset} | macro AUC | accuracy | "
                    + " | ".join(f"1/ε_B at ε_S = 50%, {s} vs QCD" for s in signals) + " |",
                    "|---" * (3 + len(signals)) + "|"]  # fmt: skip
            ranked = sorted(runs.items(), key=lambda kv: -kv[1]["auc_macro"])
            for run, t in ranked:
                out.append(f"| `{run}` | {_fmt(t['auc_macro'])} | {_fmt(t['accuracy'])} | "
                           + " | ".join(_rejection(t, f"rej50_{s}_vs_QCD") for s in signals)
                           + " |")  # fmt: skip
            base = next(iter(ranked))[1]
            if "baseline_jet_mass_auc_macro" in base:
                out.append(f"| soft-drop mass alone (reference) | "
                           f"{_fmt(base['baseline_jet_mass_auc_macro'])} | "
                           f"{_fmt(base['baseline_jet_mass_accuracy'])} | "
                           + " | ".join("–" for _ in signals) + " |")  # fmt: skip
        else:
            labels = sorted({m[len("dice_"):] for t in runs.values() for m in t
                             if m.startswith("dice_") and m != "dice_mean"})  # fmt: skip
            out += [f"| {dataset} | mean Dice | " + " | ".join(f"Dice {x}" for x in labels)
                    + " | mean HD95 (mm) |", "|---" * (3 + len(labels)) + "|"]  # fmt: skip
            for run, t in sorted(runs.items(), key=lambda kv: -kv[1]["dice_mean"]):
                out.append(f"| `{run}` | {_fmt(t['dice_mean'])} | "
                           + " | ".join(_fmt(t[f"dice_{x}"]) for x in labels)
                           + f" | {_fmt(t['hd95_mean'], 2)} |")  # fmt: skip
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def replace_block(text: str, table: str, block: str = "demo-table") -> str:
    """`text` with the part between the block's markers replaced by `table`."""
    start, end = f"<!-- {block} -->", f"<!-- /{block} -->"
    if start not in text or end not in text:
        raise SystemExit(f"no {start} … {end} block to replace")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}{end}{tail}"


def main() -> None:
    """Print the table, or write it into README."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", help="a demo run's results/summary/metrics.csv")
    p.add_argument("--readme", default=None, help="write the table into this README")
    p.add_argument("--block", default="demo-table", help="which marked block of README")
    a = p.parse_args()
    with open(a.metrics, newline="") as f:
        table = demo_table(list(csv.DictReader(f)))
    if a.readme:
        path = Path(a.readme)
        path.write_text(replace_block(path.read_text(), table, a.block))
    else:
        print(table, end="")


if __name__ == "__main__":
    main()
