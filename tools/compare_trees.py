"""Compare two source trees of horo with its own benches, interleaved on one machine.

    python tools/compare_trees.py OLD/src NEW/src [--rounds 4] [--np 2] [--out DIR] [--benches allreduce,fusion]
                                  [--allreduce-args "--sizes 4B..64MiB"] [--fusion-args "--repeats 15"]

Each round runs every bench once per tree, in the order old, new, new, old, ... (ABBA, so a drift of the
machine during the run weighs on both trees alike), each as ``hororun -np N python -m horo.bench NAME
--json FILE`` with ``PYTHONPATH`` set to the tree's ``src``. Every run yields horo's paired ratio against its
raw-MPI baseline in that same run (the median over repeats of horo's time / the baseline's in the same
repeat), so the machine's state between runs cancels out; per round, new / old of that ratio is the verdict
(> 1: the new tree is slower), and the table shows its median and range over the rounds for every size and
variant (``allreduce``) and every variant (``fusion``, the ResNet-50 gradient set).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from horo.bench._util import Timing, fmt_size, md_table  # noqa: E402 - after the path above

#: variant -> its baselines, as each bench pairs them
PAIRS = {
    "allreduce": {"horo": ("raw",), "horo_": ("raw_",), "async": ("raw_",)},
    "fusion": {"engine": ("raw-per-tensor", "raw-one-buffer"), "engine-rev": ("raw-per-tensor", "raw-one-buffer"),
               "grouped_": ("raw-per-tensor", "raw-one-buffer"), "grouped": ("raw-per-tensor",),
               "engine-oop": ("raw-per-tensor",)},
}
EXTRA = {"allreduce": [], "fusion": ["--no-gloo", "--no-latency"]}


def run(bench: str, src: Path, out: Path, np_: int, extra: list[str]) -> dict[str, dict[str, float]]:
    """One bench run on tree ``src``; returns {case: {variant: paired ratio x / baseline}}."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    hororun = Path(sys.executable).with_name("hororun")
    cmd = [str(hororun), "-np", str(np_), sys.executable, "-m", "horo.bench", bench, "--json", str(out), *extra,
           *EXTRA[bench]]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    data = json.loads(out.read_text())
    cases = ([(fmt_size(r["bytes"]), r["samples_s"]) for r in data["results"]] if bench == "allreduce"
             else [("ResNet-50 set", data["samples_s"])])
    ratios: dict[str, dict[str, float]] = {}
    for case, samples in cases:
        timing = Timing(samples)
        ratios[case] = {v: timing.paired(v, *bases) for v, bases in PAIRS[bench].items()
                        if v in samples and all(b in samples for b in bases)}
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path, help="the old tree's src folder")
    p.add_argument("new", type=Path, help="the new tree's src folder")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--benches", default="allreduce,fusion")
    p.add_argument("--out", type=Path, default=Path("compare-trees"))
    p.add_argument("--allreduce-args", default="", help="more arguments for the allreduce bench (one string)")
    p.add_argument("--fusion-args", default="", help="more arguments for the fusion bench (one string)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    verdict = 0
    for bench in args.benches.split(","):
        got: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                print(f"{bench}: round {r + 1}/{args.rounds}, {which} tree", file=sys.stderr, flush=True)
                extra = shlex.split(getattr(args, f"{bench}_args"))
                got[which].append(run(bench, trees[which], args.out / f"{bench}-{which}-{r}.json", args.np, extra))
        rows = []
        for case in got["old"][0]:
            for variant in got["old"][0][case]:
                olds = [g[case][variant] for g in got["old"]]
                news = [g[case][variant] for g in got["new"]]
                q = [n / o for n, o in zip(news, olds)]
                med = statistics.median(q)
                ok = abs(med - 1) <= 0.03
                verdict |= not ok
                rows.append([case, variant, f"{statistics.median(olds):.3f}", f"{statistics.median(news):.3f}",
                             f"{med:.3f}", f"{min(q):.3f}-{max(q):.3f}", "within 3 %" if ok else "OUTSIDE 3 %"])
        print(f"\n## {bench}: x / raw baseline (paired), {args.rounds} rounds at {args.np} ranks\n")
        print(md_table(["case", "variant", "old x/raw", "new x/raw", "new/old (median)", "new/old range", "verdict"],
                       rows, align="llrrrrl"))
    return verdict


if __name__ == "__main__":
    sys.exit(main())
