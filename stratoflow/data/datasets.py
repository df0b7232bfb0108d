"""Dataset preparation: build (once) or find a versioned TFDS dataset, then read its splits.

`prepare_dataset` is the first step of every pipeline. It returns a `DatasetRef`, a small JSON-able
record (it travels through XCom) of where the prepared files are, the split expression and size of
each role, the features and target (`stratoflow.config.features`), and a content fingerprint that
is logged with each run. `load_split` / `load_arrays` read one role back, in a fixed order
(images scaled to [0, 1]; tabular columns as a dict), the pipeline's preprocessing applied.

stratoflow's own builders (`stratoflow.data.tfds_builders`) read data shipped inside installed
packages, so
they build anywhere. Any other registered TFDS dataset works too when it can be downloaded or is
already prepared in the data dir; when neither holds (an offline machine), preparation fails
within seconds with instructions, instead of sitting in TFDS's download retry loop
(minutes: docs/BENCHMARKS.md, "Facts").

TensorFlow and TFDS are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratoflow.config import locations, plugins
from stratoflow.config.features import (
    CATEGORICAL,
    CLASSIFICATION,
    IMAGE,
    NUMERIC,
    REGRESSION,
    TABULAR,
    Column,
    Features,
    Target,
)
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import DatasetSpec
from stratoflow.data import records

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

logger = logging.getLogger(__name__)

ROLES = ("train", "validation", "test")
PROBE_TIMEOUT_SECONDS = 3.0
HEARTBEAT_SECONDS = 30.0
FINGERPRINT_CACHE = ".stratoflow-fingerprint.json"
_FINGERPRINT_SCHEME = "files+sorted-examples/1"
_HASH_CHUNK = 1 << 20
# The image files TFDS's `ImageFolder` reads (its `_SUPPORTED_IMAGE_FORMAT`), and their layout.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_IMAGE_FILES = ".jpg, .jpeg or .png"
IMAGE_FOLDER_LAYOUT = f"expected <folder>/<split>/<class>/<image> with {_IMAGE_FILES} images"


class DatasetUnavailableError(RuntimeError):
    """The dataset is not prepared in the data dir and cannot be downloaded from here."""


class DatasetMismatchError(ValueError):
    """The data does not fit the pipeline's spec (labels vs `task`, features stratoflow cannot
    feed, splits that select nothing, an image folder without the split folders or images it
    needs): the spec and the data decide it, so retrying cannot help."""


@dataclass
class DatasetRef:
    """A prepared dataset, as the downstream steps need it (JSON-able; passed through XCom).

    Attributes:
        name: the TFDS builder name.
        version: the prepared version, e.g. "1.0.0".
        config: the builder config name, or None.
        data_dir: the TFDS data dir holding the prepared files.
        splits: role (train / validation / test) → TFDS split expression.
        split_sizes: role → number of examples.
        features: what the model takes (`stratoflow.config.features.Features`).
        target: what it predicts (`stratoflow.config.features.Target`).
        fingerprint: sha256 (hex) over the prepared files' names and contents; identical data
            gives the same fingerprint, whichever machine or run built it.
        built: True if this call built the dataset, False if it was already prepared.
        image_folder: for an image-folder dataset, the folder read with TFDS's `ImageFolder`.
        preprocess: the pipeline's `tf.data` map function (`module:function`), or None.
        pipeline_folder: the pipeline's folder (where `preprocess` is imported from).
    """

    name: str
    version: str
    config: str | None
    data_dir: str
    splits: dict[str, str]
    split_sizes: dict[str, int]
    features: Features
    target: Target
    fingerprint: str
    built: bool = False
    image_folder: str | None = None
    preprocess: str | None = None
    pipeline_folder: str | None = None

    @property
    def class_names(self) -> list[str]:
        """The class names of a classification target (empty for regression)."""
        return list(self.target.class_names)

    def to_dict(self) -> dict[str, Any]:
        """The ref as plain JSON types (for XCom, MLflow params, files)."""
        data = dataclasses.asdict(self)
        data["features"], data["target"] = self.features.to_dict(), self.target.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetRef:
        """Rebuild a ref from `to_dict()` output.

        Raises:
            ValueError: a field is missing or unknown.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        optional = ("built", "image_folder", "preprocess", "pipeline_folder")
        unknown = sorted(set(data) - set(names))
        missing = [n for n in names if n not in data and n not in optional]
        if unknown or missing:
            raise ValueError(f"not a DatasetRef: unknown keys {unknown}, missing keys {missing}")

        def text(key: str) -> str | None:
            return None if data.get(key) is None else str(data[key])

        return cls(
            name=str(data["name"]),
            version=str(data["version"]),
            config=text("config"),
            data_dir=str(data["data_dir"]),
            splits={str(k): str(v) for k, v in data["splits"].items()},
            split_sizes={str(k): int(v) for k, v in data["split_sizes"].items()},
            features=Features.from_dict(data["features"]),
            target=Target.from_dict(data["target"]),
            fingerprint=str(data["fingerprint"]),
            built=bool(data.get("built", False)),
            image_folder=text("image_folder"),
            preprocess=text("preprocess"),
            pipeline_folder=text("pipeline_folder"),
        )


