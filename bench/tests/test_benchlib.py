"""Unit tests for the parts of the bench scripts that need no engine:
python3 -m unittest discover -s bench/tests"""

import json
import os
import signal
import struct
import sys
import tempfile
import unittest
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import engines, logits, report  # noqa: E402
from benchlib.profiles import median_profile  # noqa: E402
from benchlib.errors import BenchError  # noqa: E402
from benchlib.procs import run_measured  # noqa: E402
from benchlib.sandbox import parse_memory_limit  # noqa: E402

LLAMA_BENCH_JSON = json.dumps([
    {"build_commit": "0c1e570", "build_number": 1, "n_batch": 2048, "n_ubatch": 512, "type_k": "f16",
     "type_v": "f16", "flash_attn": -1, "load_mode": "auto", "repack": True, "n_threads": 2, "n_prompt": 512,
     "n_gen": 0, "avg_ts": 300.0, "samples_ts": [290.0, 300.0, 310.0]},
    {"build_commit": "0c1e570", "n_threads": 2, "n_prompt": 0, "n_gen": 128, "avg_ts": 90.0,
     "samples_ts": [88.0, 92.0]},
], indent=2)


class ParseLlamaBench(unittest.TestCase):
    def test_tests_threads_samples_and_settings(self):
        results, settings = engines.parse_llama_bench(LLAMA_BENCH_JSON)
        self.assertEqual([(r.test, r.threads) for r in results], [("pp512", 2), ("tg128", 2)])
        self.assertEqual(results[0].samples, [290.0, 300.0, 310.0])
        self.assertEqual((results[1].low, results[1].high), (88.0, 92.0))
        self.assertEqual(settings["flash_attn"], "auto")
        self.assertEqual(settings["build_commit"], "0c1e570")

    def test_garbage_is_a_clear_error(self):
        with self.assertRaises(BenchError):
            engines.parse_llama_bench("main: error: failed to load model\n")

    def test_combined_test_name(self):
        self.assertEqual(engines.test_name(512, 128), "pp512+tg128")


class ParseConductorBench(unittest.TestCase):
    def test_ignores_other_lines_and_fields(self):
        out = "\n".join([
            "warming up ...",
            json.dumps({"test": "pp512", "threads": 1, "tok_s": {"median": 100, "min": 90, "max": 110, "mean": 1},
                        "peak_rss_bytes": 5, "whatever": [1, 2]}),
            json.dumps({"test": "tg128", "threads": 1, "tok_s": {"median": 30, "min": 29, "max": 31,
                                                                 "samples": [29, 30, 31]}}),
        ])
        results = engines.parse_conductor_bench(out)
        self.assertEqual([(r.test, r.threads, r.samples) for r in results],
                         [("pp512", 1, [100.0]), ("tg128", 1, [29.0, 30.0, 31.0])])
        self.assertEqual((results[0].low, results[0].high), (90.0, 110.0))

    def test_malformed_line_is_an_error(self):
        with self.assertRaises(BenchError):
            engines.parse_conductor_bench('{"test": "pp512", "threads": 1}')

    def test_no_results_is_an_error(self):
        with self.assertRaises(BenchError):
            engines.parse_conductor_bench("nothing here\n")


