"""Hugging Face hub ids as models: ``--model Helsinki-NLP/opus-mt-de-en`` or ``org/name@revision``.

    resolve_model("models/demo-de-en")           # ResolvedModel(path='models/demo-de-en'): as given
    resolve_model("Helsinki-NLP/opus-mt-de-en")  # repo_id='Helsinki-NLP/opus-mt-de-en', commit='<40 hex>',
                                                 # path='<cache>/models--Helsinki-NLP--opus-mt-de-en/snapshots/<commit>'

A model argument is, in this order: a path that exists (a directory named like an id wins over the
id); a URL (it has ``://``); ``org/name[@revision]``, a hub id (``revision``: a branch, tag or
commit; ``main`` when left out); anything else a path, whose absence the model check names. A hub
id is fetched by ``huggingface_hub`` into its cache, as every HF tool does: ``HF_HOME`` /
``HF_HUB_CACHE`` say where, ``HF_TOKEN`` opens private and gated repositories, ``HF_ENDPOINT`` names
a mirror, ``HF_HUB_OFFLINE=1`` reads the cache without a request. Only the files a loader reads are
fetched (``ALLOW_PATTERNS``; a repository holding both weight files gets both, and
``model.safetensors`` is the one read). A fetch that cannot be done is one line (``HubError``)
naming the id and, where the files are not in the cache, the cache.

A resolved model is pinned to a commit, whose files never change: ``ref`` (``org/name@<commit>``)
names the same bytes on every machine, and a plan names its files ``hf://org/name@<commit>/<file>``
(``url``) whatever a machine's cache path. On Ray the driver resolves the id once, before planning
(``pipeline/orchestration/run.py``; a resumed output keeps the commit its plan recorded), and each node fetches
that commit into its own cache when an encoder or decoder actor starts (``pipeline/storage.py``
``model_reader``), the plan's SHA-256 pins checking every byte a decoder loads. Per-node fetching
is chosen over the driver staging the files into the output's store: a node's cache outlives the
job (a restarted actor, the next job, another output read nothing again), where staging would copy
the weights, up to gigabytes, into every output, as files the output's records must then own; a
cluster whose nodes hold the files already (a warmed image, a shared ``HF_HOME``) runs with
``HF_HUB_OFFLINE=1`` and no upload at all. Each node then needs the hub or the files in its cache:
one with neither fails its actors with the line naming the id and its cache.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Iterable

logger = logging.getLogger(__name__)

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)"
                    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]*))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ALLOW_PATTERNS = (  # what the loaders read (pipeline/outputs/ledger.py MODEL_FILES and the tokenizers' own files)
    "config.json", "generation_config.json", "model.safetensors", "pytorch_model.bin",
    "source.spm", "target.spm", "vocab.json", "target_vocab.json",  # Marian / OPUS-MT
    "sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",  # M2M100 / NLLB
    "decoder.yml", "*.npz", "*.yml", "*.spm",  # a Marian .npz directory (decoder.yml names its model and vocabularies)
)
IGNORE_PATTERNS = ("*/*", "*.optimizer.npz")  # subfolders (onnx/, ...), Marian's optimizer state
WORKER_VARS = ("HF_TOKEN", "HF_ENDPOINT")  # passed to Ray's workers (pipeline/orchestration/run.py); caches are each node's own


class HubError(ValueError):
    """A hub id that cannot be fetched (or found in the cache, offline), in one line."""


@dataclass(frozen=True, slots=True)
class HubId:
    repo_id: str  # org/name
    revision: str | None = None  # a branch, tag or commit; None: main


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model argument resolved on this machine: its ``path`` (as given, or a hub snapshot's
    directory in this machine's cache) and, for a hub model, its repository and commit."""

    path: str
    repo_id: str | None = None
    commit: str | None = None  # the 40-hex commit the hub's files were fetched at

    @property
    def hub(self) -> bool:
        return self.repo_id is not None

    @property
    def ref(self) -> str:
        """What names this model on another machine (a Ray actor's): ``org/name@<commit>`` for a hub
        model; else the path, a relative one shaped like an id spelled ``./`` (never read as an id)."""
        if self.hub:
            return f"{self.repo_id}@{self.commit}"
        return f"./{self.path}" if HUB_ID.match(self.path) else self.path

    @property
    def url(self) -> str:
        """How a plan names the model's files: ``hf://org/name@<commit>`` for a hub model, else the path."""
        return f"hf://{self.ref}" if self.hub else self.path