def prepare_dataset(
    spec: DatasetSpec,
    data_dir: Path | None = None,
    *,
    folder: str | Path | None = None,
    problem_type: str | None = None,
) -> DatasetRef:
    """Build the dataset of `spec` into the data dir if it is not prepared yet, and describe it.

    Works for stratoflow's bundled offline builders, any registered TFDS dataset, a TFDS
    builder of the pipeline's own (`spec.builder`, imported here, which registers it) and a
    folder of class-named image folders (`spec.image_folder`, read in place by TFDS's
    `ImageFolder`, nothing built). One process builds: an exclusive lock on
    `<data_dir>/.<name>.prepare.lock` is held around the check-and-build, and the check is
    repeated once the lock is held, so concurrent callers all succeed and the data is built once.

    Args:
        spec: the dataset name, version, config and the split expression of each role.
        data_dir: the TFDS data dir; default `stratoflow.config.locations.data_dir()`
            ($TFDS_DATA_DIR).
        folder: the pipeline's folder: where `spec.builder`, `spec.preprocess` and a relative
            `spec.image_folder` are found.
        problem_type: the pipeline's problem type (its `task:`); its labels must fit it (None:
            whatever the labels are).

    Returns:
        The prepared dataset's `DatasetRef`; `built` says whether this call built it.

    Raises:
        ValueError: unknown TFDS name, version or config; a role missing from `spec.splits`.
        DatasetMismatchError: a role's split expression that is invalid or selects no examples;
            an image folder's split folder that is missing or holds no images (named, with the
            layout expected); labels that do not fit `problem_type`, or features stratoflow
            cannot feed a model (no fixed shape, columns that are not scalar numbers or class
            labels).
        DatasetUnavailableError: not prepared here and its files cannot be downloaded.
        SpecError: `spec.builder` does not resolve to a TFDS builder named `spec.name`.
    """
    import tensorflow_datasets as tfds

    import stratoflow.data.tfds_builders  # noqa: F401  (registers the bundled builders)

    root = Path(data_dir if data_dir is not None else locations.data_dir()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    label = _label(spec.name, spec.config, spec.version)
    _check_roles(spec.splits)

    if spec.image_folder is not None:
        images = _image_folder_path(spec.image_folder, folder)
        _check_image_folder(images, spec.splits)
        image_builder = _image_folder_builder(images, spec.image_shape or [])
        ref = _describe(image_builder, spec, root, False, problem_type, images)
    else:
        own = _import_builder(spec, folder) if spec.builder is not None else None
        builder = _make_builder(spec.name, spec.config, spec.version, root, own)
        built = False
        if builder.is_prepared():
            logger.info("dataset %s is already prepared in %s", label, root)
        else:
            with _exclusive_lock(root / f".{spec.name}.prepare.lock", label):
                # Another process may have built it while we waited for the lock.
                builder = _make_builder(spec.name, spec.config, spec.version, root, own)
                if builder.is_prepared():
                    logger.info("dataset %s was prepared by another process meanwhile", label)
                else:
                    _build(builder, spec, root, tfds)
                    built = True
                    # Fill the fingerprint cache before waiting processes look at it.
                    fingerprint(Path(os.fspath(builder.data_dir)))
        ref = _describe(builder, spec, root, built, problem_type)
    if spec.preprocess is not None:
        ref.preprocess = spec.preprocess
        ref.pipeline_folder = None if folder is None else os.fspath(folder)
    logger.info(
        "dataset %s ready: %s, fingerprint %s%s",
        label,
        ", ".join(f"{role} {ref.splits[role]!r} = {n}" for role, n in ref.split_sizes.items()),
        ref.fingerprint[:12],
        " (built by this process)" if ref.built else "",
    )
    return ref


def load_split(
    ref: DatasetRef | Mapping[str, Any],
    role: str,
    *,
    read_config: Any = None,
    shuffle_files: bool = False,
    per_example: bool = False,
) -> tf.data.Dataset:
    """Read one role of a prepared dataset as `(features, target)` pairs, in a fixed order.

    Args:
        ref: the `DatasetRef` (or its dict) returned by `prepare_dataset`.
        role: "train", "validation" or "test" (any role in `ref.splits`).
        read_config: a `tfds.ReadConfig` for reading the files otherwise (interleaved,
            sharded by file, ...: `stratoflow.data.input_pipeline` streams with it); None:
            one file after the other, with no cache (the caller decides what to cache).
        shuffle_files: read the files in an order drawn from `read_config.shuffle_seed`.
        per_example: parse and decode the records one at a time with TFDS's own reader, as
            before the batched reader (`stratoflow.data.records`), which gives the same pairs in
            the same order: for comparing the two.

    Returns:
        An unbatched, unshuffled `tf.data.Dataset` of `(features, target)`, the same order on
        every call and every machine. `features` is a float32 image in [0, 1] of shape
        `ref.features.shape`, or for tabular data a dict of scalars (float32 numeric columns,
        int64 categorical ids); `target` an int64 class id or a float32 regression target. The
        pipeline's `preprocess` function, if any, has been applied to every pair.

    Raises:
        ValueError: `role` is not in the ref.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import stratoflow.data.tfds_builders  # noqa: F401  (registers the bundled builders)

    ref = _as_ref(ref)
    if role not in ref.splits:
        raise ValueError(f"unknown role {role!r}; the dataset ref has: {', '.join(ref.splits)}")
    if read_config is None:
        options = tf.data.Options()
        options.deterministic = True
        # No TFDS autocache: the training input decides what is cached (`input_pipeline`), and a
        # cache under a reader that takes a few examples is left half-filled (TensorFlow warns
        # "did not fully read the dataset being cached" and discards it).
        read_config = tfds.ReadConfig(
            options=options, interleave_cycle_length=1, try_autocache=False
        )
    features, target = ref.features, ref.target
    if ref.image_folder is not None:
        builder = _image_folder_builder(Path(ref.image_folder), list(features.shape))
    else:
        builder = _make_builder(ref.name, ref.config, ref.version, Path(ref.data_dir))
        if not builder.is_prepared():
            raise DatasetUnavailableError(
                f"dataset {_label(ref.name, ref.config, ref.version)} is no longer prepared in "
                f"{ref.data_dir}; run prepare_dataset again"
            )
    # Prepared record files: parsed, decoded and converted a batch at a time (`records`), then
    # one example at a time again; anything else (an image folder) example by example by TFDS.
    shape = list(features.shape)
    resize = ref.image_folder is not None

    def convert(inputs: Any, label: tf.Tensor, batched: bool = False) -> tuple[Any, tf.Tensor]:
        # Element-wise: the same for one example or a batch of them.
        if features.kind == TABULAR:
            inputs = {
                column.name: tf.cast(
                    inputs[column.name], tf.float32 if column.kind == NUMERIC else tf.int64
                )
                for column in features.columns
            }
        else:
            inputs = tf.cast(inputs, tf.float32)
            if resize:
                inputs = tf.image.resize(inputs, shape[:2])
            inputs = tf.ensure_shape(inputs / 255.0, [None, *shape] if batched else shape)
        label = tf.cast(label, tf.int64 if target.task == CLASSIFICATION else tf.float32)
        return inputs, label

    dataset = None
    if ref.image_folder is None and not per_example:
        dataset = records.supervised_examples(
            builder,
            ref.splits[role],
            read_config,
            shuffle_files,
            lambda inputs, label: convert(inputs, label, batched=True),
        )
    if dataset is None:
        dataset = builder.as_dataset(
            split=ref.splits[role],
            as_supervised=True,
            shuffle_files=shuffle_files,
            read_config=read_config,
        ).map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if ref.preprocess is not None:
        function = plugins.load_object(ref.preprocess, ref.pipeline_folder, "dataset.preprocess")
        dataset = dataset.map(function, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset


def load_arrays(ref: DatasetRef | Mapping[str, Any], role: str) -> tuple[Any, np.ndarray]:
    """Read one role into memory: the same values and order as `load_split`.

    Args:
        ref: the `DatasetRef` (or its dict) returned by `prepare_dataset`.
        role: "train", "validation" or "test".

    Returns:
        `(features, targets)`: an array `(n, *shape)` (images) or a dict of column arrays
        `(n,)` (tabular), and the targets `(n,)` (int64 class ids, float32 regression values).
    """
    import numpy as np

    ref = _as_ref(ref)
    inputs: list[Any] = []
    targets: list[np.ndarray] = []
    for input_batch, target_batch in load_split(ref, role).batch(1024).as_numpy_iterator():
        inputs.append(input_batch)
        targets.append(target_batch)
    if not inputs:
        raise ValueError(f"role {role!r} of dataset {ref.name} has no examples")
    if isinstance(inputs[0], dict):
        joined: Any = {key: np.concatenate([b[key] for b in inputs]) for key in inputs[0]}
    else:
        joined = np.concatenate(inputs)
    return joined, np.concatenate(targets)


# --- building -------------------------------------------------------------------------------


def _label(name: str, config: str | None, version: str) -> str:
    return f"{name}{'/' + config if config else ''}:{version}"


def _check_roles(splits: Mapping[str, str]) -> None:
    missing = [role for role in ROLES if role not in splits]
    if missing:
        raise ValueError(
            f"dataset splits lack the role(s) {', '.join(missing)}: got {dict(splits)}"
        )


def _as_ref(ref: DatasetRef | Mapping[str, Any]) -> DatasetRef:
    return ref if isinstance(ref, DatasetRef) else DatasetRef.from_dict(ref)


def _image_folder_path(image_folder: str, folder: str | Path | None) -> Path:
    path = Path(image_folder).expanduser()
    if not path.is_absolute() and folder is not None:
        path = Path(folder) / path
    if not path.is_dir():
        raise DatasetMismatchError(
            f"dataset.image_folder: {os.fspath(path)!r} is not a folder ({IMAGE_FOLDER_LAYOUT})"
        )
    return path.resolve()


def _check_image_folder(images: Path, splits: Mapping[str, str]) -> None:
    """Refuse split folders TFDS's `ImageFolder` would read no images from, naming the folder.

    `ImageFolder` knows a split only by a folder holding class folders, and counts only the
    images (`IMAGE_SUFFIXES`) in those: a missing or empty split folder would otherwise surface
    as a split expression that selects nothing, naming neither the folder nor the layout.
    A class folder without images is only named in a warning (the class has no examples there).
    """
    split_folders = sorted(entry.name for entry in images.iterdir() if entry.is_dir())
    for role, split in splits.items():
        if split not in split_folders and re.search(r"[\[\]+]", split):
            raise DatasetMismatchError(
                f"dataset.splits.{role}: {split!r} is not a split folder of "
                f"dataset.image_folder {images}: an image folder's splits are read whole; name "
                f"one of its split folders: {', '.join(split_folders) or 'none'} "
                f"({IMAGE_FOLDER_LAYOUT})"
            )
        where = f"dataset.image_folder: split folder {images / split} (role {role})"
        if split not in split_folders:
            raise DatasetMismatchError(
                f"{where} does not exist; the split folders of {images} are: "
                f"{', '.join(split_folders) or 'none'} ({IMAGE_FOLDER_LAYOUT})"
            )
        classes = sorted(entry for entry in (images / split).iterdir() if entry.is_dir())
        if not classes:
            loose = len(_images_in(images / split))
            raise DatasetMismatchError(
                f"{where} holds {loose} images but no class folders: put each image in a folder "
                f"named after its class ({IMAGE_FOLDER_LAYOUT})"
                if loose
                else f"{where} holds no class folders and no images ({IMAGE_FOLDER_LAYOUT})"
            )
        empty = [folder for folder in classes if not _images_in(folder)]
        if len(empty) == len(classes):
            raise DatasetMismatchError(
                f"{where} holds no images: its class folders "
                f"{', '.join(folder.name for folder in classes)} hold no {_IMAGE_FILES} file "
                f"({IMAGE_FOLDER_LAYOUT})"
            )
        for folder in empty:
            logger.warning(
                "dataset.image_folder: class folder %s holds no %s images: class %r has no %s "
                "examples",
                folder,
                _IMAGE_FILES,
                folder.name,
                role,
            )


def _images_in(folder: Path) -> list[Path]:
    # What `ImageFolder` reads from a folder: files with an image suffix, in any letter case.
    return [
        entry
        for entry in folder.iterdir()
        if entry.suffix.lower() in IMAGE_SUFFIXES and not entry.is_dir()
    ]


def _image_folder_builder(images: Path, shape: list[int]) -> Any:
    import tensorflow_datasets as tfds

    # Decoded with the spec's channels, any size: `load_split` resizes to the spec's shape.
    return tfds.folder_dataset.ImageFolder(os.fspath(images), shape=(None, None, shape[2]))


def _import_builder(spec: DatasetSpec, folder: str | Path | None) -> type:
    """Import the pipeline's own TFDS builder class (defining it registers it with TFDS).

    TFDS refuses a second class of a name it knows (`already registered`): a copy of a pipeline,
    or the same module imported again from another folder. Such a class is imported without
    registering and used directly; the data it prepares goes to the same `<data_dir>/<name>`.
    """
    import tensorflow_datasets as tfds

    assert spec.builder is not None
    where = f"{os.fspath(Path(folder) / 'pipeline.yaml') if folder else 'pipeline.yaml'}: "
    known = spec.name in tfds.list_builders(with_community_datasets=False)
    quietly = tfds.core.registered.skip_registration() if known else contextlib.nullcontext()
    with quietly:
        builder = plugins.load_object(spec.builder, folder, where + "dataset.builder")
    if not (isinstance(builder, type) and issubclass(builder, tfds.core.DatasetBuilder)):
        raise SpecError(
            f"{where}dataset.builder {spec.builder!r} is not a TFDS builder class (a subclass "
            f"of tfds.core.GeneratorBasedBuilder); got {builder!r:.200}"
        )
    builder_name = getattr(builder, "name", None)
    if builder_name != spec.name:
        raise SpecError(
            f"{where}dataset.name {spec.name!r} differs from the name of dataset.builder "
            f"{spec.builder!r}, {builder_name!r} (TFDS names a builder after its class)"
        )
    return builder


def _make_builder(
    name: str, config: str | None, version: str, data_dir: Path, own: type | None = None
) -> Any:
    import tensorflow_datasets as tfds

    try:
        if own is not None:  # the pipeline's own builder class, whatever TFDS registered
            return own(config=config, version=version, data_dir=os.fspath(data_dir))
        return tfds.builder(name, config=config, version=version, data_dir=os.fspath(data_dir))
    except tfds.core.registered.DatasetNotFoundError as error:
        hint = re.search(r"Did you mean: .*", str(error))
        raise ValueError(
            f"unknown TFDS dataset {name!r}: no builder is registered under that name and "
            f"{data_dir / name} holds no prepared copy"
            f"{' (' + hint.group(0).strip() + ')' if hint else ''}; stratoflow's offline "
            f"datasets are {', '.join(_bundled_names())}"
        ) from None
    except (AssertionError, ValueError) as error:
        # e.g. "cannot be loaded at version 9.9.9, only: 3.0.1" or an unknown BuilderConfig.
        detail = " ".join(str(error).split())
        raise ValueError(
            f"cannot open TFDS dataset {_label(name, config, version)}: {detail[:800]}"
        ) from error


def _bundled_names() -> list[str]:
    from stratoflow.data.tfds_builders import BUNDLED_BUILDERS

    return sorted(BUNDLED_BUILDERS)


@contextlib.contextmanager
def _exclusive_lock(path: Path, label: str) -> Iterator[None]:
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process preparing %s (lock %s)", label, path)
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            logger.info("lock on %s acquired after %.1f s", path, time.monotonic() - started)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(builder: Any, spec: DatasetSpec, data_dir: Path, tfds: Any) -> None:
    label = _label(spec.name, spec.config, spec.version)
    unavailable: list[DatasetUnavailableError] = []
    guard = _DownloadGuard(label, spec, data_dir, unavailable)
    if not guard.install(builder):
        # This TFDS has no hook for us: probe the hosts the builder declares, up front.
        for url in sorted(type(builder).url_infos or {}):
            guard.check(url)

    logger.info("building dataset %s into %s (pid %d)", label, data_dir, os.getpid())
    started = time.monotonic()
    with _heartbeat(f"still building dataset {label}", started):
        try:
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(try_download_gcs=False)
            )
        except Exception as error:
            if unavailable:
                raise unavailable[0] from error
            raise
    logger.info(
        "built dataset %s in %.1f s (pid %d)", label, time.monotonic() - started, os.getpid()
    )


class _DownloadGuard:
    """Checks that a URL's host answers before TFDS starts its long retry loop on it."""

    def __init__(
        self,
        label: str,
        spec: DatasetSpec,
        data_dir: Path,
        unavailable: list[DatasetUnavailableError],
    ) -> None:
        self.label, self.spec, self.data_dir = label, spec, data_dir
        self.unavailable = unavailable
        self.probed: dict[tuple[str, int], str | None] = {}

    def install(self, builder: Any) -> bool:
        # TFDS 4.9 creates its DownloadManager in `_make_download_manager` and fetches every
        # uncached URL through the manager's `_download`: checking there skips URLs already in
        # the download cache (or provided in the manual dir).
        make_manager = getattr(builder, "_make_download_manager", None)
        if not callable(make_manager):
            return False

        def make_guarded_manager(*args: Any, **kwargs: Any) -> Any:
            manager = make_manager(*args, **kwargs)
            download = getattr(manager, "_download", None)
            if callable(download):
                setattr(manager, "_download", self._wrap(download))  # noqa: B010
            return manager

        setattr(builder, "_make_download_manager", make_guarded_manager)  # noqa: B010
        return True

    def _wrap(self, download: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def checked_download(resource: Any) -> Any:
            self.check(str(getattr(resource, "url", resource)))
            return download(resource)

        return checked_download

    def check(self, url: str) -> None:
        target = _probe_target(url)
        if target is None:
            return
        (host, port), via = target
        if (host, port) not in self.probed:
            self.probed[(host, port)] = _tcp_probe(host, port)
        reason = self.probed[(host, port)]
        if reason is None:
            return
        error = DatasetUnavailableError(self._message(url, f"{reason}{via}"))
        self.unavailable.append(error)
        raise error

    def _message(self, url: str, reason: str) -> str:
        name, label, data_dir = self.spec.name, self.label, self.data_dir
        return (
            f"TFDS dataset {label} is not prepared in {data_dir} and cannot be downloaded from "
            f"this machine: {url} is unreachable ({reason}). Either prepare it on a machine "
            f"with internet access (`tfds build {label} --data_dir DIR`) and copy DIR/{name} to "
            f"{data_dir / name}; or set TFDS_DATA_DIR to a data dir that already holds "
            f"{label}; or use one of stratoflow's offline datasets: "
            f"{', '.join(_bundled_names())}."
        )


def _probe_target(url: str) -> tuple[tuple[str, int], str] | None:
    """(host, port) a download of `url` connects to first, honouring proxy locations."""
    parts = urllib.parse.urlsplit(url)
    defaults = {"http": 80, "https": 443, "ftp": 21}
    if parts.scheme not in defaults or not parts.hostname:
        return None  # local paths, gs:// etc. are not fetched over TCP by TFDS's downloader
    host, port, via = parts.hostname, parts.port or defaults[parts.scheme], ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if proxy_parts.hostname:
            host, port = proxy_parts.hostname, proxy_parts.port or 80
            via = f" via proxy {proxy}"
    return (host, port), via


def _tcp_probe(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """None if `host:port` accepts a TCP connection within `timeout`, else why not."""
    outcome: dict[str, BaseException | None] = {}

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome["error"] = None
        except OSError as error:
            outcome["error"] = error

    # A thread bounds the DNS lookup too, which `create_connection`'s timeout does not.
    thread = threading.Thread(target=connect, name=f"probe-{host}", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    if "error" not in outcome:
        return f"no answer from {host}:{port} within {timeout:.0f} s"
    error = outcome["error"]
    return None if error is None else f"{host}:{port}: {error}"


@contextlib.contextmanager
def _heartbeat(message: str, started: float) -> Iterator[None]:
    # TFDS reports progress with tqdm bars; a periodic log line shows up in Airflow's task log.
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            logger.info("%s (%.0f s so far)", message, time.monotonic() - started)

    thread = threading.Thread(target=beat, name="dataset-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- describing ------------------------------------------------------------------------------


def _describe(
    builder: Any,
    spec: DatasetSpec,
    data_dir: Path,
    built: bool,
    problem_type: str | None,
    image_folder: Path | None = None,
) -> DatasetRef:
    info = builder.info
    label = _label(spec.name, spec.config, spec.version)
    available = {name: split.num_examples for name, split in info.splits.items()}
    available_text = ", ".join(f"{name} ({n})" for name, n in available.items())
    split_sizes: dict[str, int] = {}
    for role, expression in spec.splits.items():
        try:
            size = int(info.splits[expression].num_examples)
        except Exception as error:  # TFDS raises KeyError/ValueError/AssertionError by case
            raise DatasetMismatchError(
                f"dataset.splits.{role}: {expression!r} is not a valid split expression for "
                f"{label} ({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                f"available splits: {available_text}"
            ) from None
        if size == 0:
            raise DatasetMismatchError(
                f"dataset.splits.{role}: {expression!r} selects no examples of {label}; "
                f"available splits: {available_text}"
            )
        split_sizes[role] = size

    if not info.supervised_keys or len(info.supervised_keys) != 2:
        raise DatasetMismatchError(f"dataset {label} has no (input, label) supervised keys")
    input_key, label_key = info.supervised_keys
    if image_folder is not None:
        features = Features(IMAGE, shape=tuple(spec.image_shape or ()))
        variant_dir = image_folder
    else:
        features = _describe_features(info.features[input_key], input_key, label)
        variant_dir = Path(os.fspath(builder.data_dir))
    target = _describe_target(info.features[label_key], label_key, label, problem_type)
    return DatasetRef(
        name=spec.name,
        version=str(builder.version) if image_folder is None else spec.version,
        config=spec.config,
        data_dir=os.fspath(data_dir),
        splits=dict(spec.splits),
        split_sizes=split_sizes,
        features=features,
        target=target,
        fingerprint=fingerprint(variant_dir),
        built=built,
        image_folder=None if image_folder is None else os.fspath(image_folder),
    )


def _describe_features(feature: Any, key: str, label: str) -> Features:
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.FeaturesDict):
        columns = []
        for name, column in feature.items():
            if isinstance(column, tfds.features.ClassLabel):
                columns.append(Column(name, CATEGORICAL, tuple(str(n) for n in column.names)))
            elif tuple(column.shape) == () and _dtype_kind(column) in "fiub":
                columns.append(Column(name, NUMERIC))
            else:
                raise DatasetMismatchError(
                    f"dataset {label}: column {name!r} of {key!r} is {type(column).__name__} "
                    f"with shape {tuple(column.shape)}; a tabular column must be a scalar "
                    "number or a ClassLabel"
                )
        # Sorted by name: TFDS does not keep a FeaturesDict's order across processes.
        return Features(TABULAR, columns=tuple(sorted(columns, key=lambda c: c.name)))
    shape = tuple(getattr(feature, "shape", ()) or ())
    if not shape or any(dim is None for dim in shape) or len(shape) != 3:
        raise DatasetMismatchError(
            f"dataset {label}: input {key!r} has shape {shape}; stratoflow needs images of a "
            "fixed shape (height, width, channels) or a FeaturesDict of tabular columns"
        )
    return Features(IMAGE, shape=tuple(int(d) for d in shape))


def _describe_target(feature: Any, key: str, label: str, problem_type: str | None) -> Target:
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.ClassLabel):
        found = Target(CLASSIFICATION, class_names=tuple(str(n) for n in feature.names))
    elif _dtype_kind(feature) == "f" and len(tuple(feature.shape)) <= 1:
        shape = tuple(feature.shape)
        found = Target(REGRESSION, num_targets=int(shape[0]) if shape else 1)
    else:
        raise DatasetMismatchError(
            f"dataset {label}: label {key!r} ({type(feature).__name__}, dtype "
            f"{getattr(feature, 'np_dtype', '?')}) is neither a ClassLabel (classification) nor "
            "float targets (regression)"
        )
    if problem_type is not None and problem_type != found.task:
        wanted = "a ClassLabel" if problem_type == CLASSIFICATION else "float targets"
        raise DatasetMismatchError(
            f"task {problem_type!r} needs {wanted} as labels, but the label {key!r} of dataset "
            f"{label} is {'a ClassLabel' if found.task == CLASSIFICATION else 'float values'}: "
            f"set task: {found.task}, or use another dataset"
        )
    return found


def _dtype_kind(feature: Any) -> str:
    import numpy as np

    try:
        return str(np.dtype(feature.np_dtype).kind)
    except Exception:  # not a tensor feature
        return "?"


def fingerprint(variant_dir: Path) -> str:
    """sha256 (hex) over the names and contents of every file of a prepared dataset variant.

    TFRecord shards are hashed record by record, each `tf.train.Example` re-serialized with
    sorted map keys: protobuf writes an Example's feature map in a per-process order, so two
    builds of identical data give different bytes but the same fingerprint. Other files are
    hashed byte for byte. The result is cached in `<variant_dir>/.stratoflow-fingerprint.json`,
    keyed by each file's size and mtime, so a large dataset is hashed once, not on every run.

    Args:
        variant_dir: the prepared variant's folder, `data_dir/name[/config]/version`.

    Returns:
        The hex digest; identical data gives the identical digest, whichever process built it.
    """
    files = sorted(
        path
        for path in variant_dir.rglob("*")
        if path.is_file() and not path.name.startswith(".stratoflow-")
    )
    stats = [[p.relative_to(variant_dir).as_posix(), *_size_mtime(p)] for p in files]
    cache = variant_dir / FINGERPRINT_CACHE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        cached = json.loads(cache.read_text())
        if cached["scheme"] == _FINGERPRINT_SCHEME and cached["files"] == stats:
            return str(cached["sha256"])

    started = time.monotonic()
    digest = hashlib.sha256()
    for path, (relative, _, _) in zip(files, stats, strict=True):
        digest.update(f"{relative}\0".encode())
        if ".tfrecord" in path.name:
            _hash_tfrecord(path, digest)
        else:
            _hash_bytes(path, digest)
    result = digest.hexdigest()
    logger.info("fingerprinted %s in %.1f s", variant_dir, time.monotonic() - started)
    # Best effort: a read-only copy of the data dir just recomputes next time.
    with contextlib.suppress(OSError):
        temporary = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        record = {"scheme": _FINGERPRINT_SCHEME, "files": stats, "sha256": result}
        temporary.write_text(json.dumps(record))
        os.replace(temporary, cache)
    return result


def _hash_bytes(path: Path, digest: Any) -> None:
    digest.update(f"{path.stat().st_size}\0".encode())
    with open(path, "rb") as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)


def _hash_tfrecord(path: Path, digest: Any) -> None:
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    # TFRecord framing: uint64 length, uint32 crc of length, payload, uint32 crc of payload.
    with open(path, "rb") as stream:
        while header := stream.read(12):
            (length,) = struct.unpack("<Q", header[:8]) if len(header) == 12 else (-1,)
            payload = stream.read(length) if length >= 0 else b""
            if length < 0 or len(payload) != length or len(stream.read(4)) != 4:
                raise ValueError(f"{path} is not a complete TFRecord file")
            try:
                canonical = example_pb2.Example.FromString(payload).SerializeToString(
                    deterministic=True
                )
            except DecodeError:
                canonical = payload  # not an Example: its bytes are all we can hash
            digest.update(len(canonical).to_bytes(8, "little"))
            digest.update(canonical)


def _size_mtime(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns
