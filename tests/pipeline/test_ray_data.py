"""``raymt.ray_data.Translate`` on a real local Ray cluster: read_parquet -> map_batches -> write_parquet."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymt.ray_data import ERROR_COLUMN, Translate
from raymt.workers.config import SearchConfig
from raymt.workers.decoder.core_decoder import CoreDecoder
from tests.pipeline.ray_helpers import clean_corpus, start_ray, write_corpus

SEARCH = SearchConfig(beam_size=2)


@pytest.fixture(scope="module")
def cluster():
    import ray
    address = start_ray(num_cpus=2)
    yield address
    ray.shutdown()


@pytest.mark.parametrize("batch_format", ["pyarrow", "pandas", "numpy"])
def test_map_batches_translates_one_column_and_keeps_the_others(cluster, demo_model_dir, tmp_path, batch_format):
    import ray
    texts = clean_corpus(40)
    texts[3], texts[17] = "", None
    ids = [f"r{i:04d}" for i in range(len(texts))]
    src, scores = tmp_path / "in", [i / 4 for i in range(len(texts))]
    src.mkdir()
    for part, rows in enumerate((slice(0, 20), slice(20, None))):  # a corpus of two files
        write_corpus(src / f"part{part}.parquet", texts[rows], ids[rows], score=pa.array(scores[rows]))
    ds = ray.data.read_parquet(str(src)).repartition(2).map_batches(
        Translate, fn_constructor_kwargs={"model": str(demo_model_dir), "column": "text", "search": SEARCH,
                                          "threads": 1},
        batch_format=batch_format, batch_size=16, concurrency=2, num_cpus=0.5)
    ds.write_parquet(str(tmp_path / "out"))

    table = pq.read_table(tmp_path / "out").to_pylist()
    rows = {r["id"]: r for r in table}
    assert sorted(rows) == ids and len(table) == len(ids), "every row exactly once"
    good = [i for i, t in enumerate(texts) if t]
    expected = CoreDecoder.load(str(demo_model_dir)).translate([texts[i] for i in good], SEARCH)
    for i, t in zip(good, expected):
        row = rows[ids[i]]
        assert (row["text"], row["score"]) == (texts[i], i / 4), "other columns pass through"
        assert row["translation"] == t.text
        assert row[ERROR_COLUMN] is None
    assert (rows["r0003"]["translation"], rows["r0003"][ERROR_COLUMN]) == ("", "empty")
    assert (rows["r0017"]["translation"], rows["r0017"][ERROR_COLUMN]) == ("", "null")


@pytest.mark.parametrize("search", [dict(sampling=dict(temperature=float("inf"))),
                                    dict(sampling=dict(temperature=1e-300)), dict(sampling=dict(topp=float("nan"))),
                                    dict(beam_size=100_000), dict(beam_size=100_000, sampling={})])
def test_search_values_the_decoder_cannot_use_raise_before_any_dataset_runs(demo_model_dir, search):
    """The operator's search is a ``SearchConfig``: built on the driver, it refuses such values in
    one ``ValueError`` before ``map_batches`` is reached, so no actor starts and no block is read."""
    from raymt.workers.config import SamplingConfig

    class Dataset:  # (stands in for ray.data.Dataset: records the calls that reach it)
        calls: list = []

        def map_batches(self, fn, **kwargs):
            self.calls.append((fn, kwargs))

    def build() -> SearchConfig:
        sampling = search.get("sampling")
        return SearchConfig(beam_size=search.get("beam_size", 2), num_hypotheses=1,
                            sampling=None if sampling is None else SamplingConfig(**sampling))
    with pytest.raises(ValueError, match=r"^(sampling temperature|sampling top-p|beam_size|num_samples) .* got ") as e:
        Dataset().map_batches(Translate, fn_constructor_kwargs={"model": str(demo_model_dir), "search": build()})
    assert "\n" not in str(e.value) and Dataset.calls == []


def test_output_column_name_and_per_actor_stats_without_ray(demo_model_dir, one_thread):
    op = Translate(str(demo_model_dir), "src", output_column="en", search=SEARCH)
    out = op(pa.table({"src": ["Ein Hund läuft.", "   ", "Zwei Hunde spielen."], "n": [1, 2, 3]}))
    assert out.column_names == ["src", "n", "en", ERROR_COLUMN]
    assert out.column("en").to_pylist() == op.translator.translate(["Ein Hund läuft.", "", "Zwei Hunde spielen."])
    assert out.column(ERROR_COLUMN).to_pylist() == [None, "empty", None]
    assert op.stats.sentences == 2 and op.stats.target_tokens > 0 and op.stats.seconds > 0
    assert op.translate_texts(["Ein Hund läuft.", 7, float("nan")])[1] == [None, "not a string: int", "null"]
    op.close()


def test_a_cell_over_the_row_limit_is_not_decoded_and_says_why(demo_model_dir, one_thread):
    op = Translate(str(demo_model_dir), search=SEARCH, max_row_chars=20)
    out = op({"text": ["Ein Hund läuft.", "Ein Hund läuft über die Wiese."]})
    assert list(out["translation"]) == ["A dog is running.", ""]
    assert list(out[ERROR_COLUMN]) == [None, "too_long: 30 characters, more than --max-row-chars 20"]
    assert op.stats.sentences == 1
    assert Translate(str(demo_model_dir), search=SEARCH).translate_texts(["x" * 20_001])[1][0].startswith("too_long")
    op.close()


def test_the_default_search_is_the_command_lines(demo_model_dir, one_thread):
    from raymt.workers.decoder.decode_config import DEFAULTS
    op = Translate(str(demo_model_dir))
    assert op.search == DEFAULTS.search and op.device.type == "cpu"
    assert op.batching.slots == DEFAULTS.batching.max_batch_size and op.batching.schedule.policy.value == "topup"


def test_int8_reaches_the_operator(demo_model_dir, one_thread, tmp_path):
    from raymt.pipeline.decoders.api import Translator as Api
    texts = clean_corpus(8)
    op = Translate(str(demo_model_dir), search=SEARCH, compute_type="int8")
    assert op.translate_texts(texts)[0] == Api.load(str(demo_model_dir), compute_type="int8", search=SEARCH).translate(texts)
    with pytest.raises(ValueError, match="compute_type 'int4': choose one of float32, int8"):
        Translate(str(demo_model_dir), compute_type="int4")


def test_a_token_budget_decodes_the_same_translations(demo_model_dir, one_thread):
    texts = clean_corpus(12)
    by_tokens = Translate(str(demo_model_dir), search=SEARCH, max_batch_tokens=64)
    by_sentences = Translate(str(demo_model_dir), search=SEARCH)
    assert by_tokens.translate_texts(texts) == by_sentences.translate_texts(texts)


def test_languages_a_fixed_code_or_a_column_per_row_without_ray(nllb_dir, one_thread):
    """An NLLB model through the operator: a fixed target language or a column of them (pass-through
    columns kept), the same translations as ``raymt.Translator``; an unknown code is that row's
    ``translation_error``; without languages, one error at construction."""
    import raymt
    from raymt.workers.text.lang_tokenizer import LanguageError
    from tests.conftest import shared_path

    lines = shared_path("multi30k", "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:5]
    langs = ["fra_Latn", "eng_Latn", None, "xx_Latn", "ita_Latn"]
    batch = pa.table({"text": lines, "lang": langs, "id": list(range(5))})
    api = raymt.Translator.load(str(nllb_dir), search=SEARCH, threads=1)
    args = {"model": str(nllb_dir), "search": SEARCH, "threads": 1, "source_lang": "deu_Latn"}
    fixed = Translate(**args, target_lang="eng_Latn")(batch)
    assert fixed.column("translation").to_pylist() == api.translate(lines, source_lang="deu_Latn", target_lang="eng_Latn")
    per_row = Translate(**args, target_lang="fra_Latn", target_lang_column="lang")(batch)
    assert per_row.column_names == ["text", "lang", "id", "translation", ERROR_COLUMN]
    good = [0, 1, 2, 4]
    want = api.translate([lines[i] for i in good], source_lang="deu_Latn", target_lang=[langs[i] or "fra_Latn" for i in good])
    out, errors = per_row.column("translation").to_pylist(), per_row.column(ERROR_COLUMN).to_pylist()
    assert [out[i] for i in good] == want and out[3] == "" and out != fixed.column("translation").to_pylist()
    assert errors[3].startswith("unknown target language 'xx_Latn' (202 codes: ") and errors[:3] == [None] * 3
    sources = Translate(model=str(nllb_dir), search=SEARCH, threads=1, source_lang_column="src", target_lang="eng_Latn")(
        pa.table({"text": lines[:2], "src": ["deu_Latn", "fra_Latn"]}))
    assert sources.column("translation").to_pylist() == api.translate(lines[:2], source_lang=["deu_Latn", "fra_Latn"],
                                                                       target_lang="eng_Latn")
    with pytest.raises(LanguageError, match="^Translate: this nllb model needs target_lang.*target_lang_column="):
        Translate(**args)
