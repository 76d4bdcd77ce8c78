#!/usr/bin/env python3
"""Summarises bench/gpu/ncu_step.sh's CSV: time per kernel name (calls, total, mean), the step's
total, and the kernels in launch order between two launches (--from / --count) to read one layer."""
import argparse
import collections
import csv
import re
import signal


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    return name.replace("di::", "").replace("cuda::", "")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--from", dest="first", type=int, default=-1, help="first launch to list in order")
    ap.add_argument("--count", type=int, default=60)
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    rows = [r for r in rows if r.get("gpu__time_duration.sum", "").replace(".", "").replace(",", "").isdigit()]
    unit = 1e-3  # ns -> us
    by = collections.OrderedDict()
    total = 0.0
    for r in rows:
        t = float(r["gpu__time_duration.sum"].replace(",", "")) * unit
        k = short(r["Kernel Name"])
        c, s = by.get(k, (0, 0.0))
        by[k] = (c + 1, s + t)
        total += t
    print(f"{len(rows)} kernels, {total:.1f} us")
    for k, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{s:10.1f} us {c:5d} x {s / c:8.2f} us  {k[:110]}")
    if a.first >= 0:
        for i, r in enumerate(rows[a.first:a.first + a.count]):
            t = float(r["gpu__time_duration.sum"].replace(",", "")) * unit
            grid = r.get("launch__grid_size", "")
            print(f"{a.first + i:5d} {t:8.2f} us  {short(r['Kernel Name'])[:100]}  grid {grid}")


if __name__ == "__main__":
    main()
