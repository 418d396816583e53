"""Typed records of the files one stage writes and a later one reads, each with a format version.

``common.run_layout`` names the files; a record here says what one holds. It is written and read only
through its class, so a renamed field fails where it is declared instead of as a ``KeyError`` in a
later step. A PVC outlives upgrades, and a run on unchanged data finishes the steps of an earlier
run's version: a file an older pipeline wrote is read as written when it holds every field, and one
that lacks a field, or has a format this pipeline does not know, gets one paragraph naming what it
lacks and what to do.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from common.atomic import write_text_atomic
from common.errors import UserError

FORMAT_VERSION = "format_version"


def _json_of(path: Path, what: str, fix: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not the JSON {what} record the pipeline writes ({error}). {fix}") from None


def _versioned(value: Any, path: Path, what: str, version: int, fix: str) -> dict[str, Any]:
    """``value``, the JSON in ``path``, refused unless it says it is format ``version`` of ``what``."""
    found = value.get(FORMAT_VERSION) if isinstance(value, dict) else None
    if found != version:
        written = f"format {found}" if found is not None else "a format without a version"
        raise UserError(
            f"{path} holds {what} in {written}, and this version of the pipeline reads format {version}: an older "
            f"or newer pipeline wrote it. {fix}"
        )
    return value


def record_of(value: dict[str, Any], kind: type, path: Path, what: str, fix: str) -> Any:
    """The JSON object ``value`` as a ``kind`` record, refused with the fields it lacks (``what`` names it)."""
    specs = dataclasses.fields(kind)
    required = {spec.name for spec in specs if dataclasses.MISSING is spec.default is spec.default_factory}
    # a null where the field cannot be None is as good as missing (its annotation is a string: postponed)
    null = {spec.name for spec in specs if value.get(spec.name, "") is None and "None" not in str(spec.type)}
    missing = sorted((required - value.keys()) | (null & required))
    if missing:
        raise UserError(f"{path}: {what} has no {', '.join(missing)}. {fix}")
    return kind(**{spec.name: value[spec.name] for spec in specs if spec.name in value})


def _entries(value: Any, kind: type, path: Path, what: str, fix: str) -> tuple[Any, ...]:
    """``value`` (a list of JSON objects) as ``kind`` records, refused with the fields an entry lacks."""
    return tuple(
        record_of(entry, kind, path, f"entry {number} of its {what}", fix)
        for number, entry in enumerate(_objects(value, path, what, fix), 1)
    )


def _duration(seconds: float | None) -> str:
    """``h:mm:ss``."""
    return str(dt.timedelta(seconds=int(max(seconds or 0, 0))))


def _objects(value: Any, path: Path, what: str, fix: str) -> list[dict[str, Any]]:
    """``value``, refused unless it is a list of JSON objects."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(entry, dict) for entry in value):
        raise UserError(f"{path}: its {what} are not a list of objects. {fix}")
    return list(value)


@dataclass(frozen=True)
class StoredCopy:
    """One place the store step copied a version to: an S3 prefix or an OCI modelcar image."""

    uri: str  # s3://bucket/prefix/model/run-id/, or oci://registry/repository:tag
    files: int
    total_bytes: int
    digest: str | None = None  # an image's manifest sha256: the image exactly, whatever later happens to the tag

    @property
    def scheme(self) -> str:
        """``s3`` or ``oci``."""
        return self.uri.split("://", 1)[0]


class ListFile:
    """A file holding a list of records: ``{"format_version": V, KEY: [...]}``, each entry without the optional fields
    that are None. Before the format version (2026-11-28) the file was the bare list, with the same fields: read as
    such, since a run on unchanged data finishes an earlier run's version, whose steps may have run before an
    upgrade. A subclass is a frozen dataclass whose one field, named KEY, is the tuple of entries (none by default),
    and sets the class attributes below."""

    KEY: ClassVar[str]
    ENTRY: ClassVar[type]  # the entries' record class
    WHAT: ClassVar[str]  # what the entries are, for a refusal
    VERSION: ClassVar[int]
    FIX: ClassVar[str]  # what to do about a file that cannot be read

    def text(self) -> str:
        """The file's text: for a file staged with others and renamed into place with them (common.atomic)."""
        entries = [
            {key: value for key, value in dataclasses.asdict(entry).items() if value is not None}
            for entry in getattr(self, self.KEY)
        ]
        return json.dumps({FORMAT_VERSION: self.VERSION, self.KEY: entries}, indent=2, ensure_ascii=False) + "\n"

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.text())

    @classmethod
    def read(cls, path: Path) -> Self:
        """The entries at ``path``; none when the step has not written the file."""
        if not path.is_file():
            return cls()
        value = _json_of(path, cls.WHAT, cls.FIX)
        if not isinstance(value, list):
            value = _versioned(value, path, cls.WHAT, cls.VERSION, cls.FIX).get(cls.KEY)
        return cls(_entries(value, cls.ENTRY, path, cls.KEY, cls.FIX))