class LlamaCompletionLog(unittest.TestCase):
    def test_perf_and_flash_attention(self):
        log = ("common_perf_print: prompt eval time =     2509.48 ms /     6 tokens (  418.25 ms per token)\n"
               "common_perf_print:        eval time =    16552.95 ms /   127 runs   (  130.34 ms per token)\n"
               "llama_context: Flash Attention was auto, set to enabled\n")
        perf = engines.parse_llama_completion_perf(log)
        self.assertEqual(perf["prompt_tokens"], 6)
        self.assertEqual(perf["decode_runs"], 127)
        self.assertAlmostEqual(perf["decode_tok_s"], 127 / 16.55295, places=3)
        self.assertEqual(engines.parse_flash_attn_resolution(log), "enabled")
        self.assertEqual(engines.parse_flash_attn_resolution("resolve_fused_ops: Flash Attention enabled"),
                         "enabled")
        self.assertEqual(engines.parse_flash_attn_resolution(
            "resolve_fused_ops: Flash Attention not supported, set to disabled"), "disabled")
        self.assertIsNone(engines.parse_flash_attn_resolution("llama_context: flash_attn = auto"))

    def test_prompted_generation_is_a_tg_result_and_no_eval_line_an_error(self):
        log = "common_perf_print:        eval time =    2000.00 ms /    47 runs   (   42.55 ms per token)\n"
        [r] = engines.parse_llama_prompted(log, 48, 2)
        self.assertEqual((r.test, r.threads), ("tg48", 2))
        self.assertAlmostEqual(r.samples[0], 23.5)
        with self.assertRaises(BenchError):
            engines.parse_llama_prompted("llama_model_load: error\n", 48, 2)


class Summaries(unittest.TestCase):
    def records(self):
        return [
            {"kind": "throughput", "engine": "llama.cpp", "test": "pp512", "threads": 1,
             "samples_tok_s": [10, 11, 12], "min_tok_s": 10, "max_tok_s": 12},
            {"kind": "throughput", "engine": "llama.cpp", "test": "pp512", "threads": 1,
             "samples_tok_s": [13, 14, 15], "min_tok_s": 13, "max_tok_s": 15},
            {"kind": "throughput", "engine": "conductor", "test": "pp512", "threads": 1,
             "samples_tok_s": [25], "min_tok_s": 20, "max_tok_s": 30},
            {"kind": "throughput", "engine": "conductor", "test": "pp512", "threads": 1,
             "samples_tok_s": [27], "min_tok_s": 24, "max_tok_s": 29},
            {"kind": "peak_rss", "engine": "llama.cpp", "threads": 1, "max_rss_bytes": 100 << 20},
            {"kind": "peak_rss", "engine": "conductor", "threads": 1, "max_rss_bytes": 50 << 20},
            {"kind": "peak_rss", "engine": "conductor", "threads": 1, "failed": "OOM-killed"},
        ]

    def test_median_over_all_repetitions_and_spread(self):
        tp = report.summarize_throughput(self.records())
        llama = tp[("llama.cpp", "pp512", 1)]
        self.assertEqual((llama.median, llama.low, llama.high, llama.count), (12.5, 10, 15, 6))
        cond = tp[("conductor", "pp512", 1)]
        self.assertEqual((cond.median, cond.low, cond.high), (26, 20, 30))

    def test_failed_runs_show_as_text(self):
        rss = report.summarize_rss(self.records())
        self.assertEqual(rss[("conductor", 1)], "OOM-killed in 1/2 runs")
        self.assertEqual(rss[("llama.cpp", 1)].median, 100 << 20)

    def test_table(self):
        recs = self.records()[:-1]
        table = report.render_table(["pp512", "tg128"], [1], report.summarize_throughput(recs),
                                    report.summarize_rss(recs), 128)
        lines = table.splitlines()
        self.assertEqual(lines[0], "| test | llama.cpp t=1 | Conductor t=1 | ratio t=1 |")
        self.assertIn("| pp512 (tok/s) | 12.5 (10.0–15.0) | 26.0 (20.0–30.0) | 2.08× |", lines)
        self.assertIn("| tg128 (tok/s) | n/a | n/a | n/a |", lines)
        self.assertIn("| peak RSS, tg128 run (MiB) | 100.0 (100.0–100.0) | 50.0 (50.0–50.0) | 0.50× |", lines)


class MemoryLimitParsing(unittest.TestCase):
    def test_forms(self):
        model = 100 << 20
        self.assertEqual(parse_memory_limit("50%", model), 50 << 20)
        self.assertEqual(parse_memory_limit("300MiB", model), 300 << 20)
        self.assertEqual(parse_memory_limit("1.5G", model), 3 << 29)
        self.assertEqual(parse_memory_limit("8388608", model), 8 << 20)

    def test_bad_values(self):
        for text in ("lots", "10furlongs", "1%", "-5MiB"):
            with self.assertRaises(BenchError, msg=text):
                parse_memory_limit(text, 100 << 20)


