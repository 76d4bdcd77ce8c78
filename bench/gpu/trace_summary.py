#!/usr/bin/env python3
"""Summarises `deepinfer bench --kernel-trace FILE` (one decode step's kernels as the device ran them):
per (context, batch) the step's span, and per stream the time each kernel name adds to its stream --
its end minus the previous kernel's end on that stream (under PDL a kernel starts before the one it
waits for ends, so durations overlap) -- beside the kernels' own durations; --list prints the kernels
in start order with that interval."""
import argparse
import collections
import csv
import re
import signal


def short(name):
    """The kernel's name and template arguments, without namespaces, `void` or parameters."""
    n = name.replace("(anonymous namespace)::", "").replace("di::", "").replace("cuda::", "")
    n = re.sub(r"^void ", "", n)
    m = re.match(r"[\w:]+(<[^()]*>)?", n)
    return m.group(0) if m else n[:60]


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--list", action="store_true", help="every kernel in start order")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    steps = collections.OrderedDict()
    for r in csv.DictReader(open(a.csv)):
        steps.setdefault((r["context"], r["batch"]), []).append(r)
    for (ctx, batch), rows in steps.items():
        rows.sort(key=lambda r: float(r["start_us"]))
        span = max(float(r["end_us"]) for r in rows) - float(rows[0]["start_us"])
        per_stream = collections.Counter(r["stream"] for r in rows)
        print(f"context {ctx}, batch {batch}: {len(rows)} kernels, span {span:.1f} us, streams {dict(per_stream)}")
        last_end = {}
        by = {}
        for r in rows:
            s, e, st = float(r["start_us"]), float(r["end_us"]), r["stream"]
            iv = e - last_end.get(st, s)
            last_end[st] = e
            r["interval"] = iv
            b = by.setdefault((st, short(r["name"])), [0, 0.0, 0.0])
            b[0] += 1
            b[1] += iv
            b[2] += e - s
        for st in per_stream:
            total = sum(v[1] for (s2, _), v in by.items() if s2 == st)
            print(f"  stream {st}: intervals sum {total:.1f} us (calls, interval us, duration us)")
            items = sorted(((k[1], v) for k, v in by.items() if k[0] == st), key=lambda x: -x[1][1])
            for n, (c, iv, du) in items[: a.top]:
                print(f"    {iv:8.1f} {du:8.1f} {c:4d}x  {n}")
        if a.list:
            for r in rows:
                print(f"  {float(r['start_us']):9.2f} {float(r['end_us']) - float(r['start_us']):7.2f} "
                      f"+{r['interval']:7.2f}  s{r['stream']:>3}  {short(r['name'])} ({r['ctas']} CTAs)")


if __name__ == "__main__":
    main()