@dataclass(frozen=True)
class StoredCopies(ListFile):
    """``store/stored.json``: every copy the store step made of a run's version (none: no target was set).

    Written by the store step; read by register (an artifact per copy), serve (the copy KServe loads) and
    the run summary.
    """

    copies: tuple[StoredCopy, ...] = ()

    KEY = "copies"
    ENTRY = StoredCopy
    WHAT = "stored copies"
    VERSION = 1
    FIX = (
        "Rerun the store step of that run (it copies the version again and rewrites the record), or delete the file "
        "to have the version stored again by the next run on the same data."
    )


@dataclass(frozen=True)
class SampleAnswer:
    """One held-out question and each compared model's greedy answer to it."""

    question: str
    base: str
    fine_tuned: str
    published: str | None = None  # when a published model was compared


@dataclass(frozen=True)
class SampleAnswers(ListFile):
    """``evaluate/demo_outputs/sample_responses.json``: the evaluation's sample questions and each model's answers.

    Written by the evaluation step (before ``evaluation.json``); read by publish (the model card, and uploaded) and
    serve (the question it asks the endpoint).
    """

    answers: tuple[SampleAnswer, ...] = ()

    KEY = "answers"
    ENTRY = SampleAnswer
    WHAT = "sample answers"
    VERSION = 1
    FIX = "Rerun the evaluation step of that run: it answers the sample questions again and rewrites the file."


def nested_record_of(value: Any, kind: type, path: Path, what: str, fix: str) -> Any:
    """One JSON object (or null) as a ``kind`` record (or None), refused with the fields it lacks."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise UserError(f"{path}: its {what} is not an object. {fix}")
    return record_of(value, kind, path, f"its {what}", fix)


class OneOrNone:
    """A file holding one record, or none when its step had nothing to do: ``{"format_version": V, KEY: {...}}``
    (``KEY: null`` for none). Before the format version (2026-11-28) the file was the record's object itself, or
    null: read as such. A subclass is a frozen dataclass that sets the class attributes below."""

    KEY: ClassVar[str]  # the record's key in the file
    WHAT: ClassVar[str]  # what the record is, for a refusal
    VERSION: ClassVar[int]
    FIX: ClassVar[str]  # what to do about a file that cannot be read

    @classmethod
    def write(cls, path: Path, record: Self | None) -> None:
        value = dataclasses.asdict(record) if record is not None else None
        write_text_atomic(path, json.dumps({FORMAT_VERSION: cls.VERSION, cls.KEY: value}, indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> Self | None:
        """The record at ``path``; None for none, or when the step has not written the file."""
        if not path.is_file():
            return None
        value = _json_of(path, cls.WHAT, cls.FIX)
        if isinstance(value, dict) and FORMAT_VERSION in value or not (value is None or isinstance(value, dict)):
            value = _versioned(value, path, cls.WHAT, cls.VERSION, cls.FIX).get(cls.KEY)
        return nested_record_of(value, cls, path, cls.WHAT, cls.FIX)


@dataclass(frozen=True)
class Registration(OneOrNone):
    """``register/registered.json``: the Model Registry's ids of what the register step registered or updated.

    Written by register (none: no ``model_registry_url``); read by serve (to add the endpoint to the version),
    the run summary and register again (a retried step).
    """

    url: str
    registered_model_id: str
    model_version_id: str
    artifact_ids: dict[str, str]  # artifact name -> id
    created: bool  # False: the version was there already and was updated

    KEY = "registration"
    WHAT = "registration"
    VERSION = 1
    FIX = "Rerun the register step of that run: it updates the version in place and rewrites the record."


@dataclass(frozen=True)
class Served(OneOrNone):
    """``serve/served.json``: a Ready InferenceService and its answer to one question.

    Written by serve (none: deploy is off); read by the run summary and serve again (a retried step).
    """

    name: str
    namespace: str
    endpoint: str  # the in-cluster URL (status.address.url), else the external one (status.url)
    model: str  # the served model's name, as /v1/models lists it
    question: str
    answer: str

    KEY = "served"
    WHAT = "served endpoint"
    VERSION = 1
    FIX = "Rerun the serve step of that run: it checks the InferenceService again and rewrites the record."


class VersionedFile:
    """A file holding one record as a JSON object: its fields' names as keys, beside ``format_version``. Before the
    format version (2026-11-28) the file was the same object without it. A subclass is a frozen dataclass that sets
    the class attributes below."""

    VERSION: ClassVar[int]
    WHAT: ClassVar[str]  # what the record is, for a refusal
    FIX: ClassVar[str]  # what to do about a file that cannot be read

    def as_json(self) -> dict[str, Any]:
        return {FORMAT_VERSION: self.VERSION, **dataclasses.asdict(self)}

    def text(self) -> str:
        """The file's text: for a file staged with others and renamed into place with them (common.atomic)."""
        return json.dumps(self.as_json(), indent=2, ensure_ascii=False) + "\n"

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.text())

    @classmethod
    def _fields_at(cls, path: Path, fix: str) -> dict[str, Any] | None:
        """The object in ``path``, None when there is no file; refused unless it is this format or unversioned."""
        if not path.is_file():
            return None
        value = _json_of(path, cls.WHAT, fix)
        if not isinstance(value, dict) or FORMAT_VERSION in value:
            value = _versioned(value, path, cls.WHAT, cls.VERSION, fix)
        return value

    @classmethod
    def _record_at(cls, path: Path) -> Any:
        """The record in ``path`` as written (its nested records still JSON), None when there is no file; refused
        with the fields it lacks."""
        value = cls._fields_at(path, cls.FIX)
        return None if value is None else record_of(value, cls, path, f"its {cls.WHAT}", cls.FIX)


