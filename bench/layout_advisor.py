"""Is ``--parallel auto`` right? The cost model's predicted step against the measured step of real gloo ranks on
emulated hosts: network namespaces joined by a link shaped with tc, each host's ranks on CPUs of their own.

    python bench/layout_advisor.py [--quick] [--hosts 2] [--ranks-per-host 2] [--preset tiny] [--repeats 3]
        [--steps 8] [--links 1Gbit,10Gbit] [--sweep 100Mbit,300Mbit,3Gbit] [--out results.json]     # as root

What a user's preflight would measure is measured once per link, never per layout: one rank's sustained compute
(a matmul probe at the model's width, every rank at once) and each link's bandwidth and latency (the doctor's
all-reduce benchmark: the ranks of one host over loopback, one rank per host over the shaped link). The cost
model is given those numbers and nothing else.

For each link of ``--links``: the fastest predicted layout of every (dp, tp, pp, ZeRO) the search finds valid
(with the micro-batches, schedule and checkpointing it predicts best for them), each trained ``--steps`` steps
by real ranks (``python -m distlaunch.engine`` in the hosts' namespaces, with the torchrun environment),
``--repeats`` times in rounds. A run's step is rank 0's median step time after the first step, a layout's the
median of its runs. Printed: predicted against measured, the Spearman rank correlation (goal >= 0.8), and the
measured step of the auto choice (the fastest predicted) against the measured best (goal within 10%).

Then the field notes' question: ZeRO-3 across the hosts (dp over every rank) against pipeline stages across the
hosts (one stage per host, dp inside it), measured and predicted at every speed of ``--links`` and ``--sweep``,
and the link bandwidth below which ZeRO-3 loses, by each (interpolated between the speeds, in log scale).

``--quick`` (about a minute): the first link only, the auto choice and the question's two layouts, one run each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from _emulated_hosts import Hosts, emulated_hosts  # noqa: E402  (bench/, the script's own folder)

from distlaunch.cli.layouts_render import short  # noqa: E402
from distlaunch.doctor.bench import RESULT_PREFIX  # noqa: E402
from distlaunch.launcher.planning.rates import parse_bandwidth  # noqa: E402
from distlaunch.launcher.planning.train import parallel_spec  # noqa: E402
from distlaunch.training.config import TrainingConfig, load_config  # noqa: E402
from distlaunch.training.planner.cost import Rates  # noqa: E402
from distlaunch.training.planner.search import LayoutCost, search_layouts  # noqa: E402
from distlaunch.training.presets import model_config  # noqa: E402

RUN_TIMEOUT_S = 600


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: one link, three layouts, one run each")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="per run; its step: the median after the first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every layout; its step: their median")
    parser.add_argument("--links", default="1Gbit,10Gbit", help="link speeds of the full comparison")
    parser.add_argument("--sweep", default="100Mbit,300Mbit,3Gbit", help="more speeds for ZeRO-3 against pp")
    parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.links, args.sweep = 4, 1, args.links.split(",")[0], ""
    return args


# ---- ranks in the emulated hosts


@dataclass
class Cluster:
    """The emulated hosts and how many ranks each runs; every job gets a port of its own."""

    hosts: Hosts
    ranks_per_host: int
    folder: Path
    jobs: int = 0

    @property
    def world_size(self) -> int:
        return len(self.hosts.names) * self.ranks_per_host

    def host_of_rank(self) -> list[int]:
        """Ranks fill the hosts in order, as distlaunch's plan places them (tp fastest, then dp, then pp)."""
        return [rank // self.ranks_per_host for rank in range(self.world_size)]

    def run(self, places: list[int], argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` as one torchrun-style job of a rank on each host of ``places``, every rank at once; their
        outputs (rank 0's first). A rank that fails ends the benchmark."""
        self.jobs += 1
        port, master = 29500 + self.jobs % 20000, self.hosts.address(places[0])
        procs = []
        for rank, host in enumerate(places):
            local = places[:rank].count(host)
            rank_env = {**os.environ, **env, "MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(rank),
                        "WORLD_SIZE": str(len(places)), "LOCAL_RANK": str(local),
                        "LOCAL_WORLD_SIZE": str(places.count(host)), "GLOO_SOCKET_IFNAME": "eth0",
                        "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
            out = self.folder / f"job{self.jobs}-rank{rank}.log"
            with open(out, "w") as sink:
                procs.append((subprocess.Popen(self.hosts.argv(host, argv), env=rank_env, stdout=sink,
                                               stderr=subprocess.STDOUT, start_new_session=True), out))  # fmt: skip
        for proc, out in procs:
            if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
                for other, _ in procs:
                    if other.poll() is None:
                        os.killpg(other.pid, 9)
                raise SystemExit(f"job {self.jobs} failed: {out}:\n{out.read_text()[-3000:]}")
        return [out.read_text() for _, out in procs]


def probe_compute(cluster: Cluster, d_model: int, seconds: float) -> float:
    """One rank's sustained FLOP/s: the matmul probe on every rank's place at once (they share the hosts' CPUs
    as the ranks will), the median of the ranks."""
    argv = [sys.executable, str(REPO / "bench" / "_matmul_probe.py"), "--d-model", str(d_model)]
    outs = cluster.run(cluster.host_of_rank(), [*argv, "--seconds", str(seconds)], {})
    return statistics.median(float(out.strip().splitlines()[-1]) for out in outs)


def probe_link(cluster: Cluster, places: list[int], max_bytes: str) -> tuple[float, float]:
    """(bytes/s, seconds per message) of the link between ``places``: the doctor's all-reduce sweep, its bus
    bandwidth at the largest message and its smallest message's time over the ring's 2(n-1) steps."""
    argv = [sys.executable, "-m", "distlaunch.doctor.allreduce_bench", "--min-bytes", "1K", "--max-bytes", max_bytes]
    out = cluster.run(places, argv, {})[0]
    rows = [json.loads(line[len(RESULT_PREFIX) :]) for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    steps = 2 * (len(places) - 1)
    return rows[-1]["busbw_gbs"] * 1e9, rows[0]["seconds"] / steps


def preflight(cluster: Cluster, d_model: int, quick: bool) -> Rates:
    """The rates a user's preflight would measure: compute once per rank, each link once."""
    flops = probe_compute(cluster, d_model, 1.0 if quick else 2.0)
    size = "4M" if quick else "16M"
    hosts = len(cluster.hosts.names)
    intra = probe_link(cluster, [0] * cluster.ranks_per_host, size) if cluster.ranks_per_host > 1 else (2e9, 5e-5)
    inter = probe_link(cluster, list(range(hosts)), size)
    return Rates(flops=flops, intra_bytes_s=intra[0], inter_bytes_s=inter[0], intra_latency_s=intra[1],
                 inter_latency_s=inter[1])  # fmt: skip


# ---- layouts: predicted and measured


def base_config(args: argparse.Namespace) -> tuple[TrainingConfig, list[str]]:
    sets = [f"model.preset='{args.preset}'", f"train.global_batch_size={args.global_batch_size}",
            f"train.seq_len={args.seq_len}", f"train.steps={args.steps}", "train.micro_batch_size=auto",
            "train.eval_every=0", "train.log_every=1"]  # fmt: skip
    return load_config(None, sets), sets


def predict(cluster: Cluster, cfg: TrainingConfig, rates: Rates) -> list[LayoutCost]:
    """Every valid layout on these hosts, fastest predicted first (memory unlimited: host memory is plenty)."""
    model = model_config(cfg.model.preset, None)
    return search_layouts(model, cfg, cluster.host_of_rank(), "gloo", None, rates, count=10**6).best


def degrees(layout: LayoutCost) -> tuple[int, ...]:
    words = dict(word.split("=") for word in layout.parallel.split(","))
    return tuple(int(words[key]) for key in ("dp", "tp", "pp", "zero"))


def per_degrees(layouts: list[LayoutCost]) -> list[LayoutCost]:
    """The fastest predicted layout of each (dp, tp, pp, ZeRO), fastest first."""
    seen: dict[tuple[int, ...], LayoutCost] = {}
    for layout in layouts:
        seen.setdefault(degrees(layout), layout)
    return list(seen.values())


def key(layout: LayoutCost) -> tuple[str, bool]:
    return layout.parallel, layout.activation_checkpointing


def same(layout: LayoutCost, layouts: list[LayoutCost]) -> LayoutCost:
    """``layout`` as predicted in ``layouts`` (another link's prediction of the same layout)."""
    return next(x for x in layouts if key(x) == key(layout))


def question_layouts(layouts: list[LayoutCost], hosts: int, ranks_per_host: int) -> tuple[LayoutCost, LayoutCost]:
    """ZeRO-3 across the hosts (dp over every rank) and pipeline stages across them (a stage per host, dp inside
    it, the ZeRO stage the model prefers), each as its fastest predicted variant."""
    world = hosts * ranks_per_host
    zero3 = next(x for x in layouts if degrees(x) == (world, 1, 1, 3))
    pipeline = next(x for x in layouts if degrees(x)[:3] == (ranks_per_host, 1, hosts))
    return zero3, pipeline


def measure(cluster: Cluster, layout: LayoutCost, sets: list[str]) -> float:
    """One run of ``layout``: rank 0's median step time after the first step."""
    checkpointing = "true" if layout.activation_checkpointing else "false"
    run_sets = [*sets, f"train.activation_checkpointing={checkpointing}"]
    spec = parallel_spec(load_config(None, run_sets, layout.parallel))  # the engine's own checks, here first
    metrics = cluster.folder / f"metrics{cluster.jobs + 1}.jsonl"
    argv = [
        sys.executable,
        "-m",
        "distlaunch.engine",
        *(f"--set={s}" for s in run_sets),
        "--metrics-file",
        str(metrics),
    ]
    env = {"DISTLAUNCH_PARALLEL": spec, "DISTLAUNCH_BACKEND": "gloo", "DISTLAUNCH_LOSS_CURVE": "0"}
    cluster.run(cluster.host_of_rank(), argv, env)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return statistics.median(r["step_time_s"] for r in rows if r.get("step", 0) > 1 and "step_time_s" in r)


def measure_all(cluster: Cluster, layouts: list[LayoutCost], sets: list[str], repeats: int) -> list[float]:
    """Each layout's median step over ``repeats`` rounds (each round runs every layout once, in a rotated order,
    so that the machine's drift meets every layout alike)."""
    runs: list[list[float]] = [[] for _ in layouts]
    for r in range(repeats):
        order = list(range(len(layouts)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            runs[i].append(measure(cluster, layouts[i], sets))
        print(f"    round {r + 1}/{repeats} done", flush=True)
    return [statistics.median(times) for times in runs]


# ---- statistics


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's of the ranks (NaN under 3 values or with a constant side)."""
    if len(xs) < 3:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else math.nan


def crossings(points: list[tuple[float, float]]) -> list[float]:
    """Every bandwidth at which ZeRO-3's step over the pipeline's (``points``: (bandwidth, ratio), any order)
    passes 1, each interpolated in log-log between the two speeds around it (more than one: the ratio is not
    monotonic in the bandwidth, which is noise)."""
    points = sorted(points)
    found = []
    for (b0, r0), (b1, r1) in itertools.pairwise(points):
        if (r0 - 1) * (r1 - 1) <= 0 and r0 != r1:  # ZeRO-3's ratio passes 1 between these speeds
            t = math.log(r0) / (math.log(r0) - math.log(r1))
            found.append(math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0))))
    return found


def gbit(bytes_s: float) -> str:
    return f"{bytes_s * 8 / 1e9:.3g} Gbit/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


# ---- the comparisons


def show_rates(name: str, rates: Rates) -> None:
    print(
        f"link {name}: preflight: compute {rates.flops / 1e9:.3g} GFLOP/s per rank; between hosts "
        f"{gbit(rates.inter_bytes_s)}, {rates.inter_latency_s * 1e6:.0f} us a message; inside a host "
        f"{gbit(rates.intra_bytes_s)}, {rates.intra_latency_s * 1e6:.0f} us",
        flush=True,
    )


def compare(cluster: Cluster, sets: list[str], layouts: list[LayoutCost], repeats: int) -> dict:
    """``layouts`` (fastest predicted first) measured: the table, the rank correlation, the auto choice's speed."""
    measured = measure_all(cluster, layouts, sets, repeats)
    print(f"  {'layout':<48} {'predicted':>11} {'measured':>11}")
    for i, (layout, seconds) in enumerate(zip(layouts, measured, strict=True), 1):
        print(f"  {i:>2}. {short(layout):<44} {ms(layout.cost.step_s)} {ms(seconds)}")
    rho = spearman([x.cost.step_s for x in layouts], measured)
    best = min(range(len(layouts)), key=measured.__getitem__)
    auto = measured[0] / measured[best]
    print(f"  Spearman rank correlation, predicted against measured: {rho:.2f} (goal >= 0.8)")
    print(f"  auto choice (1.) measured {auto:.2f}x the measured best ({best + 1}.) (goal <= 1.10)", flush=True)
    rows = [{"parallel": x.parallel, "activation_checkpointing": x.activation_checkpointing,
             "predicted_s": x.cost.step_s, "measured_s": m, "terms": {t.name: t.seconds for t in x.cost.terms}}
            for x, m in zip(layouts, measured, strict=True)]  # fmt: skip
    return {"layouts": rows, "spearman": rho, "auto_over_best": auto, "best": best}


def question(cluster: Cluster, cfg: TrainingConfig, sets: list[str], pair: tuple[LayoutCost, LayoutCost],
             links: list[str], repeats: int, done: dict) -> list[dict]:  # fmt: skip
    """``pair`` (ZeRO-3 across the hosts, pipeline stages across them) at every speed of ``links``: the
    bandwidth the preflight measured, and their steps' ratio measured and predicted. The speeds of the full
    comparison reuse its runs and its preflight."""
    points = []
    for link in links:
        if link not in done:
            cluster.hosts.shape(parse_bandwidth(link, "inter") * 8)
            rates = preflight(cluster, model_config(cfg.model.preset, None).d_model, False)
            show_rates(link, rates)
            done[link] = {"rates": rates, "measured": {}}
        rates, found = done[link]["rates"], done[link]["measured"]
        predicted = predict(cluster, cfg, rates)
        zero3, pipeline = (same(x, predicted) for x in pair)
        missing = [x for x in (zero3, pipeline) if key(x) not in found]
        if missing:
            cluster.hosts.shape(parse_bandwidth(link, "inter") * 8)
            found.update(zip(map(key, missing), measure_all(cluster, missing, sets, repeats), strict=True))
        points.append({"link": link, "bandwidth_bytes_s": rates.inter_bytes_s,
                       "measured_s": [found[key(zero3)], found[key(pipeline)]],
                       "predicted_s": [zero3.cost.step_s, pipeline.cost.step_s],
                       "measured_ratio": found[key(zero3)] / found[key(pipeline)],
                       "predicted_ratio": zero3.cost.step_s / pipeline.cost.step_s})  # fmt: skip
    return points


def predicted_crossing(cluster: Cluster, cfg: TrainingConfig, rates: Rates, pair: tuple[LayoutCost, LayoutCost]):
    """The bandwidth between hosts at which the model's step of ``pair``'s ZeRO-3 layout equals its pipeline's,
    every other rate as measured (bisection in log scale between 1 Mbit/s and 1 Tbit/s; None: no crossing)."""

    def above(bytes_s: float) -> bool:  # ZeRO-3 slower
        predicted = predict(cluster, cfg, rates.model_copy(update={"inter_bytes_s": bytes_s}))
        zero3, pipeline = (same(x, predicted) for x in pair)
        return zero3.cost.step_s > pipeline.cost.step_s

    low, high = 1e6 / 8, 1e12 / 8
    if above(low) == above(high):
        return None
    for _ in range(30):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if above(mid) == above(low) else (low, mid)
    return math.sqrt(low * high)


def where(found: list[float], ratios: list[float]) -> str:
    """Where ZeRO-3 loses, in words: below the one crossing, at every speed or at none (no crossing), or at no
    single speed (a ratio that crosses 1 more than once: noise)."""
    if len(found) > 1:
        return f"at no single speed: the ratio passes 1 at {', '.join(map(gbit, found))} (noise)"
    if found:
        return f"below {gbit(found[0])}"
    return "at every speed" if all(r > 1 for r in ratios) else "at no speed"


def answer(points: list[dict], pair: tuple[LayoutCost, LayoutCost], predicted: float | None) -> None:
    print(f"ZeRO-3 across the hosts ({short(pair[0])}) against pipeline stages across the hosts ({short(pair[1])}):")
    print(
        f"  {'link':>8} {'measured':>12}   {'ZeRO-3':>9} {'pipeline':>9}   ZeRO-3 / pipeline (above 1: ZeRO-3 slower)"
    )
    for p in points:
        steps = " ".join(ms(x) for x in p["measured_s"])
        print(f"  {p['link']:>8} {gbit(p['bandwidth_bytes_s']):>12} {steps}   measured {p['measured_ratio']:.2f}, "
              f"predicted {p['predicted_ratio']:.2f}")  # fmt: skip
    found = crossings([(p["bandwidth_bytes_s"], p["measured_ratio"]) for p in points])
    measured = where(found, [p["measured_ratio"] for p in points])
    model = where([] if predicted is None else [predicted], [p["predicted_ratio"] for p in points])
    print(f"  ZeRO-3 loses to the pipeline: measured {measured}; predicted {model}", flush=True)


def main() -> None:
    args = parse_args()
    cfg, sets = base_config(args)
    links = [x for x in args.links.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="bench-layouts-") as folder, emulated_hosts(args.hosts) as hosts:
        cluster = Cluster(hosts, args.ranks_per_host, Path(folder))
        print(f"{args.hosts} emulated hosts x {args.ranks_per_host} ranks (CPUs {hosts.cpus}), gloo, {args.preset}, "
              f"batch {args.global_batch_size} x {args.seq_len} tokens, {args.steps} steps a run, median of "
              f"{args.repeats} runs", flush=True)  # fmt: skip
        done, results, pair = {}, {}, None
        for link in links:
            hosts.shape(parse_bandwidth(link, "inter") * 8)
            rates = preflight(cluster, model_config(args.preset, None).d_model, args.quick)
            show_rates(link, rates)
            everything = predict(cluster, cfg, rates)
            pair = pair or question_layouts(everything, args.hosts, args.ranks_per_host)
            layouts = per_degrees(everything)
            if args.quick:  # the auto choice and the question's two
                layouts = list({key(x): x for x in [layouts[0], *(same(x, everything) for x in pair)]}.values())
            results[link] = compare(cluster, sets, layouts, args.repeats) | {"rates": rates.model_dump()}
            measured = {key(x): row["measured_s"] for x, row in zip(layouts, results[link]["layouts"], strict=True)}
            done[link] = {"rates": rates, "measured": measured}
        sweep = [x for x in args.sweep.split(",") if x]
        speeds = sorted({*links, *sweep}, key=lambda x: parse_bandwidth(x, "inter"))
        points = question(cluster, cfg, sets, pair, speeds, args.repeats, done)
        predicted = predicted_crossing(cluster, cfg, done[links[0]]["rates"], pair)
        answer(points, pair, predicted)
    if args.out:
        report = {"args": {k: str(v) for k, v in vars(args).items()}, "links": results, "question": points,
                  "question_layouts": [short(x) for x in pair], "predicted_crossing_bytes_s": predicted}  # fmt: skip
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
