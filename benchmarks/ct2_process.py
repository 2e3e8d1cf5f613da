"""CTranslate2 in a process of its own, where torch is never imported (benchmarks only).

    python -m benchmarks.ct2_process      # spoken to over stdin / stdout by ``Ct2Process``

On an AMD EPYC (Zen 5, 2 threads) CTranslate2 translated Multi30k test2016 greedily in 2.0-2.2 s
alone in a process, and in 4.9-6.3 s in a process where torch had run one parallel operator
(importing torch alone did not slow it; ``OMP_WAIT_POLICY=PASSIVE`` did not help): the two
libraries' OpenMP runtimes (each wheel bundles its own libgomp) share the cores. A user of
CTranslate2 runs it without torch, so the bench does too. This module imports nothing but the
standard library and ``ctranslate2``: keep it that way.

Protocol (pickles on the pipes): the parent sends ``(path, compute_type, intra_threads, inter_threads)``
(``inter_threads`` batches translated at once, each on ``intra_threads`` threads); the child
answers ``{"torch_loaded": bool}`` once the model is loaded, then, for each ``(pieces, options)``
request, the best hypothesis's pieces for every source. EOF on stdin ends the child.
"""
from __future__ import annotations

import pickle
import subprocess
import sys


class Ct2Process:
    """A ``ctranslate2.Translator`` in a child process; ``close()`` ends it (and its thread pool)."""

    def __init__(self, path: str, compute_type: str, threads: int, inter_threads: int = 1) -> None:
        self._child = subprocess.Popen([sys.executable, "-m", "benchmarks.ct2_process"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE)
        self.ready = self._ask((path, compute_type, threads, inter_threads))

    def _ask(self, message: object) -> object:
        pickle.dump(message, self._child.stdin)
        self._child.stdin.flush()
        try:
            return pickle.load(self._child.stdout)
        except EOFError:
            code = self._child.wait()
            raise RuntimeError(f"the CTranslate2 process ended (exit code {code}); see its stderr") from None

    @property
    def pid(self) -> int:
        return self._child.pid

    def translate_batch(self, pieces: list[list[str]], **options) -> list[list[str]]:
        return self._ask((pieces, options))

    def close(self) -> None:
        self._child.stdin.close()
        self._child.wait()
        self._child.stdout.close()


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    import ctranslate2

    path, compute_type, intra_threads, inter_threads = pickle.load(inp)
    translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, intra_threads=intra_threads,
                                        inter_threads=inter_threads)
    pickle.dump({"torch_loaded": "torch" in sys.modules}, out)
    out.flush()
    while True:
        try:
            pieces, options = pickle.load(inp)
        except EOFError:
            return
        results = translator.translate_batch(pieces, **options)
        pickle.dump([r.hypotheses[0] for r in results], out)
        out.flush()


if __name__ == "__main__":
    main()
