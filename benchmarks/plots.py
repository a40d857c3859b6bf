"""The chart the serving and timing benchmarks draw: one bar per series in each group, its
height the median of the rounds, each round a dot on it.

Imported by the benchmarks beside it (``from plots import rounds_chart``: a script's own
directory is first on ``sys.path`` when Python runs it).
"""
import statistics

from ppvarlen.utils.io import atomic_save_png


def rounds_chart(path, groups, series, values, ylabel, title):
    """``groups``: [(key, x label)]; ``series``: [(key, legend label)]; ``values(series_key,
    group_key)`` -> the rounds' values (a series without values in a group draws nothing
    there).  Written atomically as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        labelled = False
        for j, (group, _) in enumerate(groups):
            got = values(key, group)
            if not got:
                continue
            ax.scatter([j + i * width] * len(got), got, color=f"C{i}", zorder=3)
            ax.bar(j + i * width, statistics.median(got), width, color=f"C{i}", alpha=0.5,
                   label=None if labelled else label)
            labelled = True
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(groups))],
                  [label for _, label in groups])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    atomic_save_png(fig, path, dpi=110)
