"""Pure decoding math: model, checkpoint I/O, tokenizer, search. No ray, fsspec-free math modules."""