@dataclass(frozen=True)
class SourceStats:
    """One source of a mixture (``dataset_sources``) in ``data/stats.json``: what the data step read from it and
    what of it the splits hold."""

    uri: str  # as the source list gave it
    weight: float | None  # its weight in the list; None: every row of every source
    records: int  # the non-blank lines read from it
    rejected: int
    rejected_by_reason: dict[str, int]
    duplicates_within: int  # repeats of an earlier record of this source
    duplicates_across: int  # repeats of a record of an earlier source
    train_available: int  # its training rows after the checks, the duplicates and the eval split
    train_rows: int  # of those, the rows in the mixture (more than available when drawn with replacement)
    eval_rows: int
    realised_weight: float  # train_rows / the mixture's training rows


@dataclass(frozen=True)
class SourceTokens:
    """One source's rows of the tokenised training split: what the tokenise step made of them.

    The data step writes the mixed training split source by source, in the list's order (``DataStats.sources``,
    each ``train_rows`` long), so each source is a contiguous range of rows. Tokens depend on the tokenizer, which
    the data step never loads: the tokenise step counts them, into the token manifest; the trainer carries them
    into the training summary, and the model card shows them beside the rows.
    """

    uri: str  # as the source list gave it
    conversations: int  # its training rows tokenised (preference pairs, for dpo)
    tokens: int  # as tokenised, before truncation (a pair: its prompt twice, and both answers)
    loss_tokens: int  # the tokens of its rows that the training computes a loss on, after truncation

    @classmethod
    def all_of(cls, value: Any, path: Path, what: str, fix: str) -> tuple[SourceTokens, ...]:
        """A JSON list of them (a file's ``what``) as records."""
        return _entries(value, cls, path, what, fix)


@dataclass(frozen=True)
class RemoteVersion:
    """How the server a source was fetched from identified what was read; all empty for a local path."""

    revision: str = ""  # a Hub dataset: the commit read
    etag: str = ""  # one S3 object or HTTP file: the ETag the server sent with it
    version_id: str = ""  # one S3 object in a versioned bucket: the version read
    objects: str = ""  # an S3 prefix: "sha256:..." of every object's key, ETag and VersionId, in key order

    def described(self) -> str:
        """In words, for logs, reports and the model card; empty when the server named no version."""
        parts = [
            f"revision {self.revision}" if self.revision else "",
            f"VersionId {self.version_id}" if self.version_id and self.version_id != "null" else "",
            f"ETag {self.etag}" if self.etag else "",
            f"objects {self.objects}" if self.objects else "",
        ]
        return ", ".join(part for part in parts if part)


