#!/usr/bin/env python3
"""Summarise a kernel timeline written by a -DDSV32_TIMELINE build (docs/GPU.md, "Timeline").

Usage: tools/timeline.py FILE.csv

One row per launch, in order of its first block's start: when its first block became resident
(it may sit at its programmatic-dependency wait), when its first and last blocks started work,
its grid and block size, and how many SMs ran it. Times in microseconds from the step's first
block. cuBLAS kernels are not recorded (only the stack's own kernels call the recording wait).
"""
import collections
import csv
import sys


def main(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit(f"{path}: no records")
    launches = collections.defaultdict(list)
    for r in rows:
        launches[int(r["grid"])].append(r)
    t0 = min(int(r["resident"]) for r in rows)
    table = []
    for recs in launches.values():
        starts = [int(r["start"]) for r in recs]
        table.append((min(starts), min(int(r["resident"]) for r in recs), max(starts),
                      recs[0]["blocks"], recs[0]["threads"], len(recs),
                      len({r["sm"] for r in recs})))
    table.sort()
    print(f"{'resident':>9} {'start':>8} {'last':>8} {'blocks':>7} {'threads':>7} {'seen':>5} {'SMs':>4}")
    for first, resident, last, blocks, threads, seen, sms in table:
        print(f"{(resident - t0) / 1e3:9.1f} {(first - t0) / 1e3:8.1f} {(last - t0) / 1e3:8.1f} "
              f"{blocks:>7} {threads:>7} {seen:5d} {sms:4d}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
