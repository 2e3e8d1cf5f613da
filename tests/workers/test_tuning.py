"""Closed-loop batch size: the tuner driven by a throughput curve (no model), and the translator's
split-and-retry when a batch runs out of memory (and its fall-back to batches when streaming does)."""
from __future__ import annotations

import pytest
import torch

from raymt.workers.config import SearchConfig
from raymt.workers.decoder.decode_config import DecodeRequest
from raymt.workers.decoder.scheduler import Policy, SchedulerConfig
from raymt.workers.search.shortlist import LexicalTable, Shortlist
from raymt.workers.decoder.core_decoder import CoreDecoder
from raymt.workers.decoder.tuning import BatchTuner, TunerConfig, bytes_per_sentence, fit_slots


def drive(tuner: BatchTuner, rate, batches: int) -> list[int]:
    sizes = []
    for _ in range(batches):
        n = tuner.next_size()
        sizes.append(n)
        tuner.record(n, tokens=int(rate(n) * 10), seconds=10.0)
    return sizes


def peaked(n: int) -> float:
    return n / (1 + (n / 48) ** 2)  # tokens/s, best near 48 sentences


def test_climbs_to_the_best_size_then_holds_it() -> None:
    tuner = BatchTuner(TunerConfig(start=8, pairs=2, settle_batches=1000))
    sizes = drive(tuner, peaked, 60)
    assert tuner.size == 64  # of 8, 16, 32, 64, 128: peaked(64) is the largest
    assert sizes[-20:] == [64] * 20  # settled: no more trials
    assert set(sizes) == {8, 16, 32, 64, 128}  # 128 was tried and lost, then 32 (down) lost


def test_walks_down_when_smaller_batches_win() -> None:
    tuner = BatchTuner(TunerConfig(start=128, pairs=2, settle_batches=1000))
    drive(tuner, lambda n: 1000 / n, 80)  # per-batch overhead-free, cost grows with n: small wins
    assert tuner.size == 1


def test_search_restarts_after_settling() -> None:
    tuner = BatchTuner(TunerConfig(start=16, pairs=1, settle_batches=5))
    drive(tuner, lambda n: 100.0, 30)  # flat: nothing wins; every 5 settled batches it probes again
    assert tuner.size == 16
    assert sum(1 for s, _ in tuner.history if s != 16) >= 4


def test_out_of_memory_caps_every_later_size() -> None:
    tuner = BatchTuner(TunerConfig(start=64, pairs=1))
    tuner.out_of_memory(64)
    assert tuner.size == 32 and tuner.cap == 32
    assert max(drive(tuner, lambda n: float(n), 40)) <= 32  # bigger always "wins" but never exceeds the cap


def test_memory_limit_caps_the_size() -> None:
    per = bytes_per_sentence(layers=3, d_model=256, vocab=8000, beam=5, max_target=256, max_source=512)
    assert per == 5 * (3 * 2 * 256 * 768 + 16000) * 4
    tuner = BatchTuner(TunerConfig(start=64))
    tuner.limit_memory(free_bytes=per * 40, bytes_per_sentence=per)  # half of it: 20 sentences
    assert tuner.cap == 20 and tuner.size == 20


def test_slots_fit_half_the_free_memory() -> None:
    assert fit_slots(1024, free_bytes=100 * 2**20, bytes_per_slot=2**20) == 50
    assert fit_slots(32, free_bytes=100 * 2**20, bytes_per_slot=2**20) == 32  # fits: as asked
    assert fit_slots(1024, free_bytes=0, bytes_per_slot=2**20) == 1  # never none