@dataclass(frozen=True)
class SourceLineage:
    """One source's identity as the data step read it: its content's digest and what its server called it.

    Recorded in ``stats.json``, carried into the training summary, the model card's metadata and the Model
    Registry version's properties; the change check compares the published model's with the new run's.
    """

    uri: str  # as the run gave it (secret:DATASET_URL for a URL from the Secret; never a credential)
    content: str  # "sha256:..." of its JSONL text as read (decompressed), file after file in name order
    files: int
    remote: RemoteVersion = RemoteVersion()

    @classmethod
    def of(cls, value: Any, path: Path, what: str, fix: str) -> SourceLineage:
        """One JSON object as a record, refused with the fields it lacks."""
        lineage = record_of(value, cls, path, what, fix)
        remote = nested_record_of(lineage.remote, RemoteVersion, path, f"{what}'s remote version", fix)
        return dataclasses.replace(lineage, remote=remote or RemoteVersion())

    @classmethod
    def all_of(cls, value: Any, path: Path, what: str, fix: str) -> tuple[SourceLineage, ...]:
        """A JSON list of them (a file's ``what``) as records."""
        return tuple(
            cls.of(entry, path, f"entry {number} of its {what}", fix)
            for number, entry in enumerate(_objects(value, path, what, fix), 1)
        )

    def described(self) -> str:
        """``uri`` (content sha256:abc123456789…, revision …)."""
        remote = self.remote.described()
        return f"{self.uri} (content {self.content[:19]}…{', ' + remote if remote else ''})"


EVAL_SPLIT_NAME = "eval split"  # what an Overlap with the held-out rows is against


@dataclass(frozen=True)
class Overlap:
    """One source's training rows that share a 13-word sequence (lm-eval's decontamination: its normalisation, its
    n) with text it must not train on: the eval split, or a benchmark task's documents."""

    source: str  # as the run gave it
    against: str  # EVAL_SPLIT_NAME, or a benchmark task's name
    rows: int  # of its training rows (after the checks and the duplicates), those that overlap
    dropped: bool  # taken out of the training split (decontaminate)
    examples: tuple[str, ...]  # up to three of those rows' text, cut to 200 characters
    # A benchmark task only: of its scored documents of 13 words or more (what the check can see), how many the
    # source's rows overlap; their share is what max_contamination bounds
    documents_hit: int | None = None
    documents: int | None = None

    @property
    def share(self) -> float | None:
        """The share of the task's checkable documents the source overlaps; None for the eval split."""
        if self.documents is None or self.documents_hit is None:
            return None
        return self.documents_hit / self.documents if self.documents else 0.0


