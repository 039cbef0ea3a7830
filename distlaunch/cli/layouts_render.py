"""A training plan's layout advice as a person reads it: the five fastest layouts (``--parallel auto``), the
plan's own layout term by term, the rates the prediction used and where each came from, in 80 columns."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from distlaunch.cli.lines import print_indented
from distlaunch.readable import plural
from distlaunch.training.planner.cost import Rates
from distlaunch.training.planner.search import LayoutAdvice, LayoutCost

DEFAULTS = {"tp": "1", "virtual_stages": "1"}  # left out of a shown layout: --parallel takes them as given


def short(layout: LayoutCost) -> str:
    """A layout as ``--parallel`` takes it, without the keys that say nothing (tp=1, a pipeline without pp)."""
    words = dict(word.split("=") for word in layout.parallel.split(","))
    if words["pp"] == "1":  # no pipeline: only the micro-batches matter, where there are several
        words = {k: v for k, v in words.items() if k not in ("schedule", "virtual_stages")}
        words = {k: v for k, v in words.items() if (k, v) != ("microbatches", "1")}
    text = ",".join(f"{k}={v}" for k, v in words.items() if DEFAULTS.get(k) != v)
    return text + (" +checkpointing" if layout.activation_checkpointing else "")


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _rate(n: float, unit: str) -> str:
    """``30 GFLOP/s``, ``1.25 GB/s``; with ``unit`` " tokens/s": ``10.4k tokens/s``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{prefix if unit.startswith(' ') else ' ' + prefix}{unit}"
    return f"{n:.3g}{unit if unit.startswith(' ') else ' ' + unit}"


def seconds(s: float) -> str:
    """``1.25 s``, ``31.2 ms``."""
    return f"{s:.3g} s" if s >= 0.1 else f"{s * 1e3:.3g} ms"


def summary(layout: LayoutCost) -> str:
    """Its predicted step in one line: time, tokens/s, peak memory per rank."""
    cost = layout.cost
    return f"{seconds(cost.step_s)} a step, {_rate(cost.tokens_per_s, ' tokens/s')}, peak {_size(layout.peak_bytes)}"


def render_rates(rates: Rates, sources: dict[str, str], console: Console) -> None:
    print_indented(
        console,
        f"rates: compute {_rate(rates.flops, 'FLOP/s')} per rank ({sources['compute']}); links "
        f"{_rate(rates.intra_bytes_s, 'B/s')} inside a host ({sources['intra']}), "
        f"{_rate(rates.inter_bytes_s, 'B/s')} between hosts ({sources['inter']})",
    )


def render_terms(layout: LayoutCost, console: Console) -> None:
    """The layout's step, term by term, the largest first."""
    step = layout.cost.step_s
    for term in sorted(layout.cost.terms, key=lambda t: -t.seconds):
        name = f"{term.name} {term.link}" if term.link else term.name
        console.print(Text(f"    {name:<44} {seconds(term.seconds):>9} {term.seconds / step:>5.0%}"))


def render_layouts(advice: LayoutAdvice, console: Console) -> None:
    """The advice after the memory table: the candidates (auto), the layout's breakdown, a faster layout."""
    if advice.auto:
        shown = plural(len(advice.best), "fastest layout")
        print_indented(console, f"--parallel auto: the {shown} that fit, of {advice.considered} valid (predicted):")
        for i, layout in enumerate(advice.best, 1):
            console.print(Text(f"  {i}. {short(layout)}"))
            console.print(Text(f"     {summary(layout)}"))
            console.print(Text(f"     {layout.cost.dominant}"))
        if advice.kept:
            print_indented(console, advice.kept)
    own = advice.layout
    print_indented(console, f"predicted step: {summary(own)}")
    render_terms(own, console)
    render_rates(advice.rates, advice.sources, console)
    if advice.faster is not None:
        times = own.cost.step_s / advice.faster.cost.step_s
        print_indented(
            console,
            f"faster: --parallel {short(advice.faster)} is predicted {times:.1f}x as fast ({summary(advice.faster)})",
        )
