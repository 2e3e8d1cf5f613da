"""A decoder actor builds one runner (through its Translator; its in-actor encoder shares only the
tokenizer) and every work unit reuses it: one KV cache for the actor's life, not one per unit."""
from __future__ import annotations


def test_a_decoder_worker_reuses_one_runner_for_every_unit(demo_model_dir, tmp_path):
    from raymt.pipeline.orchestration.actors import DecoderSettings, DecoderWorker
    from raymt.pipeline.orchestration.units import Columns, plan_units
    from raymt.workers.config import SearchConfig
    from raymt.workers.decoder.decode_config import DecodeConfig, RuntimeConfig

    src = tmp_path / "in.txt"  # the longest sentence first: the later units fit the cache it sized
    src.write_text("Zwei Männer spielen Fußball im Park.\nEin Hund läuft.\nEine Frau liest.\nEin Kind lacht.\n")
    units = plan_units(str(src), Columns(), 1).units
    settings = DecoderSettings(model=str(demo_model_dir), output=str(tmp_path / "out"), signature="runner-test",
                               decode=DecodeConfig(SearchConfig(beam_size=2), runtime=RuntimeConfig(threads=1)))
    worker = DecoderWorker(settings, Columns())
    try:
        stats = worker.decode(units[:1])
        runner = worker.translator.runner
        stats += worker.decode(units[1:])
    finally:
        worker.sampler.close()
    assert [s.sentences for s in stats] == [1, 1, 1, 1]
    assert worker.translator.runner is runner and worker.encoder.tokenizer is worker.translator.checkpoint.tokenizer
    assert runner.counts.caches == 1 and runner.counts.states == 1  # four units, one allocation