class RunMeasured(unittest.TestCase):
    def test_peak_rss_and_output(self):
        # A child that touches 64 MiB must report a peak RSS of at least that.
        done = run_measured([sys.executable, "-c", "b = bytearray(64 << 20); print('ok')"], timeout_s=60)
        self.assertEqual(done.returncode, 0)
        self.assertEqual(done.stdout.strip(), "ok")
        self.assertGreater(done.max_rss_bytes, 64 << 20)

    def test_timeout_kills_the_whole_group(self):
        with tempfile.TemporaryDirectory() as d:
            pidfile = Path(d) / "grandchild"
            script = f"sleep 300 & echo $! > {pidfile}; wait"
            done = run_measured(["sh", "-c", script], timeout_s=1)
            self.assertTrue(done.timed_out)
            grandchild = int(pidfile.read_text())
            with self.assertRaises(ProcessLookupError):
                os.kill(grandchild, 0)

    def test_signal_death_is_described(self):
        done = run_measured(["sh", "-c", "kill -ILL $$"], timeout_s=10)
        self.assertEqual(done.returncode, -signal.SIGILL)
        self.assertIn("SIGILL", done.describe_failure())



def load_script(name):
    """A bench script without the .py suffix, as a module."""
    import importlib.machinery
    import importlib.util
    path = Path(__file__).resolve().parents[1] / name
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


class SparseQuality(unittest.TestCase):
    def setUp(self):
        self.sq = load_script("sparse-quality")

    def test_final_estimate_is_parsed_and_its_absence_is_an_error(self):
        out = "[1]29.1,[2]30.0\nFinal estimate: PPL = 29.8413 +/- 0.54258\n"
        self.assertEqual(self.sq.parse_ppl(out), (29.8413, 0.54258))
        with self.assertRaises(BenchError):
            self.sq.parse_ppl("perplexity: 0 chunks\n")

    def test_table_is_relative_to_dense_and_plot_has_a_line_per_mode(self):
        points = [{"mode": "dense", "sparsity": 0, "ppl": 20.0, "err": 0.5},
                  {"mode": "threshold", "sparsity": 30, "ppl": 20.5, "err": 0.5},
                  {"mode": "threshold", "sparsity": 50, "ppl": 22.0, "err": 0.6},
                  {"mode": "predictor", "sparsity": 30, "ppl": 20.6, "err": 0.5}]
        table = self.sq.table(points)
        self.assertIn("| threshold | 30% | 20.5000 ± 0.5000 | +2.50% |", table)
        self.assertIn("| threshold | 50% | 22.0000 ± 0.6000 | +10.00% |", table)
        svg = self.sq.svg(points, "t")
        self.assertEqual(svg.count("<polyline"), 2)
        self.assertIn("dense +3%", svg)


class OldVsNew(unittest.TestCase):
    def test_medians_over_all_samples_and_the_ratio_of_new_to_old(self):
        ovn = load_script("old-vs-new")
        samples = {("old", "actors", "tg64", 2): [10.0, 12.0, 11.0],
                   ("new", "actors", "tg64", 2): [11.0, 13.0, 12.0, 14.0],
                   ("old", "inline", "tg64", 2): [9.0]}
        table = ovn.table(samples)
        self.assertIn("| actors | tg64 | 2 | 11.0 (10.0–12.0) | 12.5 (11.0–14.0) | **1.136×** |", table)
        # A result one binary lacks has no row.
        self.assertNotIn("| inline |", table)