def hub_id(arg: str) -> HubId | None:
    """``arg`` as a hub id; None for a path that exists, a URL or any other shape (no request made)."""
    if "://" in arg or os.path.exists(arg):
        return None
    m = HUB_ID.match(arg)
    return HubId(m["repo"], m["revision"]) if m else None


def resolve_model(arg: str, revision: str | None = None, recorded: Iterable[str] = ()) -> ResolvedModel:
    """``arg`` resolved on this machine: a hub id fetched into the hub cache at ``revision``, else the
    id's own, else the commit of its files among ``recorded`` (a plan's model file names: a resumed
    job keeps its commit), else ``main``; any other argument as it is. Raises ``HubError`` (one line)
    when the id cannot be fetched."""
    ref = hub_id(arg)
    if ref is None:
        return ResolvedModel(arg)
    if not (revision := revision or ref.revision) and (revision := recorded_commit(recorded, ref.repo_id)):
        logger.info("model %s: at commit %s, as the output's plan recorded", arg, revision)
    try:
        path = _snapshot(ref.repo_id, revision)
    except Exception as e:  # noqa: BLE001 - every failure of the fetch is one line naming the id
        logger.debug("fetching %s failed", arg, exc_info=True)
        raise HubError(_why(arg, ref.repo_id, revision, e)) from None
    model = ResolvedModel(path, ref.repo_id, os.path.basename(os.path.normpath(path)))
    logger.log(logging.DEBUG if revision == model.commit else logging.INFO,  # (an actor's pinned fetch: quiet)
               "model %s: %s at commit %s (%s)", arg, model.repo_id, model.commit, model.path)
    return model


def _snapshot(repo_id: str, revision: str | None) -> str:
    """The snapshot directory of ``repo_id`` at ``revision``, fetched as needed; a commit (its files
    never change) is looked up in the cache first, so a node that holds it sends no request."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    kwargs = {"allow_patterns": list(ALLOW_PATTERNS), "ignore_patterns": list(IGNORE_PATTERNS)}
    if revision and COMMIT.match(revision):
        try:
            return snapshot_download(repo_id, revision=revision, local_files_only=True, **kwargs)
        except LocalEntryNotFoundError:
            pass
    return snapshot_download(repo_id, revision=revision, **kwargs)


def _why(arg: str, repo_id: str, revision: str | None, e: Exception) -> str:
    """The one line a failed fetch is reported in."""
    from huggingface_hub import constants, errors
    at = f" at {revision}" if revision else ""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if isinstance(e, errors.LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        return (f"model {arg}: no such directory here, and the Hugging Face hub cache {constants.HF_HUB_CACHE} "
                f"holds no complete copy of {repo_id}{at} ({why}): fetch it where the hub can be reached "
                f"(hf download {repo_id}), or pass a model directory")
    if isinstance(e, errors.GatedRepoError):
        return f"model {arg}: {repo_id} is gated on the Hugging Face hub: accept its terms there and set HF_TOKEN"
    if isinstance(e, errors.RepositoryNotFoundError):
        return (f"model {arg}: no such directory here, and no model repository {repo_id} on the Hugging Face hub "
                f"(a private one needs HF_TOKEN)")
    if isinstance(e, errors.RevisionNotFoundError):
        return f"model {arg}: {repo_id} has no revision {revision} on the Hugging Face hub"
    if isinstance(e, errors.HFValidationError):
        return f"model {arg}: no such directory here, and not a Hugging Face hub id: {first}"
    return f"model {arg}: fetching {repo_id}{at} from the Hugging Face hub failed: {type(e).__name__}: {first}"


def recorded_commit(paths: Iterable[str], repo_id: str) -> str | None:
    """The commit of ``repo_id`` a plan's model files were recorded at (``hf://org/name@<commit>/...``)."""
    prefix = f"hf://{repo_id}@"
    return next((p[len(prefix):].split("/", 1)[0] for p in paths if p.startswith(prefix)), None)
