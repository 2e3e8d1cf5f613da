"""Ours vs CTranslate2 vs HF generate: same model, input, beam, threads, interleaved.

Each system is a ``translate(lines) -> list[str]`` callable built once (model loading and a
warm-up batch excluded from timing). CTranslate2 runs in a child process of its own that never
imports torch (``benchmarks.ct2_process``), started and warmed up before each of its timed runs,
untimed, and ended after. Either library slows the other when both live in one process: a live
``ctranslate2.Translator`` made our torch decoder ~20% slower (Intel Xeon; idle CPU ticks during
our run 1 -> ~150, as under ``OMP_WAIT_POLICY=PASSIVE``), and a process where torch had run made
CTranslate2 2.4x slower (AMD EPYC, ``benchmarks/ct2_process.py``). No user runs both in one process.
Runs go A B C A B C ... ``repeats`` times; throughput is target tokens (output pieces,
re-tokenised with the model's target sentencepiece so every system is counted alike) per second,
median and spread. Ratios within one run are the result.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import sacrebleu
import torch

from benchmarks.ct2_process import Ct2Process
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.engine import DecodeStats
from raymt.workers.decoder.scheduler import SchedulerConfig
from raymt.workers.search.shortlist import Shortlist
from raymt.workers.kernels.speedups import CpuSpeedups
from raymt.workers.decoder.core_decoder import CoreDecoder

logger = logging.getLogger(__name__)
Translate = Callable[[list[str]], list[str]]


@dataclass
class PeerRun:
    name: str
    translate: Translate
    seconds: list[float] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    rss_growth_mb: float = 0.0

    def load(self, warmup: list[str]) -> None:
        """Before a timed run: a system that is not kept resident (``Ct2Translator``) loads here and
        translates ``warmup``."""
        getattr(self.translate, "load", lambda _: None)(warmup)

    def unload(self) -> None:
        """After a timed run."""
        getattr(self.translate, "unload", lambda: None)()


def ours(translator: CoreDecoder, cfg: SearchConfig, shortlist: Shortlist | None = None,
         stats: DecodeStats | None = None, batching: SchedulerConfig | None = None) -> Translate:
    """Our translator as a system; ``stats``: the engine's counters, summed over every call;
    ``batching``: a streaming policy over the length-sorted input instead of batch decoding."""
    return lambda lines: [t.text for t in translator.translate(lines, cfg, shortlist, batching, stats=stats)]


class Ct2Translator:
    """CTranslate2 as a system: source pieces + ``</s>`` as CT2's docs do, ``max_batch_size`` examples
    per batch (CTranslate2 sorts the input by length into batches; with ``inter_threads`` > 1 it
    translates that many batches at once, each on ``threads`` threads). It runs in a child process
    without torch (``benchmarks.ct2_process``) that lives only between ``load`` (which also translates
    a warm-up batch) and ``unload`` (module docstring). The pickled pieces' round trip is inside its
    timing: ~1 ms for 1000 lines."""

    def __init__(self, path: str, compute_type: str, threads: int, cfg: SearchConfig, translator: CoreDecoder,
                 max_batch_size: int, inter_threads: int = 1, use_vmap: bool = False) -> None:
        self.path, self.compute_type, self.threads, self.cfg = path, compute_type, threads, cfg
        self.tok, self.max_batch_size, self.inter_threads = translator.checkpoint.tokenizer, max_batch_size, inter_threads
        self.use_vmap = use_vmap  # the vocabulary map converted into the model (``ctranslate2_system``'s vmap)
        self._ct2: Ct2Process | None = None

    def load(self, warmup: list[str] = ()) -> None:
        if self._ct2 is None:
            self._ct2 = Ct2Process(self.path, self.compute_type, self.threads, self.inter_threads)
            if warmup:
                self(list(warmup))

    def unload(self) -> None:
        if self._ct2 is not None:
            self._ct2.close()
        self._ct2 = None

    def pids(self) -> list[int]:
        """The process it decodes in, while loaded (``benchmarks.parts``' perf runs)."""
        return [self._ct2.pid] if self._ct2 is not None else []

    def __call__(self, lines: list[str]) -> list[str]:
        self.load()
        pieces = [self.tok.source_pieces(line) + ["</s>"] for line in lines]
        results = self._ct2.translate_batch(pieces, beam_size=self.cfg.beam_size, length_penalty=self.cfg.length_penalty,
                                            max_batch_size=self.max_batch_size,
                                            max_decoding_length=self.cfg.max_decoding_length,
                                            **({"use_vmap": True} if self.use_vmap else {}))
        return [self.tok.decode([self.tok.target_vocab.get(p, self.tok.target_special.unk) for p in hyp])
                for hyp in results]


def ctranslate2_system(model_dir: str, compute_type: str, threads: int, cfg: SearchConfig,
                       translator: CoreDecoder, work_dir: str, max_batch_size: int = 32,
                       inter_threads: int = 1, vmap: str | None = None) -> Ct2Translator:
    """Convert with ct2-transformers-converter (once per work dir), then a ``Ct2Translator``; ``vmap``: a
    vocabulary map (``.vmap``, the format ``raymt build-shortlist`` writes) converted into the model and
    used on every batch (CTranslate2's ``use_vmap``)."""
    out = f"{work_dir}/ct2-{compute_type}" + ("-vmap" if vmap else "")
    if not os.path.exists(f"{out}/model.bin"):
        subprocess.run([sys.executable, "-m", "ctranslate2.converters.transformers", "--model", model_dir,
                        "--output_dir", out, "--quantization", compute_type, "--force",
                        *(["--vocab_mapping", vmap] if vmap else [])], check=True, capture_output=True)
    return Ct2Translator(out, compute_type, threads, cfg, translator, max_batch_size, inter_threads,
                         use_vmap=vmap is not None)


@dataclass(frozen=True, slots=True)
class Split:
    """How a system spends the cores: ``workers`` decoders (CTranslate2: batches at once,
    ``inter_threads``), each on ``threads`` threads (CTranslate2: ``intra_threads``)."""

    workers: int
    threads: int

    def __str__(self) -> str:
        return f"{self.workers}x{self.threads}"


def splits(cores: int) -> list[Split]:
    """Every way to spend ``cores`` whole: workers x threads = cores (2 cores: 1x2, 2x1)."""
    return [Split(w, cores // w) for w in range(1, cores + 1) if cores % w == 0]


_decoder: CoreDecoder | None = None  # a decoder process's own translator (``OursDecoders``)


_shortlist: Shortlist | None = None  # its shortlist (``OursDecoders``' shortlist)


def _load_decoder(model_dir: str, threads: int, speedups: CpuSpeedups, shortlist: tuple | None) -> None:
    global _decoder, _shortlist
    _decoder = CoreDecoder.load(model_dir, threads=threads, speedups=speedups)
    if shortlist is not None:
        from raymt.pipeline.decoders.shortlist_files import load_shortlist

        url, top_m, top_n = shortlist
        _shortlist = load_shortlist(url, _decoder.checkpoint.tokenizer, top_m=top_m, top_n=top_n,
                                    special_ids=_decoder.special_target_ids())


def _decode(lines: list[str], cfg: SearchConfig) -> list[str]:
    return [t.text for t in _decoder.translate(lines, cfg, _shortlist)]


class OursDecoders:
    """Ours as a Ray user spends the cores: ``split.workers`` decoder processes (as actors are), each a
    ``CoreDecoder`` on ``split.threads`` threads; sentence i goes to decoder i mod workers (each sorts its
    share by length into batches). Like ``Ct2Translator``, the processes live only between ``load``
    (which also translates a warm-up batch on each) and ``unload``."""

    def __init__(self, model_dir: str, speedups: CpuSpeedups, split: Split, cfg: SearchConfig,
                 shortlist: tuple[str, int, int] | None = None) -> None:
        """``shortlist``: (table URL, top M, top N) each decoder loads and decodes with."""
        self.model_dir, self.speedups, self.split, self.cfg, self.shortlist = model_dir, speedups, split, cfg, shortlist
        self._pools: list[ProcessPoolExecutor] = []

    def load(self, warmup: list[str] = ()) -> None:
        if not self._pools:
            spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited thread pools
            self._pools = [ProcessPoolExecutor(1, mp_context=spawn, initializer=_load_decoder,
                                               initargs=(self.model_dir, self.split.threads, self.speedups, self.shortlist))
                           for _ in range(self.split.workers)]
            if warmup:
                for done in [pool.submit(_decode, list(warmup), self.cfg) for pool in self._pools]:
                    done.result()

    def unload(self) -> None:
        for pool in self._pools:
            pool.shutdown()
        self._pools = []

    def pids(self) -> list[int]:
        """The decoder processes, while loaded (``benchmarks.parts``' perf runs)."""
        return [pool.submit(os.getpid).result() for pool in self._pools]

    def __call__(self, lines: list[str]) -> list[str]:
        self.load()
        n = len(self._pools)
        shares = [pool.submit(_decode, lines[i::n], self.cfg) for i, pool in enumerate(self._pools)]
        out = [""] * len(lines)
        for i, share in enumerate(shares):
            out[i::n] = share.result()
        return out


def in_length_order(lines: list[str], batch_size: int, translate_batch: Translate) -> list[str]:
    """``translate_batch`` over batches of ``batch_size`` lines sorted by length; results in input order."""
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    out = [""] * len(lines)
    for start in range(0, len(order), batch_size):
        idx = order[start: start + batch_size]
        for i, text in zip(idx, translate_batch([lines[i] for i in idx])):
            out[i] = text
    return out


def hf_system(model_dir: str, cfg: SearchConfig, batch_size: int = 32) -> Translate:
    """HF ``MarianMTModel.generate``, inputs sorted by length, batches of ``batch_size``."""
    import transformers

    tok = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def translate_batch(batch_lines: list[str]) -> list[str]:
        batch = tok(batch_lines, return_tensors="pt", padding=True)
        with torch.inference_mode():
            seqs = model.generate(**batch, num_beams=cfg.beam_size, length_penalty=cfg.length_penalty,
                                  max_new_tokens=cfg.max_decoding_length, do_sample=False,
                                  bad_words_ids=[[model.config.pad_token_id]])
        return tok.batch_decode(seqs, skip_special_tokens=True)

    def translate(lines: list[str]) -> list[str]:
        return in_length_order(lines, batch_size, translate_batch)
    return translate


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(systems: list[PeerRun], lines: list[str], repeats: int, warmup_lines: int = 16) -> None:
    for system in systems:  # warm-up, excluded; peak-RSS growth is attributed to the first system reaching it
        before = peak_rss_mb()
        system.translate(lines[:warmup_lines])
        system.unload()
        system.rss_growth_mb = peak_rss_mb() - before
    for _ in range(repeats):
        for system in systems:
            before = peak_rss_mb()
            system.load(lines[:warmup_lines])
            start = time.perf_counter()
            system.outputs = system.translate(lines)
            system.seconds.append(time.perf_counter() - start)
            system.unload()
            system.rss_growth_mb += peak_rss_mb() - before
            logger.info("%s: %.2fs", system.name, system.seconds[-1])


def rows(systems: list[PeerRun], references: list[str], count_tokens: Callable[[str], int]) -> list[dict]:
    out = []
    for s in systems:
        tokens = sum(count_tokens(t) for t in s.outputs)
        rates = [tokens / sec for sec in s.seconds]
        out.append({"system": s.name, "tokens_per_s": round(statistics.median(rates), 1),
                    "spread": f"{min(rates):.0f}-{max(rates):.0f}", "target_tokens": tokens,
                    "bleu": round(sacrebleu.corpus_bleu(s.outputs, [references]).score, 2),
                    "peak_rss_growth_mb": round(s.rss_growth_mb, 1)})
    return out


@dataclass(frozen=True, slots=True)
class GemmProbe:
    """The machine's measured float32 GEMM rate (GFLOP/s) at the bench's thread count, two ways.

    ``torch_matmul``: torch's default BLAS call (MKL on x86 wheels). On AMD CPUs MKL takes a
    generic path far from the hardware's rate (2 Zen 5 cores: ~100-210 GFLOP/s at 1024^3);
    ``onednn``: oneDNN's prepacked linear kernel, the one our float32 layers run (``PackedLinear``),
    which uses the CPU's widest FMA (~480-500 GFLOP/s there; 0 where torch lacks oneDNN). ``peak``:
    the faster; efficiency is measured against it, as no decoder can beat the GEMM it runs on."""

    torch_matmul: float
    onednn: float

    @property
    def peak(self) -> float:
        return max(self.torch_matmul, self.onednn)


def _best_rate(call: Callable[[], object], flops: float, seconds: float, windows: int = 5) -> float:
    """The best of ``windows`` timing windows (a shared machine's noise only ever slows a window)."""
    for _ in range(2):
        call()
    best = 0.0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / windows:
            call()
            count += 1
        best = max(best, flops * count / (time.perf_counter() - start) / 1e9)
    return best


def gemm_probe(threads: int, size: int = 1024, seconds: float = 1.0) -> GemmProbe:
    """Time (size, size) x (size, size) float32 products at ``threads`` threads, both kernels."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, w = torch.randn(size, size), torch.randn(size, size)
        flops = 2 * size ** 3
        mkl = _best_rate(lambda: a @ w.t(), flops, seconds)
        onednn = 0.0
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=size)
            onednn = _best_rate(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""),
                                flops, seconds)
    finally:
        torch.set_num_threads(previous)
    return GemmProbe(torch_matmul=mkl, onednn=onednn)


def work_dir() -> str:
    return tempfile.mkdtemp(prefix="raymt-bench-")