def test_a_gpu_decode_fits_its_slots_to_free_memory_with_the_same_output(demo_model_dir, monkeypatch) -> None:
    """``CoreDecoder._fit_to_memory`` (called on a CUDA device only; here on the CPU with the CUDA
    query answered): the slots shrink to what fits, sized by the call's longest sentence (its source
    at the cache's rounded capacity)."""
    from raymt.workers.model import graphs
    from raymt.workers.decoder.runner import source_capacity

    tr = CoreDecoder.load(str(demo_model_dir))
    texts = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
             "Kinder spielen im Park.", "Ein Mann fährt Fahrrad.", "Eine Katze schläft."]
    sources, cfg = tr.encode(texts), SearchConfig(beam_size=3)
    topup = SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=1024, capacity=1024)
    mc = tr.checkpoint.model.config
    longest = max(map(len, sources))
    per = bytes_per_sentence(layers=mc.decoder_layers, d_model=mc.d_model, vocab=mc.decoder_vocab_size, beam=3,
                             max_target=cfg.max_length_for(longest) + 1,
                             max_source=source_capacity(longest, mc.max_position_embeddings))
    monkeypatch.setattr(graphs, "free_memory", lambda device: 5 * per)
    fitted = tr._fit_to_memory(topup, sources, cfg, None)
    assert (fitted.max_batch_sentences, fitted.capacity) == (2, 2)  # half of 5 slots' worth
    expected = tr.decode_ids(sources, DecodeRequest(cfg, schedule=topup)).hypotheses
    assert [h[0].tokens for h in tr.decode_ids(sources, DecodeRequest(cfg, schedule=fitted)).hypotheses] == \
        [h[0].tokens for h in expected]
    monkeypatch.setattr(graphs, "free_memory", lambda device: 10**12)
    assert tr._fit_to_memory(topup, sources, cfg, None) is topup  # fits: unchanged


def test_batch_out_of_memory_is_split_and_retried_with_identical_output(demo_model_dir, monkeypatch) -> None:
    texts = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
             "Kinder spielen im Park.", "Ein Mann fährt Fahrrad.", "Eine Katze schläft."]
    cfg = SearchConfig(beam_size=3)
    expected = [t.text for t in CoreDecoder.load(str(demo_model_dir), max_batch_size=2).translate(texts, cfg)]
    real = CoreDecoder._search
    seen = []

    def limited(self, sources, *args, **kwargs):  # a device that holds at most 2 sentences
        seen.append(len(sources))
        if len(sources) > 2:
            raise torch.OutOfMemoryError("injected: batch too large")
        return real(self, sources, *args, **kwargs)

    monkeypatch.setattr(CoreDecoder, "_search", limited)
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=6)
    tuner = tr.tune_batches(cfg, TunerConfig(start=6, pairs=1))
    assert [t.text for t in tr.translate(texts, cfg)] == expected
    assert seen[:3] == [6, 3, 1] and tuner.cap == 1  # 6 -> halves of 3 -> 1 + 2; the cap follows the failures


def test_streaming_out_of_memory_falls_back_to_batches_with_identical_output(demo_model_dir, monkeypatch,
                                                                           caplog) -> None:
    texts = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau liest ein Buch.",
             "Kinder spielen im Park.", "Ein Mann fährt Fahrrad."]
    cfg, topup = SearchConfig(beam_size=3), SchedulerConfig(policy=Policy.TOPUP, max_batch_sentences=4)
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=2)
    expected = [t.text for t in tr.translate(texts, cfg, batching=topup)]

    def full(*args, **kwargs):  # the streaming engine's slots do not fit
        raise torch.OutOfMemoryError("injected: slots too large")

    monkeypatch.setattr(CoreDecoder, "_stream", full)
    with caplog.at_level("WARNING"):
        assert [t.text for t in tr.translate(texts, cfg, batching=topup)] == expected
    assert "decoding them in batches instead" in caplog.text
    shortlist = Shortlist(LexicalTable({}, list(range(8001))), top_m=0, top_n=8001, special_ids=(0,))
    # (a shortlist's candidate set is per call: batches could decode differently, so no fallback)
    with pytest.raises(torch.OutOfMemoryError):
        tr.translate(texts, cfg, shortlist, batching=topup)


def test_a_single_sentence_that_does_not_fit_is_an_error_not_a_loop(demo_model_dir, monkeypatch) -> None:
    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("injected: nothing fits")

    monkeypatch.setattr(CoreDecoder, "_search", full)
    tr = CoreDecoder.load(str(demo_model_dir), max_batch_size=4)
    with pytest.raises(torch.OutOfMemoryError):
        tr.translate(["Ein Hund.", "Eine Katze.", "Ein Mann.", "Eine Frau."], SearchConfig(beam_size=2))
