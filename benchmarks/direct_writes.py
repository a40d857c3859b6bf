"""What writing a store's rows costs through the page cache and past it (``O_DIRECT``).

    python benchmarks/direct_writes.py --dir ~/.cache/ppvarlen --mb 600 --rounds 3 --out /tmp/dw

Writes ``--mb`` of bytes to a new file in ``--dir`` with ``utils.io.DirectAppender`` (O_DIRECT
where the file system takes it) and with plain buffered writes, alternating, and times each:
wall seconds, this process's user and kernel CPU, and the fsync.  Each file is removed after
its round and the next write waits ``--pause`` seconds, as a build's writes follow other work:
on a VM whose host takes back freed guest memory, a page freed a moment ago is cheap to fill
again and one freed long ago is not (``--pause 0`` shows the cheap case).  Prints the ratios;
writes OUT.json and OUT.png.  Never a CI gate.
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from machine import machine
from ppvarlen.utils.io import DirectAppender, atomic_save_png

PIECE = 4 << 20  # a pass-2 job's rows: a few MB at a time, as the store writer gets them


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def write_buffered(path, data):
    with open(path, "wb") as f:
        for at in range(0, len(data), PIECE):
            f.write(data[at:at + PIECE])
        f.flush()
        synced = time.perf_counter()
        os.fsync(f.fileno())
    return synced


def write_direct(path, data):
    out = DirectAppender(path)
    for at in range(0, len(data), PIECE):
        out.write(data[at:at + PIECE])
    synced = time.perf_counter()
    out.close()  # the last block, then fsync
    return synced, out.direct


def measure(kind, path, data):
    cpu0, start = _cpu(), time.perf_counter()
    direct = False
    if kind == "buffered":
        synced = write_buffered(path, data)
    else:
        synced, direct = write_direct(path, data)
    end, cpu1 = time.perf_counter(), _cpu()
    os.remove(path)
    return {"kind": kind, "o_direct_used": direct, "wall_s": round(end - start, 3),
            "fsync_s": round(end - synced, 3), "user_s": round(cpu1[0] - cpu0[0], 3),
            "kernel_s": round(cpu1[1] - cpu0[1], 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="a directory on the disk the stores go to")
    ap.add_argument("--mb", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=5.0, help="seconds between writes")
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.png")
    args = ap.parse_args(argv)
    data = memoryview(np.random.default_rng(0).integers(0, 256, args.mb << 20, np.uint8)).cast("B")
    path = os.path.join(args.dir, f".direct_writes_{os.getpid()}.bin")
    runs = []
    for r in range(args.rounds):
        for kind in (("buffered", "direct") if r % 2 == 0 else ("direct", "buffered")):
            time.sleep(args.pause)
            runs.append({"round": r, **measure(kind, path, data)})
            print(json.dumps(runs[-1]))
    med = {k: {m: float(np.median([x[m] for x in runs if x["kind"] == k]))
               for m in ("wall_s", "kernel_s", "fsync_s")} for k in ("buffered", "direct")}
    ratio = {m: round(med["buffered"][m] / max(med["direct"][m], 1e-3), 1)
             for m in ("wall_s", "kernel_s")}
    print(f"{args.mb} MB, medians: buffered {med['buffered']['wall_s']:.2f} s wall / "
          f"{med['buffered']['kernel_s']:.2f} s kernel CPU; direct {med['direct']['wall_s']:.2f} s "
          f"/ {med['direct']['kernel_s']:.2f} s (buffered / direct: wall {ratio['wall_s']}x, "
          f"kernel {ratio['kernel_s']}x)")
    report = {"command": " ".join(sys.argv), "machine": machine(), "mb": args.mb,
              "pause_s": args.pause, "dir": args.dir, "runs": runs, "medians": med,
              "buffered_over_direct": ratio}
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for k, kind in enumerate(("buffered", "direct")):
        xs = [x for x in runs if x["kind"] == kind]
        ax.bar([k - 0.2], [med[kind]["wall_s"]], width=0.35, color="tab:blue",
               label="wall" if k == 0 else None)
        ax.bar([k + 0.2], [med[kind]["kernel_s"]], width=0.35, color="tab:orange",
               label="kernel CPU" if k == 0 else None)
        ax.scatter([k - 0.2] * len(xs), [x["wall_s"] for x in xs], color="k", s=8, zorder=3)
        ax.scatter([k + 0.2] * len(xs), [x["kernel_s"] for x in xs], color="k", s=8, zorder=3)
    ax.set_xticks([0, 1], ["buffered (page cache)", "DirectAppender"])
    ax.set_ylabel("seconds (median, dots: runs)")
    ax.set_title(f"writing {args.mb} MB, {machine()['cpu_model']}")
    ax.legend()
    fig.tight_layout()
    atomic_save_png(fig, args.out + ".png", dpi=100)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
