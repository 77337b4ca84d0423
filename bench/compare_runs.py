#!/usr/bin/env python3
"""Compares `kjit bench` reports of two builds taken in alternating rounds
(scripts/gpu/bench-ab.sh).

    python3 bench/compare_runs.py ab/            # a folder of BENCH-INDEX-{base,head}-ROUND.json
    python3 bench/compare_runs.py ab/ --json summary.json --limit 1.0

For each problem (op, shape, dtype, pass, config) it takes each round's median time, then the median
over the rounds for each build, and prints head / base with the spread of the rounds (min-max), and
whether the two builds' round medians overlap at all. A problem whose ratio is outside 1 +/- limit%
is marked; the exit status is 1 when any is.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"(?P<bench>[^/]+)-(?P<build>base|head)-(?P<round>\d+)\.json$")


def load(folder):
    """{(bench, problem key): {build: [round medians]}} and the devices seen."""
    times, devices = {}, set()
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        m = NAME.search(path)
        if not m:
            continue
        with open(path) as f:
            report = json.load(f)
        devices.add(report.get("device", "?"))
        for r in report["results"]:
            # impl tells the lm_head report's rows apart (fused, gemms, unfused, ...) of one shape
            key = (m["bench"], r["op"], r["shape"], r["dtype"], r["pass"], r.get("config", ""),
                   r.get("impl", ""))
            times.setdefault(key, {}).setdefault(m["build"], []).append(r["median_us"])
    return times, devices


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the folder of reports")
    p.add_argument("--limit", type=float, default=1.0, help="percent off 1.0 that is marked")
    p.add_argument("--json", help="also write the summary here")
    a = p.parse_args()
    times, devices = load(a.folder)
    if not times:
        sys.exit(f"no BENCH-INDEX-{{base,head}}-ROUND.json reports under {a.folder}")
    rows, outside = [], 0
    print(f"device: {', '.join(sorted(devices))}")
    print(f"{'problem':<62} {'base us':>9} {'head us':>9} {'head/base':>9}  rounds (base | head)")
    # A row's config is named where one problem was measured under several (the lm_head's
    # heuristic and fixed-chunk rows).
    configs = {}
    for key in times:
        configs.setdefault(key[1:5] + key[6:], set()).add(key[5])
    for key, by_build in sorted(times.items()):
        if "base" not in by_build or "head" not in by_build:
            print(f"{' '.join(key[1:5])}: only {', '.join(by_build)} measured")
            continue
        base, head = by_build["base"], by_build["head"]
        b, h = statistics.median(base), statistics.median(head)
        ratio = h / b
        overlap = min(head) <= max(base) and min(base) <= max(head)
        flag = abs(ratio - 1) * 100 > a.limit
        outside += flag
        name = f"{key[1]} {key[2]} {key[3]} {key[4]}" + (f" {key[6]}" if key[6] else "")
        if len(configs[key[1:5] + key[6:]]) > 1:
            name += f" ({key[5]})"
        print(f"{name:<62} {b:9.2f} {h:9.2f} {ratio:9.4f}{' *' if flag else '  '}"
              f" {min(base):.2f}-{max(base):.2f} | {min(head):.2f}-{max(head):.2f}"
              f"{'' if overlap else ' (no overlap)'}")
        rows.append({"op": key[1], "shape": key[2], "dtype": key[3], "pass": key[4],
                     "config": key[5], "impl": key[6], "base_rounds_us": base, "head_rounds_us": head,
                     "base_us": b, "head_us": h, "head_over_base": ratio,
                     "rounds_overlap": overlap})
    print(f"{outside} of {len(rows)} problems outside 1 +/- {a.limit}% (marked *)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"devices": sorted(devices), "limit_percent": a.limit, "problems": rows}, f,
                      indent=1)
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
