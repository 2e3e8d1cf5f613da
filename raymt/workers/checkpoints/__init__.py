"""Model directories on local disk -> a loaded model and its tokenizer: HF Marian / OPUS-MT (``checkpoint``), Marian ``.npz`` (``marian_npz``), M2M100 / NLLB-200 (``m2m100``), what every HF ``config.json`` shares (``hf_config``), which reader serves a directory (``model_formats``) and a directory's own generation settings (``generation``).

Imports ``raymt.workers.model.model``, ``raymt.workers.text`` and ``raymt.workers.config``; no ray, fsspec or pyarrow (files on object storage are fetched by ``raymt.pipeline.storage``)."""