class MedianProfile(unittest.TestCase):
    def test_numbers_are_medians_tables_row_by_row_and_the_rest_from_the_first(self):
        def profile(mbps, latency, name):
            return {"name": name, "single_queue": False,
                    "storage": {"latency_us": latency,
                                "random": [{"size_bytes": 4096, "queue_depth": 1, "mbps": mbps},
                                           {"size_bytes": 8192, "queue_depth": 1, "mbps": 2 * mbps}]}}
        merged = median_profile([profile(100.0, 90, "a"), profile(300.0, 70, "b"), profile(200.0, 80, "c")])
        self.assertEqual(merged["name"], "a")
        self.assertIs(merged["single_queue"], False)
        self.assertEqual(merged["storage"]["latency_us"], 80)
        self.assertIsInstance(merged["storage"]["latency_us"], int)
        rows = merged["storage"]["random"]
        self.assertEqual([r["mbps"] for r in rows], [200.0, 400.0])
        self.assertEqual([r["size_bytes"] for r in rows], [4096, 8192])

    def test_tables_of_different_lengths_come_from_the_first(self):
        first = {"rates": [1.0, 2.0]}
        self.assertEqual(median_profile([first, {"rates": [5.0]}, {"rates": [7.0]}]), first)


if __name__ == "__main__":
    unittest.main()


class VsLlamaCppRaw(unittest.TestCase):
    def test_an_engine_that_never_finished_is_kept_as_its_outcome(self):
        vs = load_script("vs-llama-cpp")
        throughput = {("llama.cpp", "tg8", 2): "OOM-killed in 2/2 runs",
                      ("conductor", "tg8", 2): report.Spread.of([0.6, 0.7])}
        rss = {("llama.cpp", 2): "OOM-killed in 1/1 runs"}
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "raw.json"
            vs.write_raw(path, {"header_lines": [("model", "m.gguf")]}, [], throughput, rss)
            doc = json.loads(path.read_text())
        tok_s = {e["engine"]: e for e in doc["summary"]["tok_s"]}
        self.assertEqual(tok_s["llama.cpp"]["outcome"], "OOM-killed in 2/2 runs")
        self.assertEqual((tok_s["conductor"]["min"], tok_s["conductor"]["max"]), (0.6, 0.7))
        self.assertEqual(doc["summary"]["peak_rss_bytes"][0]["outcome"], "OOM-killed in 1/1 runs")
        self.assertEqual(doc["meta"]["header"], {"model": "m.gguf"})