@dataclass(frozen=True)
class DataStats(VersionedFile):
    """``data/stats.json``: what the data step read, kept and rejected, and the fingerprint of what it wrote.

    Written by the data step after both splits and the rejects (it is the step's completion marker); read by the
    data step's KFP metrics, the change check (is the data the published model's?), publish (the fingerprint in
    the publish record), register (the version's provenance) and the run summary. Every field was in the first
    release (2026-11-22) but ``kind``, so a file from before the format version is read as written.
    """

    inputs: tuple[str, ...]  # the JSONL files read, after resolving dataset_uri
    options: dict[str, Any]  # the data step's options (PrepareOptions as JSON), part of the fingerprint
    records: int  # the non-blank lines read
    blank_lines: int
    rejected: int  # records not written, each listed with its reason in rejects.jsonl
    rejected_by_reason: dict[str, int]
    reject_fraction: float  # rejected / records, checked against max_reject_fraction
    duplicates: int  # records dropped as repeats of an earlier one
    rows: dict[str, int]  # the conversations written to each split: {"train": n, "eval": n}
    shapes: dict[str, int]  # records per input shape, by its name in components.data.shapes
    length_chars: dict[str, Any]  # percentiles of the conversations' and the responses' lengths in characters
    fingerprint: str  # "sha256:..." of the options and both splits: what "the data changed" compares
    # Added later (2026-11-28): what the rows are, conversations (objective sft) or preference pairs (dpo)
    kind: str = "conversations"
    # Added later (2026-11-29): each source of a mixture (dataset_sources); none for one dataset_uri
    sources: tuple[SourceStats, ...] = ()
    # Added later (2026-11-29): each source's identity as read, dataset_uri's or each of dataset_sources'
    lineage: tuple[SourceLineage, ...] = ()
    # Added later (2026-11-29): each source's training rows that overlap the eval split (and benchmark tasks)
    contamination: tuple[Overlap, ...] = ()

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "data statistics"
    FIX: ClassVar[str] = "Rerun the data step of that run: it prepares the data again and rewrites the file."

    @property
    def train_rows(self) -> int:
        return self.rows["train"]

    @property
    def eval_rows(self) -> int:
        return self.rows["eval"]

    @property
    def overlapping_eval(self) -> int:
        """The training rows, of every source, that shared a 13-word sequence with the eval split."""
        return sum(overlap.rows for overlap in self.contamination if overlap.against == EVAL_SPLIT_NAME)

    @classmethod
    def read(cls, path: Path) -> DataStats | None:
        """The statistics at ``path``; None when the data step has not written them."""
        stats = cls._record_at(path)
        if stats is None:
            return None
        rows = stats.rows
        if not isinstance(rows, dict) or not all(isinstance(rows.get(split), int) for split in ("train", "eval")):
            raise UserError(f"{path}: its {cls.WHAT}' rows are not a count per split (train and eval). {cls.FIX}")
        sources = _entries(stats.sources, SourceStats, path, "sources", cls.FIX)
        lineage = SourceLineage.all_of(stats.lineage, path, "lineage", cls.FIX)
        contamination = tuple(
            dataclasses.replace(overlap, examples=tuple(overlap.examples))
            for overlap in _entries(stats.contamination, Overlap, path, "contamination", cls.FIX)
        )
        return dataclasses.replace(
            stats, inputs=tuple(stats.inputs), sources=sources, lineage=lineage, contamination=contamination
        )


@dataclass(frozen=True)
class VerifiedGguf:
    """One GGUF file's verification in llama.cpp against transformers: each check, and the numbers measured."""

    gguf: str  # the file's path
    outtype: str  # q8_0, f16, ... or lora
    passed: bool
    checks: tuple[dict[str, Any], ...]  # {"name", "passed", "detail"}
    metrics: dict[str, Any]  # top1_agreement, nmse, positions, the chat reply, ...


@dataclass(frozen=True)
class GgufVerification(VersionedFile):
    """``export/verification.json``: every GGUF the export step wrote, verified, and how it was converted.

    Written by the export step last, after the GGUFs, the Modelfile and ``verification.md`` (its completion
    marker), and by ``python -m gguf_export --verify --report``; read by the export step's KFP metrics, register
    (the version's provenance) and the run summary, and uploaded by publish. Every field was in the first release
    (2026-11-22); the command line's report has no Modelfile.
    """

    passed: bool  # every file passed every check
    files: tuple[VerifiedGguf, ...]
    conversions: tuple[dict[str, Any], ...]  # the converter's result per file (kind, path, outtype, architecture...)
    thresholds: dict[str, Any]  # the limits the checks applied (gguf_export.options.Thresholds)
    modelfile: str | None = None  # the Modelfile beside the files, by name; None from the command line

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "GGUF verification"
    FIX: ClassVar[str] = "Rerun the export step of that run: it converts and verifies again and rewrites the file."

    @classmethod
    def read(cls, path: Path) -> GgufVerification | None:
        """The verification at ``path``; None when the export step has not written one."""
        verification = cls._record_at(path)
        if verification is None:
            return None
        if not isinstance(verification.conversions, list) or not all(
            isinstance(conversion, dict) for conversion in verification.conversions
        ):
            raise UserError(f"{path}: its conversions are not a list of objects. {cls.FIX}")
        files = _entries(verification.files, VerifiedGguf, path, "files", cls.FIX)
        return dataclasses.replace(
            verification,
            files=tuple(dataclasses.replace(file, checks=tuple(file.checks)) for file in files),
            conversions=tuple(verification.conversions),
        )


@dataclass(frozen=True)
class RankFacts:
    """What one rank of a training run reports: its device, its share of the tokens, its memory peak."""

    rank: int
    device: str
    tokens: int  # the non-padding tokens this rank trained on
    weights_sha256: str | None  # of the trainable weights; equal on every rank under DDP, None under FSDP
    # Since 2026-11-24 (None in an older summary):
    local_parameter_fraction: float | None = None  # the share of the parameters this rank holds (FSDP: about 1/world)
    peak_memory_mb: float | None = None


