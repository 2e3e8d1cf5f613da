"""Translate a stream of lines in this process, without Ray: ``--input -`` (standard input) and / or
``--output -`` (standard output), for small jobs and shell pipelines::

    echo "Ein Hund läuft." | raymt translate --model models/demo-de-en --input - --output -

Lines are read ``batch_rows`` at a time and each batch goes the job's own way: the same row path
(``workers/text/rows.py``: cleaning, statuses, cutting to fit), the same ``DecodeConfig`` (search, batching,
speed-ups) on one ``Translator``, the same part table (``pipeline/orchestration/actors.decoded_table``) and the same
line writers (``pipeline/writers.py``), so a line translates as the Ray job translates it. Output
goes in input order, flushed after every batch; logs go to standard error only. A file on the
other side is read or written as its name says (text, TSV, JSON lines, compressed); a file output
is written whole at the end (``storage.open_whole``). There is no ledger: an interrupted stream is
rerun, not resumed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import IO, Callable, Iterable, Iterator

import fsspec

from raymt.pipeline.orchestration.actors import EncoderWorker, decoded_table, piece_targets
from raymt.pipeline.formats import OutputFormat, output_format
from raymt.pipeline.inputs.input_formats import input_format
from raymt.pipeline.inputs.line_inputs import TEXT
from raymt.pipeline.orchestration.settings import DecoderSettings
from raymt.pipeline.outputs.sink import compressed_writer
from raymt.pipeline.decoders.loading import load_decoder
from raymt.pipeline.outputs.guards import OutputRefused
from raymt.pipeline.storage import open_whole, storage_options
from raymt.pipeline.inputs.textfiles import open_lines
from raymt.pipeline.orchestration.units import Columns, InputError, WorkUnit
from raymt.pipeline.inputs.workunit import InputFormat
from raymt.pipeline.writers import lines_of

logger = logging.getLogger(__name__)
STDIO = "-"


@dataclass
class StreamResult:
    rows: int = 0
    target_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


def stream_format(url: str) -> InputFormat:
    """The line format of the stream's file side (``-``: plain text); a format that is not read line
    by line (Parquet, CSV) is refused."""
    if url == STDIO:
        return TEXT
    fmt = input_format(url)
    if fmt.from_lines is None:
        raise InputError(f"{url}: a {'Parquet' if fmt.name == 'parquet' else fmt.name.upper()} input is translated by "
                         f"the job, not as a stream; name an --output file or directory instead of '-'")
    return fmt


def batches(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """Lines (newline and a first byte-order mark stripped) ``size`` at a time."""
    batch: list[bytes] = []
    for k, line in enumerate(lines):
        line = line.rstrip(b"\n").rstrip(b"\r")
        batch.append(line[3:] if k == 0 and line.startswith(b"\xef\xbb\xbf") else line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class StreamTranslator:
    """One ``Translator`` and the job's settings: a batch of lines -> its output lines."""

    def __init__(self, settings: DecoderSettings, columns: Columns, fmt: OutputFormat) -> None:
        self.settings, self.columns, self.fmt = settings, columns, fmt
        loaded = load_decoder(settings.model, settings.decode)
        self.translator, self.request = loaded.translator, settings.decode.request(loaded.shortlist)
        self.encoder = EncoderWorker(self.translator, columns, settings.source_lang, settings.target_lang,
                                     settings.decode.max_row_chars, settings.decode.split_sentences)
        if not columns.target_lang:  # (a missing or unknown language: one line, here)
            self.translator.forced_first(settings.target_lang, 1)

    def lines(self, batch: list[bytes], offset: int, fmt: InputFormat, result: StreamResult) -> str:
        """The output lines of input lines ``offset:offset + len(batch)`` (rows numbered from ``offset``)."""
        unit = WorkUnit(f"stream-{offset}", f"stream.{'txt' if fmt.name == 'text' else fmt.name}", offset,
                        offset + len(batch), offset, None)
        enc = self.encoder.encode_rows(unit, fmt.from_lines(batch, self.columns, list(range(offset, offset + len(batch)))))
        s = self.settings
        decoded = self.translator.decode_ids(enc.pieces, self.request,
                                             forced_first=self.translator.forced_first(piece_targets(enc, s.target_lang),
                                                                                       len(enc.pieces)))
        table, _ = decoded_table(enc, decoded.hypotheses, self.translator.checkpoint.tokenizer, s.signature)
        result.rows += len(batch)
        result.target_tokens += decoded.stats.target_tokens
        for status in enc.statuses:
            result.statuses[status] = result.statuses.get(status, 0) + 1
        return lines_of(table, self.fmt)


def translate_stream(input_url: str, output_url: str, settings: DecoderSettings, columns: Columns, *,
                     stdin: IO[bytes], stdout: IO[bytes], batch_rows: int = 64, overwrite: bool = False) -> StreamResult:
    """Translate ``input_url`` (``-``: ``stdin``) into ``output_url`` (``-``: ``stdout``, flushed per batch).
    A stream keeps no records, so an existing output file is replaced only with ``overwrite``."""
    source = stream_format(input_url)
    if output_url != STDIO and not overwrite:
        fs, path = fsspec.core.url_to_fs(output_url, **storage_options(output_url))
        if fs.exists(path):
            raise OutputRefused(f"--output {output_url} exists (a stream keeps no record that raymt wrote it): pass "
                                f"--overwrite to replace it, or choose another --output")
    nbest = settings.decode.search.num_hypotheses
    fmt = OutputFormat("text", nbest=nbest, text_name=columns.text) if output_url == STDIO \
        else output_format(output_url, nbest, columns.text)
    if fmt.kind == "parquet":
        raise InputError(f"--output {output_url}: a stream writes lines (text, .tsv, .jsonl); Parquet output needs "
                         f"a file --input, translated by the job")
    worker, result = StreamTranslator(settings, columns, fmt), StreamResult()

    def run(lines: Iterable[bytes], write: Callable[[bytes], None]) -> None:
        for batch in batches(lines, batch_rows):
            write(worker.lines(batch, result.rows, source, result).encode())

    def to_output(lines: Iterable[bytes]) -> None:
        if output_url == STDIO:
            run(lines, lambda data: (stdout.write(data), stdout.flush()))
            return
        fs, path = fsspec.core.url_to_fs(output_url, **storage_options(output_url))
        with open_whole(fs, path) as raw, compressed_writer(raw, fmt.compression) as out:
            run(lines, out.write)

    if input_url == STDIO:
        to_output(stdin)
    else:
        with open_lines(input_url) as f:
            to_output(f)
    logger.info("translated %d lines from %s to %s", result.rows, input_url, output_url)
    return result
