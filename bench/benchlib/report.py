"""Medians over rounds, and the markdown table."""

from __future__ import annotations

import dataclasses
import statistics

from .engines import CONDUCTOR, LLAMA

MiB = 1 << 20


@dataclasses.dataclass
class Spread:
    median: float
    low: float
    high: float
    count: int  # how many values the median is over

    @classmethod
    def of(cls, values: list[float], low: float | None = None, high: float | None = None) -> "Spread":
        return cls(median=statistics.median(values), low=min(values) if low is None else low,
                   high=max(values) if high is None else high, count=len(values))


def summarize_throughput(records: list[dict]) -> dict[tuple[str, str, int], Spread | str]:
    """(engine, test, threads) -> median over every repetition of every round, min-max spread;
    a string when runs died (e.g. 'OOM-killed in 2/3 runs')."""
    grouped: dict[tuple[str, str, int], list[dict]] = {}
    for r in records:
        if r["kind"] == "throughput":
            grouped.setdefault((r["engine"], r["test"], r["threads"]), []).append(r)
    out: dict[tuple[str, str, int], Spread | str] = {}
    for key, rs in grouped.items():
        failed = [r["failed"] for r in rs if r.get("failed")]
        if failed:
            out[key] = _failure_summary(failed, len(rs))
        else:
            out[key] = Spread.of([s for r in rs for s in r["samples_tok_s"]],
                                 low=min(r["min_tok_s"] for r in rs), high=max(r["max_tok_s"] for r in rs))
    return out


def _failure_summary(failed: list[str], total: int) -> str:
    return f"{failed[0]} in {len(failed)}/{total} runs"


def summarize_rss(records: list[dict]) -> dict[tuple[str, int], Spread | str]:
    """(engine, threads) -> median peak RSS over rounds; a string when the runs died (e.g. 'OOM-killed')."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        if r["kind"] == "peak_rss":
            grouped.setdefault((r["engine"], r["threads"]), []).append(r)
    out: dict[tuple[str, int], Spread | str] = {}
    for key, rs in grouped.items():
        failed = [r["failed"] for r in rs if r.get("failed")]
        if failed:
            out[key] = _failure_summary(failed, len(rs))
        else:
            out[key] = Spread.of([r["max_rss_bytes"] for r in rs])
    return out


def _fmt_rate(s: Spread | str | None) -> str:
    if s is None:
        return "n/a"
    if isinstance(s, str):
        return s
    return f"{s.median:.1f} ({s.low:.1f}–{s.high:.1f})"


def _fmt_mib(s: Spread | str | None) -> str:
    if s is None:
        return "n/a"
    if isinstance(s, str):
        return s
    return f"{s.median / MiB:.1f} ({s.low / MiB:.1f}–{s.high / MiB:.1f})"


def _ratio(conductor: Spread | str | None, llama: Spread | str | None) -> str:
    if isinstance(conductor, Spread) and isinstance(llama, Spread) and llama.median > 0:
        return f"{conductor.median / llama.median:.2f}×"
    return "n/a"


def render_table(tests: list[str], threads: list[int], throughput: dict, rss: dict, n_gen_rss: int) -> str:
    header = ["test"]
    for t in threads:
        header += [f"llama.cpp t={t}", f"Conductor t={t}", f"ratio t={t}"]
    rows = [header, ["---"] + ["---:"] * (len(header) - 1)]
    for test in tests:
        row = [f"{test} (tok/s)"]
        for t in threads:
            llama, cond = throughput.get((LLAMA, test, t)), throughput.get((CONDUCTOR, test, t))
            row += [_fmt_rate(llama), _fmt_rate(cond), _ratio(cond, llama)]
        rows.append(row)
    if rss:
        row = [f"peak RSS, tg{n_gen_rss} run (MiB)"]
        for t in threads:
            llama, cond = rss.get((LLAMA, t)), rss.get((CONDUCTOR, t))
            row += [_fmt_mib(llama), _fmt_mib(cond), _ratio(cond, llama)]
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def render_report(meta: dict, tests: list[str], threads: list[int], throughput: dict, rss: dict) -> str:
    lines = [f"## Conductor vs llama.cpp — {meta['date']}", ""]
    lines += [f"- {label}: {value}" for label, value in meta["header_lines"]]
    lines += ["", render_table(tests, threads, throughput, rss, meta["rss_n_gen"]), ""]
    lines += [
        "tok/s: median over all repetitions of all rounds (min–max); ratio = Conductor / llama.cpp "
        "(above 1× Conductor is faster).",
        "Peak RSS: median over rounds of the decode run's ru_maxrss (min–max); ratio below 1× means "
        "Conductor uses less.",
    ]
    if meta.get("missing"):
        lines += ["", "**Missing:** " + "; ".join(meta["missing"])]
    return "\n".join(lines) + "\n"