@dataclass(frozen=True)
class TrainingSummary(VersionedFile):
    """``train/training_summary.json``: what a training run did, written by rank 0 last, after ``merged/``.

    Written by the trainer (``python -m trainer``); read by the training step (its KFP metrics), evaluation
    (the base's commit, ``max_length``, the tokenised data, the report's facts), publish (the model card and the
    bundle, which uploads it) and register (the version's provenance). A published one is read again by the next
    runs' champion gate, to load the adapter's base at its commit, and a run on unchanged data registers an
    earlier run's version from its summary: so the fields added after the trainer's first release default to
    None, and a summary from before them is read as it was written. The JSON keys are the field names, beside
    ``format_version``.
    """

    config: dict[str, Any]  # the trainer's resolved options (trainer.config.TrainConfig, as JSON)
    world_size: int
    devices: tuple[str, ...]  # one per rank
    precision: str  # bf16, fp16 or fp32
    learning_rate: float  # the peak learning rate the run used (scaled by the world size under scale_lr)
    resumed_from: str | None  # the checkpoint this attempt resumed from
    global_step: int
    epochs: float
    train_examples: int  # conversations
    eval_examples: int
    tokens_seen: int
    train_runtime_s: float
    non_padding_tokens_per_s: float | None
    final_train_loss: float | None
    mean_train_loss: float | None
    final_eval_loss: float | None
    ranks: tuple[RankFacts, ...]
    # Added later (None in a summary from before them):
    base_model_commit: str | None = None  # the Hub commit of the base; None for a local checkpoint (2026-11-23)
    trained_weights_dtype: str | None = None  # 2026-11-23
    sharding: str | None = None  # fsdp or none (2026-11-24)
    attention: str | None = None  # the attention kernel the model trained with (2026-11-24)
    train_rows: int | None = None  # packed rows (2026-11-26)
    tokens_dir: str | None = None  # the token cache the run read (2026-11-26)
    compiled_blocks: bool | None = None  # 2026-11-27
    compile: dict[str, Any] | None = None  # the compiled path's counts (graphs, recompiles); None when eager
    speed_fallback: str | None = None  # why the run fell back to the proven path; None when it did not
    gradient_checkpointing: bool | None = None  # resolved: auto follows the method (2026-11-28)
    # The sources of the data its tokens were made from (the data step's lineage); None when it was not found
    data_sources: tuple[SourceLineage, ...] | None = None  # 2026-11-29
    # A mixture's sources' share of the training tokens (the token manifest's); empty for one source
    source_tokens: tuple[SourceTokens, ...] = ()  # 2026-11-29
    # Model FLOPs utilisation over the training time, 0 to 1 (trainer/mfu.py); None off the GPUs it knows
    mfu: float | None = None  # 2026-11-29
    # Progress posted to the TrainJob's status server (url, reported, failed, last_error); None where there is none
    trainjob_status: dict[str, Any] | None = None  # 2026-11-29
    # The MLflow run rank 0 logged to (url, run_id) and what it sent and failed to; None without mlflow_tracking_uri
    mlflow: dict[str, Any] | None = None  # 2026-11-29

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "training summary"
    FIX: ClassVar[str] = (
        "The trainer writes it last: train this run again (a new run, or delete the train folder), or pass the "
        "summary of a run made by this version of the pipeline."
    )

    @property
    def base_model(self) -> str:
        """The base model the run trained from: a Hub id or a local checkpoint directory."""
        return str(self.config["model"])

    @property
    def method(self) -> str:
        """lora, qlora or full."""
        return str(self.config["method"])

    @property
    def max_length(self) -> int:
        """The tokens a training row was cut or packed to."""
        return int(self.config["max_length"])

    @property
    def objective(self) -> str:
        """sft or dpo; sft in a summary from before objectives (2026-11-28)."""
        return str(self.config.get("objective", "sft"))

    @classmethod
    def read(cls, path: Path, fix: str = FIX) -> TrainingSummary | None:
        """The summary at ``path``; None when the trainer has not written one. A file from before the format version
        (2026-11-28) holds the same keys: read as such when it has the first release's. ``fix`` ends a refusal: what
        to do (a published summary is not retrained)."""
        value = cls._fields_at(path, fix)
        if value is None:
            return None
        if not isinstance(value.get("config"), dict) or "model" not in value["config"]:
            raise UserError(f"{path}: its {cls.WHAT} has no config.model (the base model it trained). {fix}")
        summary = record_of(value, cls, path, f"its {cls.WHAT}", fix)
        if not isinstance(summary.devices, list):
            raise UserError(f"{path}: its {cls.WHAT}'s devices are not a list. {fix}")
        ranks = _entries(summary.ranks, RankFacts, path, "ranks", fix)
        sources = summary.data_sources
        if sources is not None:
            sources = SourceLineage.all_of(sources, path, "data_sources", fix)
        tokens = SourceTokens.all_of(summary.source_tokens, path, "source_tokens", fix)
        return dataclasses.replace(
            summary, devices=tuple(summary.devices), ranks=ranks, data_sources=sources, source_tokens=tokens
        )


