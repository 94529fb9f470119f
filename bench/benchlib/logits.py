"""Teacher-forced logits of two engines, position by position: the token sequence, the GGUF
metadata it needs, the comparison, the tests' stored top-k, and the intermediate-tensor dumps
(`bench/llama-logits --tensors`, `conductor logits --tensors`)."""

from __future__ import annotations

import array
import dataclasses
import struct
import subprocess
import zlib
from pathlib import Path

from .errors import BenchError

# GGUF value types (gguf.md): the size of each fixed-size one.
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise BenchError("GGUF metadata is truncated")
        (v,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.at + n > len(self.data):
            raise BenchError("GGUF metadata is truncated")
        s = self.data[self.at:self.at + n].decode("utf-8", errors="replace")
        self.at += n
        return s

    def value(self, ty: int):
        if ty in _FIXED:
            return self.take(_FIXED[ty])
        if ty == _STRING:
            return self.string()
        if ty == _ARRAY:
            inner, n = self.take("<I"), self.take("<Q")
            return [self.value(inner) for _ in range(n)]
        raise BenchError(f"GGUF value type {ty} is unknown")


def parse_gguf_metadata(data: bytes) -> dict:
    """The key-value metadata of a GGUF v2/v3 file from its first bytes (arrays as lists)."""
    r = _Reader(data)
    if data[:4] != b"GGUF":
        raise BenchError("not a GGUF file (magic)")
    r.at = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise BenchError(f"GGUF version {version} is not supported")
    r.take("<Q")  # tensors
    n_kv = r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    return meta


def read_gguf_metadata(path: Path, limit: int = 64 << 20) -> dict:
    with open(path, "rb") as f:
        return parse_gguf_metadata(f.read(limit))


def vocab_and_bos(meta: dict) -> tuple[int, int | None]:
    """(n_vocab, BOS id or None) from GGUF metadata."""
    arch = meta.get("general.architecture", "")
    n_vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    if not n_vocab:
        raise BenchError("the model names no vocabulary size and holds no tokens")
    return n_vocab, meta.get("tokenizer.ggml.bos_token_id")


def token_ids(n_vocab: int, bos: int | None, n: int, seed: int = 1) -> list[int]:
    """BOS (when the model has one) then `n` pseudo-random ids below `n_vocab` (splitmix64 of
    seed + i): the same sequence for a given vocabulary on every machine."""
    mask = (1 << 64) - 1
    ids = [] if bos is None else [bos]
    for i in range(n):
        z = (seed * 0x9E3779B97F4A7C15 + (i + 1) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        ids.append((z ^ (z >> 31)) % n_vocab)
    return ids


def read_logits(path: Path, n_vocab: int) -> list[array.array]:
    """A file of f32 `[position][n_vocab]` as one array per position."""
    a = array.array("f")
    a.frombytes(path.read_bytes())
    if len(a) % n_vocab:
        raise BenchError(f"{path}: {len(a)} floats are not whole rows of {n_vocab}")
    return [a[i:i + n_vocab] for i in range(0, len(a), n_vocab)]


def top_k(row, k: int) -> list[tuple[int, float]]:
    """The `k` largest (id, logit), largest first; ties by lower id."""
    return sorted(enumerate(row), key=lambda p: (-p[1], p[0]))[:k]


def argmax(row) -> int:
    return top_k(row, 1)[0][0]


@dataclasses.dataclass
class Agreement:
    positions: int
    agree: int
    # Positions (0-based) whose argmaxes differ.
    disagree: list[int]
    # Largest |reference - other| over every logit, and over the reference's top k.
    max_abs: float
    max_abs_topk: float
    worst_position: int
    # Standard deviation of the reference's logits (the scale the deltas compare with).
    ref_std: float
    # Positions where the reference's top-1 logit leads its second by at least `margin`, and
    # how many of them agree (check-refs's "confident" positions).
    confident: int = 0
    confident_agree: int = 0
    # The reference's top-1 margin at each position whose argmax differs.
    disagree_margins: list = dataclasses.field(default_factory=list)


def compare(ref: list, other: list, k: int = 16, margin: float = 0.5) -> Agreement:
    """Position-by-position agreement of `other`'s logits with `ref`'s; positions where `ref`'s
    top-1 leads by at least `margin` are also counted apart."""
    if len(ref) != len(other) or not ref:
        raise BenchError(f"{len(ref)} reference positions against {len(other)}")
    agree, disagree, max_abs, max_topk, worst = 0, [], 0.0, 0.0, 0
    confident = confident_agree = 0
    margins = []
    total = sq = count = 0.0
    for p, (r, o) in enumerate(zip(ref, other)):
        if len(r) != len(o):
            raise BenchError(f"position {p}: {len(r)} logits against {len(o)}")
        top = top_k(r, 2)
        lead = top[0][1] - top[1][1] if len(top) > 1 else float("inf")
        hit = top[0][0] == argmax(o)
        agree += hit
        if lead >= margin:
            confident += 1
            confident_agree += hit
        if not hit:
            disagree.append(p)
            margins.append(lead)
        d = max(abs(a - b) for a, b in zip(r, o))
        if d > max_abs:
            max_abs, worst = d, p
        max_topk = max(max_topk, max(abs(v - o[i]) for i, v in top_k(r, k)))
        total += sum(r)
        sq += sum(v * v for v in r)
        count += len(r)
    mean = total / count
    return Agreement(len(ref), agree, disagree, max_abs, max_topk, worst, max(sq / count - mean * mean, 0.0) ** 0.5,
                     confident, confident_agree, margins)


def stored_reference(arch: str, preset: str, model: Path, ids: list[int], logits: list, k: int,
                     llama_cpp: dict) -> dict:
    """What the Rust test keeps of llama.cpp's logits for one generated model: the file's size
    and CRC-32 (the generator must still make these bytes), the ids, and per position
    llama.cpp's argmax and top-k (id, logit)."""
    data = model.read_bytes()
    return {
        "arch": arch,
        "preset": preset,
        "file_bytes": len(data),
        "file_crc32": zlib.crc32(data),
        "llama_cpp": llama_cpp,
        "ids": ids,
        "top_k": [[[i, round(v, 5)] for i, v in top_k(row, k)] for row in logits],
    }


def read_tensors(path: Path) -> dict[str, array.array]:
    """A `--tensors` dump: records of (u32 name length, name, u32 count, f32 values); a name
    seen twice keeps its last values."""
    data = path.read_bytes()
    out, at = {}, 0
    while at < len(data):
        if at + 4 > len(data):
            raise BenchError(f"{path}: truncated record")
        (n,) = struct.unpack_from("<I", data, at)
        name = data[at + 4:at + 4 + n].decode("utf-8", errors="replace")
        at += 4 + n
        if at + 4 > len(data):
            raise BenchError(f"{path}: truncated record {name}")
        (count,) = struct.unpack_from("<I", data, at)
        at += 4
        if at + 4 * count > len(data):
            raise BenchError(f"{path}: truncated values of {name}")
        values = array.array("f")
        values.frombytes(data[at:at + 4 * count])
        at += 4 * count
        out[name] = values
    return out


def tensor_differences(ref: dict, other: dict, order: list[str]) -> list[tuple[str, float, float]]:
    """For each name in `order` present in both dumps with the same length: (name, max
    |difference|, that over the reference's RMS). Names the engines use for different values
    (llama.cpp's `embd` is before Gemma's scaling, Conductor's after) show as large at once."""
    rows = []
    for name in order:
        a, b = ref.get(name), other.get(name)
        if a is None or b is None or len(a) != len(b) or not a:
            continue
        d = max(abs(x - y) for x, y in zip(a, b))
        rms = (sum(x * x for x in a) / len(a)) ** 0.5
        rows.append((name, d, d / rms if rms else float("inf")))
    return rows


def compile_against_llama_cpp(bin_dir: Path, source: str, exe: Path, libs: list[str],
                              common: bool = False) -> Path:
    """Compiles bench/SOURCE against the cached llama.cpp build (its headers, its shared
    libraries, found at run time through rpath); `common` adds llama.cpp's common library."""
    src = next((bin_dir.parent.parent / "src").glob("*/vendor/llama.cpp"))
    here = Path(__file__).resolve().parents[1]
    includes = [src / "include", src / "ggml" / "include"]
    if common:
        includes += [src / "common", src / "vendor"]
    cmd = ["g++", "-O2", "-std=c++17", str(here / source), *(f"-I{i}" for i in includes),
           f"-L{bin_dir}", *(f"-l{lib}" for lib in libs), f"-Wl,-rpath,{bin_dir}", "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def build_logits_tool(bin_dir: Path, out: Path) -> Path:
    """Compiles bench/llama-logits.cpp against the cached llama.cpp build."""
    return compile_against_llama_cpp(bin_dir, "llama-logits.cpp", out / "llama-logits",
                                     ["llama", "ggml", "ggml-base"])
