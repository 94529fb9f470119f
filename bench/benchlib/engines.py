"""The two engines' command lines, and parsers for what they print."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from .errors import BenchError

LLAMA = "llama.cpp"
CONDUCTOR = "conductor"


@dataclasses.dataclass
class Throughput:
    """One (test, threads) result of one benchmark invocation, in tokens/s."""

    test: str  # "pp512", "tg128", ...
    threads: int
    samples: list[float]  # one per repetition when the engine reports them
    low: float  # slowest repetition
    high: float  # fastest repetition
    extra: dict = dataclasses.field(default_factory=dict)  # fields kept for the raw JSON


def join_ints(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


# ---------------------------------------------------------------- llama.cpp

def llama_bench_cmd(bin_dir: Path, model: Path, prompts: list[int], gens: list[int], threads: list[int],
                    reps: int, extra: list[str] | None = None) -> list[str]:
    # Every other setting (flash attention auto, batch sizes, KV type, mmap,
    # repacking) stays at llama-bench's default unless `extra` sets it; the report
    # prints what it used.
    return [str(bin_dir / "llama-bench"), "-m", str(model), "-p", join_ints(prompts), "-n", join_ints(gens),
            "-t", join_ints(threads), "-r", str(reps), "-o", "json", *(extra or [])]


def test_name(n_prompt: int, n_gen: int) -> str:
    if n_prompt and n_gen:
        return f"pp{n_prompt}+tg{n_gen}"
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def parse_llama_bench(stdout: str) -> tuple[list[Throughput], dict]:
    """llama-bench -o json prints one JSON array with an object per (test, threads)."""
    try:
        start = stdout.index("[")
        entries = json.loads(stdout[start:])
    except ValueError as e:
        raise BenchError(f"llama-bench did not print a JSON array ({e}); it printed:\n{stdout[-2000:]}") from e
    results = []
    for e in entries:
        samples = [float(x) for x in e.get("samples_ts") or [e["avg_ts"]]]
        results.append(Throughput(
            test=test_name(int(e["n_prompt"]), int(e["n_gen"])),
            threads=int(e["n_threads"]),
            samples=samples,
            low=min(samples),
            high=max(samples),
            extra={k: e.get(k) for k in ("avg_ts", "stddev_ts", "test_time")},
        ))
    settings = llama_bench_settings(entries[0]) if entries else {}
    return results, settings


_FLASH_ATTN = {-1: "auto", 0: "off", 1: "on"}


def llama_bench_settings(entry: dict) -> dict:
    """The settings llama-bench ran with, as recorded in its JSON (names vary by version)."""
    keys = ("build_commit", "build_number", "cpu_info", "backends", "model_type", "n_batch", "n_ubatch",
            "type_k", "type_v", "flash_attn", "load_mode", "use_mmap", "repack", "poll", "cpu_mask",
            "cpu_strict", "n_gpu_layers", "no_kv_offload", "n_depth")
    settings = {k: entry[k] for k in keys if k in entry}
    fa = settings.get("flash_attn")
    if isinstance(fa, bool):
        settings["flash_attn"] = "on" if fa else "off"
    elif isinstance(fa, int):
        settings["flash_attn"] = _FLASH_ATTN.get(fa, str(fa))
    return settings


def llama_decode_cmd(bin_dir: Path, model: Path, prompt: str, n_gen: int, threads: int, ctx: int) -> list[str]:
    # -no-cnv: plain completion, no chat loop waiting on stdin; -s: fixed seed
    # (greedy anyway at --temp 0); --ignore-eos: always exactly n_gen tokens;
    # -c: a KV cache sized for this run, as llama-bench does, rather than the
    # model's full training context.
    return [str(bin_dir / "llama-completion"), "-m", str(model), "-p", prompt, "-n", str(n_gen),
            "-t", str(threads), "--temp", "0", "-s", "42", "--ignore-eos", "-no-cnv", "-c", str(ctx)]


def llama_prompted_cmd(bin_dir: Path, model: Path, prompt_file: Path, n_gen: int, threads: int, ctx: int,
                       extra: list[str] | None = None) -> list[str]:
    """Greedy generation after a prompt file's text: the decode speed of real text."""
    return [str(bin_dir / "llama-completion"), "-m", str(model), "-f", str(prompt_file), "-n", str(n_gen),
            "-t", str(threads), "--temp", "0", "-s", "42", "--ignore-eos", "-no-cnv", "-c", str(ctx),
            *(extra or [])]