@dataclass(frozen=True)
class TrainingProgress(VersionedFile):
    """``train/progress.json``: where a training run is, as rank 0 saw it at its last logging step or checkpoint.

    Written by the trainer (trainer/progress.py), replaced whole each time; read by the train step while it waits
    for the job (components/train/progress.py: its progress lines, then its KFP metrics), whatever runs the ranks
    (a PyTorchJob, a TrainJob, local torchrun), since every backend mounts the same workspace.
    """

    step: int
    total_steps: int
    epoch: float
    tokens_seen: int  # every rank's, since the run started (resumed runs: since the first attempt)
    tokens_per_second: float | None  # every rank's, over this attempt's training time
    mfu: float | None  # model FLOPs utilisation, 0 to 1; None on CPU, in fp32 and on GPUs of unknown peak
    loss: float | None  # the last logged training loss
    learning_rate: float | None
    elapsed_seconds: float  # this attempt's training time
    eta_seconds: float | None  # at this attempt's pace so far; None before its first step
    last_checkpoint: str | None  # the newest checkpoint's directory name, e.g. checkpoint-400
    updated: str  # when it was written, ISO 8601 in UTC
    finished: bool = False  # training reached total_steps (a run stopped to be resumed is not finished)

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "training progress"
    FIX: ClassVar[str] = "The trainer rewrites it at its next logging step; it is only read to report progress."

    @property
    def percent(self) -> float:
        return 100.0 * self.step / self.total_steps if self.total_steps else 0.0

    def described(self) -> str:
        """One line, for the rank's log and the train step's: step / total, epoch, tokens, rate, MFU, loss, learning
        rate, ETA and the newest checkpoint."""
        parts = [
            f"step {self.step}/{self.total_steps} ({self.percent:.1f}%)",
            f"epoch {self.epoch:.2f}",
            f"{self.tokens_seen:,} tokens",
            f"{self.tokens_per_second:,.0f} tokens/s" if self.tokens_per_second is not None else "",
            f"MFU {self.mfu:.1%}" if self.mfu is not None else "",
            f"loss {self.loss:.4f}" if self.loss is not None else "",
            f"lr {self.learning_rate:.2e}" if self.learning_rate is not None else "",
            "done" if self.finished else f"ETA {_duration(self.eta_seconds)}" if self.eta_seconds else "",
            f"last checkpoint {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint yet",
        ]
        return ", ".join(part for part in parts if part)

    @classmethod
    def read(cls, path: Path) -> TrainingProgress | None:
        """The progress at ``path``; None before the trainer's first write."""
        return cls._record_at(path)


@dataclass(frozen=True)
class ModelScores:
    """One model's numbers on the held-out split: the loss over the assistant tokens (under objective dpo, over the
    chosen answers' tokens), and ROUGE-L of its answers; under dpo also its preferences on the held-out pairs
    (components/evaluate/preferences.py)."""

    eval_loss: float
    perplexity: float
    rouge_l: float
    eval_tokens: int
    # Objective dpo only (None under sft, and in an evaluation from before it, 2026-11-28):
    reward_accuracy: float | None = None  # pairs whose chosen answer has the higher implicit reward (ties: half)
    reward_margin: float | None = None  # mean of chosen's minus rejected's implicit reward
    chosen_log_prob: float | None = None  # mean summed log-probability of a chosen answer
    rejected_log_prob: float | None = None


@dataclass(frozen=True)
class GateComparison:
    """One comparison the quality gate made: against the base, the published model or one benchmark's score."""

    against: str  # base or published
    passed: bool
    reason: str
    benchmark: str | None = None  # the task, for a benchmark comparison


