#!/usr/bin/env python3
"""Turn criterion's estimates from `cargo bench --bench limiter` (and, if run,
`--bench clock`) into markdown tables with ratios.

Usage: python3 benches/table.py [target/criterion]

Times are criterion's median estimate per iteration. In the 2-thread groups one
iteration is one check on each thread, so aggregate throughput = 2 / time.
"""

import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"


def load():
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            meta = json.load(f)
        with open(os.path.join(dirpath, "estimates.json")) as f:
            est = json.load(f)
        found[(meta["group_id"], meta["function_id"])] = est["median"]["point_estimate"]
    return found


def threads(group):
    return 2 if group.startswith("2t_") else 1


def main():
    est = load()
    if not est:
        sys.exit(f"no criterion results under {root}")

    targets = {
        "1t_hot_key_allowed": "≤ 0.5",
        "1t_100k_keys_allowed": "≤ 0.6",
    }
    groups = sorted({g for g, _ in est if g[:3] in ("1t_", "2t_")},
                    key=lambda g: (g[:2], g))
    if groups:
        print("| workload | threads | ours ns/iter | ours_tokio ns/iter | governor ns/iter"
              " | ours Mchecks/s | governor Mchecks/s | ours / governor | ours_tokio / governor"
              " | target |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for g in groups:
            o, oc, gv = (est.get((g, f)) for f in ("ours", "ours_tokio", "governor"))
            if o is None or gv is None:
                continue
            t = threads(g)
            oc_s = f"{oc:.1f}" if oc else "–"
            oc_r = f"{oc / gv:.2f}×" if oc else "–"
            print(f"| {g} | {t} | {o:.1f} | {oc_s} | {gv:.1f} | {t * 1e3 / o:.2f} | "
                  f"{t * 1e3 / gv:.2f} | {o / gv:.2f}× | {oc_r} | {targets.get(g, '')} |")
        print()
        pairs = [("2t_own_key_allowed", "1t_hot_key_allowed"),
                 ("2t_own_50k_keys_allowed", "1t_100k_keys_allowed"),
                 ("2t_one_key_allowed", "1t_hot_key_allowed"),
                 ("2t_one_key_denied", "1t_hot_key_denied")]
        print("| 2-thread / 1-thread throughput | ours | ours_tokio | governor |")
        print("|---|---|---|---|")
        for two, one in pairs:
            row = []
            for who in ("ours", "ours_tokio", "governor"):
                t2, t1 = est.get((two, who)), est.get((one, who))
                row.append(f"{2 * t1 / t2:.2f}×" if t1 and t2 else "–")
            print(f"| {two} vs {one} | " + " | ".join(row) + " |")
        print()

    for prefix in ("clock_read", "check_hot_key_by_clock"):
        rows = sorted((f, v) for (g, f), v in est.items() if g == prefix)
        if rows:
            print(f"| {prefix} | ns |")
            print("|---|---|")
            for f, v in rows:
                print(f"| {f} | {v:.1f} |")
            print()


main()