def parse_llama_prompted(stderr: str, n_gen: int, threads: int) -> list[Throughput]:
    """The decode speed `llama-completion` reports (its "eval time" line), as a tgN result."""
    perf = parse_llama_completion_perf(stderr)
    if "decode_tok_s" not in perf:
        raise BenchError(f"llama-completion printed no eval time; it printed:\n{stderr[-2000:]}")
    tok_s = perf["decode_tok_s"]
    return [Throughput(test=f"tg{n_gen}", threads=threads, samples=[tok_s], low=tok_s, high=tok_s, extra=perf)]


def llama_flash_attn_probe_cmd(bin_dir: Path, model: Path, threads: int, ctx: int) -> list[str]:
    """A 1-token verbose run whose log says what `-fa auto` resolved to on this machine."""
    return [str(bin_dir / "llama-completion"), "-m", str(model), "-p", "Hello", "-n", "1", "-t", str(threads),
            "--temp", "0", "-no-cnv", "-c", str(ctx), "-v"]


def parse_flash_attn_resolution(log: str) -> str | None:
    """'enabled' / 'disabled' from the log lines llama.cpp prints when it resolves `-fa auto`
    (this version: "Flash Attention enabled" or "Flash Attention not supported, set to
    disabled"; older ones: "Flash Attention was auto, set to enabled")."""
    m = re.search(r"Flash Attention (?:was auto, set to |not supported, set to )?(enabled|disabled)", log,
                  re.IGNORECASE)
    return m.group(1).lower() if m else None


def parse_llama_completion_perf(stderr: str) -> dict:
    """Timings llama-completion prints at exit (informational only, kept in the raw JSON)."""
    perf = {}
    m = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", stderr)
    if m:
        perf["prompt_tokens"] = int(m.group(2))
        perf["prompt_ms"] = float(m.group(1))
    m = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr)
    if m:
        perf["decode_runs"] = int(m.group(2))
        perf["decode_ms"] = float(m.group(1))
        if perf["decode_ms"] > 0:
            perf["decode_tok_s"] = perf["decode_runs"] / perf["decode_ms"] * 1000
    return perf


# ---------------------------------------------------------------- Conductor

def conductor_bench_cmd(conductor: Path, model: Path, prompts: list[int], gens: list[int], threads: list[int],
                        reps: int, extra: list[str] | None = None) -> list[str]:
    return [str(conductor), "bench", "-m", str(model), "-p", join_ints(prompts), "-n", join_ints(gens),
            "-t", join_ints(threads), "-r", str(reps), "--json", *(extra or [])]


def parse_conductor_bench(stdout: str) -> list[Throughput]:
    """`conductor bench --json`: one JSON object per line,
    {"test": "pp512", "threads": 2, "tok_s": {"median": m, "min": a, "max": b}, ...}.

    Lines that are not JSON objects are ignored, and so are unknown fields. When
    tok_s carries per-repetition "samples" they are used; otherwise the
    invocation's median stands for it (and min/max still bound the spread).
    """
    results = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
            tok_s = obj["tok_s"]
            test, threads = str(obj["test"]), int(obj["threads"])
            median, low, high = float(tok_s["median"]), float(tok_s["min"]), float(tok_s["max"])
        except (ValueError, KeyError, TypeError) as e:
            raise BenchError(f"conductor bench printed a line this script cannot read ({e!r}):\n{line}") from e
        samples = tok_s.get("samples")
        if isinstance(samples, list) and samples:
            samples = [float(x) for x in samples]
        else:
            samples = [median]
        results.append(Throughput(test=test, threads=threads, samples=samples, low=min(low, *samples),
                                  high=max(high, *samples),
                                  extra={"median": median, "peak_rss_bytes": obj.get("peak_rss_bytes"),
                                         "cache": obj.get("cache")}))
    if not results:
        raise BenchError(f"conductor bench --json printed no result lines; it printed:\n{stdout[-2000:]}")
    return results


def conductor_decode_cmd(conductor: Path, model: Path, prompt: str, n_gen: int, threads: int,
                         extra: list[str] | None = None) -> list[str]:
    return [str(conductor), "run", "-m", str(model), "-p", prompt, "-n", str(n_gen), "-t", str(threads),
            "--temp", "0", "--ignore-eos", *(extra or [])]