def _gguf_bytes(kvs: list[tuple[str, int, bytes]]) -> bytes:
    """A GGUF v3 header without tensors: (key, value type, packed value) triples."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, ty, packed in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", ty) + packed
    return out


def _gguf_str(s: str) -> bytes:
    return struct.pack("<Q", len(s)) + s.encode()


class LogitsHelpers(unittest.TestCase):
    def test_gguf_metadata_scalars_strings_and_arrays(self):
        tokens = struct.pack("<IQ", 8, 3) + b"".join(_gguf_str(t) for t in ["a", "b", "c"])
        data = _gguf_bytes([("general.architecture", 8, _gguf_str("gemma3")),
                            ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 2)),
                            ("gemma3.rope.freq_base", 6, struct.pack("<f", 10000.0)),
                            ("tokenizer.ggml.tokens", 9, tokens)])
        meta = logits.parse_gguf_metadata(data)
        self.assertEqual(meta["general.architecture"], "gemma3")
        self.assertEqual(meta["gemma3.rope.freq_base"], 10000.0)
        self.assertEqual(logits.vocab_and_bos(meta), (3, 2))

    def test_gguf_metadata_refuses_other_files_and_truncation(self):
        with self.assertRaises(BenchError):
            logits.parse_gguf_metadata(b"GGML" + bytes(20))
        data = _gguf_bytes([("general.architecture", 8, _gguf_str("llama"))])
        with self.assertRaises(BenchError):
            logits.parse_gguf_metadata(data[:-2])

    def test_token_ids_start_with_bos_stay_in_the_vocabulary_and_repeat(self):
        ids = logits.token_ids(320, 2, 64)
        self.assertEqual(ids[0], 2)
        self.assertEqual(len(ids), 65)
        self.assertTrue(all(0 <= i < 320 for i in ids))
        self.assertEqual(ids, logits.token_ids(320, 2, 64))
        self.assertNotEqual(ids, logits.token_ids(320, 2, 64, seed=2))
        self.assertEqual(logits.token_ids(320, None, 4), logits.token_ids(320, 7, 4)[1:])

    def test_compare_counts_argmax_agreement_and_deltas(self):
        ref = [[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]]
        other = [[0.1, 2.5, 1.0], [1.0, 0.0, 1.5]]
        a = logits.compare(ref, other, k=1)
        self.assertEqual((a.positions, a.agree, a.disagree), (2, 1, [1]))
        self.assertAlmostEqual(a.max_abs, 1.0)
        self.assertEqual(a.worst_position, 1)
        # Top 1 of each reference row: 3.0 (delta 0.5) and 2.0 (delta 1.0).
        self.assertAlmostEqual(a.max_abs_topk, 1.0)
        # Both reference rows lead by 2.0 and 1.0: confident; the second disagrees.
        self.assertEqual((a.confident, a.confident_agree, a.disagree_margins), (2, 1, [1.0]))
        self.assertEqual(logits.compare(ref, other, k=1, margin=1.5).confident, 1)
        with self.assertRaises(BenchError):
            logits.compare(ref, other[:1])

    def test_top_k_breaks_ties_by_id(self):
        self.assertEqual(logits.top_k([1.0, 5.0, 5.0, 0.0], 3), [(1, 5.0), (2, 5.0), (0, 1.0)])

    def test_tensor_dumps_keep_the_last_value_of_a_name(self):
        def record(name, values):
            return struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", len(values)) + \
                struct.pack(f"<{len(values)}f", *values)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "t.bin"
            path.write_bytes(record("Qcur-0", [1.0, 2.0]) + record("l_out-0", [3.0]) + record("Qcur-0", [4.0, 5.0]))
            t = logits.read_tensors(path)
            self.assertEqual(list(t["Qcur-0"]), [4.0, 5.0])
            path.write_bytes(record("x", [1.0])[:-2])
            with self.assertRaises(BenchError):
                logits.read_tensors(path)
        rows = logits.tensor_differences({"a": [1.0, 1.0], "b": [2.0]}, {"a": [1.0, 1.5], "c": [0.0]}, ["a", "b"])
        self.assertEqual(rows, [("a", 0.5, 0.5)])

    def test_stored_reference_names_the_file_by_size_and_crc(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.gguf"
            path.write_bytes(b"model bytes")
            s = logits.stored_reference("qwen3", "tiny", path, [1, 2], [[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]], 2, {})
        self.assertEqual(s["file_bytes"], 11)
        self.assertEqual(s["file_crc32"], zlib.crc32(b"model bytes"))
        self.assertEqual(s["top_k"], [[[1, 1.0], [2, 0.5]], [[0, 2.0], [2, 1.0]]])


class MemorySweep(unittest.TestCase):
    def test_limits_ratio_and_plot_mark_an_engine_that_never_finished(self):
        ms = load_script("memory-sweep")
        self.assertEqual(ms.limits_of("25,100,50,25"), [100.0, 50.0, 25.0])
        with self.assertRaises(SystemExit):
            ms.limits_of("0,50")
        points = [{"percent": 50.0, "llama.cpp": {"median": 1.0, "min": 0.9, "max": 1.1},
                   "conductor": {"median": 4.5, "min": 4.0, "max": 5.0}},
                  {"percent": 25.0, "llama.cpp": {"outcome": "OOM-killed in 2/2 runs"},
                   "conductor": {"median": 3.0, "min": 2.5, "max": 3.5}}]
        self.assertAlmostEqual(ms.ratio(points[0]), 4.5)
        self.assertIsNone(ms.ratio(points[1]))
        svg = ms.draw(points, "t")
        # One line per engine with figures (llama.cpp's has one point), a mark where it had none.
        self.assertEqual(svg.count("<polyline"), 2)
        self.assertEqual(svg.count("✕"), 1)
        self.assertEqual(svg.count("<circle"), 3)