@dataclass(frozen=True)
class GateVerdict:
    """The quality gate's decision, and the thresholds it applied."""

    passed: bool
    min_eval_loss_improvement: float
    reason: str
    # Added later (the defaults in an evaluation from before them):
    forced: bool = False  # force was set: published whatever the comparisons said (2026-11-24)
    comparisons: tuple[GateComparison, ...] = ()  # 2026-11-24
    min_improvement_over_published: float | None = None  # set when a published model was compared
    max_benchmark_drop: float | None = None  # 2026-11-26
    # What the base and published comparisons measured (2026-11-28): eval_loss (min_eval_loss_improvement applies)
    # or, under objective dpo, reward_accuracy (min_reward_accuracy_improvement applies, set only then).
    measure: str = "eval_loss"
    min_reward_accuracy_improvement: float | None = None


# Optional entries that evaluation.json leaves out when they are None, as it did before the record.
_LEFT_OUT_WHEN_NONE = frozenset(
    {
        "published_search",
        "published_model",
        "published",
        "deltas_vs_published",
        "min_improvement_over_published",
        "benchmark",
        "reward_accuracy",
        "reward_margin",
        "chosen_log_prob",
        "rejected_log_prob",
        "min_reward_accuracy_improvement",
        "mlflow_run_url",
    }
)


def _without_absent(value: Any) -> Any:
    """``value`` (a dataclasses.asdict tree) without the optional entries that are None."""
    if isinstance(value, dict):
        return {
            key: _without_absent(item)
            for key, item in value.items()
            if item is not None or key not in _LEFT_OUT_WHEN_NONE
        }
    if isinstance(value, (list, tuple)):
        return [_without_absent(item) for item in value]
    return value


@dataclass(frozen=True)
class EvaluationResult(VersionedFile):
    """``evaluate/evaluation.json``: base, published and new model compared, the benchmarks, and the gate.

    Written by the evaluation step; read by publish (the gate, the comparison it must match, the model card),
    register (provenance, and no version that failed the gate) and the run summary. A run on unchanged data
    registers an earlier run's version from its evaluation, so the fields added after the first release have
    defaults. The reports render it as a JSON document (``as_json``); the keys are the field names, beside
    ``format_version``.
    """

    base_model: str
    fine_tuned_model: str
    base: ModelScores
    fine_tuned: ModelScores
    deltas: dict[str, float]  # fine_tuned - base, per compared number
    scored_rows: int  # held-out rows answered and scored with ROUGE-L
    gate: GateVerdict
    # Added later (None in an evaluation from before them, as when there was nothing to record):
    base_model_commit: str | None = None  # 2026-11-23
    held_out: dict[str, int] | None = None  # the conversations the loss covers, of those tokenised (2026-11-26)
    benchmarks: dict[str, Any] | None = None  # tasks, settings, each model's scores, or {"skipped": why} (11-26)
    published_search: dict[str, Any] | None = None  # where the published model was looked for
    published_model: dict[str, Any] | None = None  # the one found (PublishedModel.entry), and a problem if any
    published: ModelScores | None = None  # its numbers, when it was compared
    deltas_vs_published: dict[str, float] | None = None
    mlflow_run_url: str | None = None  # the pipeline run's MLflow run, with mlflow_tracking_uri (2026-11-29)

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "evaluation"
    FIX: ClassVar[str] = "Rerun the evaluation step of that run: it compares the models again and rewrites the file."

    def as_json(self) -> dict[str, Any]:
        return {FORMAT_VERSION: self.VERSION, **_without_absent(dataclasses.asdict(self))}

    @classmethod
    def read(cls, path: Path) -> EvaluationResult | None:
        """The evaluation at ``path``; None when the step has not written one. A file from before the format version
        (2026-11-28) holds the same keys: read as such when it has the first release's."""
        result = cls._record_at(path)
        if result is None:
            return None
        gate = nested_record_of(result.gate, GateVerdict, path, "gate", cls.FIX)
        return dataclasses.replace(
            result,
            base=nested_record_of(result.base, ModelScores, path, "base model's scores", cls.FIX),
            fine_tuned=nested_record_of(result.fine_tuned, ModelScores, path, "fine-tuned model's scores", cls.FIX),
            published=nested_record_of(result.published, ModelScores, path, "published model's scores", cls.FIX),
            gate=dataclasses.replace(
                gate, comparisons=_entries(gate.comparisons, GateComparison, path, "gate's comparisons", cls.FIX)
            ),
        )
