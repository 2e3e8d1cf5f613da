"""Text <-> token ids: the sentencepiece tokenizers that match HF's (``tokenizer``, ``tokenizer_json``, ``lang_tokenizer``), a row cut into sentences and rejoined with its whitespace (``sentences``), bad cells as per-row statuses (``inputs``) and the one path from cells to decoder pieces and back (``rows``).

No torch; imports ``raymt.workers.config`` and the search's hypothesis type only."""
