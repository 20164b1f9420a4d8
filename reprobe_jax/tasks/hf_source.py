"""A Hugging Face `datasets` dataset as one more source of records for every format of `reprobe_jax.tasks.datasets`
(docs/own-data.md): its rows are the records, checked as a file's lines are, each defect named `source[row i]`.

A source is, after an optional `::split` suffix:
  - a folder written by `Dataset.save_to_disk` (`state.json` + `dataset_info.json`), or by `DatasetDict.save_to_disk`
    (`dataset_dict.json`; the split is named by the suffix, or is the only one);
  - a hub id `owner/name` that is no local path: the dataset as `datasets.load_dataset` cached it on this machine
    (`HF_DATASETS_CACHE`, default ~/.cache/huggingface/datasets), read from that cache only, never downloaded;
    `owner/name::config::split` names a configuration when several are cached.

`datasets` is an optional extra (`pip install 'reprobe-jax[hf]'`); the files readers never import it.
"""

from __future__ import annotations

import os
import re
from typing import Any

from reprobe_jax.errors import ConfigError, DataFormatError

SEPARATOR = "::"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_FILE_SUFFIXES = (".json", ".jsonl")
_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes, DatasetDict and Dataset


def is_hf_source(path: str) -> bool:
  """Whether `path` names a Hugging Face dataset rather than a file: a `::` suffix, a folder `save_to_disk` wrote,
  or a hub id (`owner/name`, not ending in .json / .jsonl) that is no local path."""
  base = path.split(SEPARATOR, 1)[0]
  if SEPARATOR in path:
    return True
  if os.path.isdir(base):
    return any(os.path.isfile(os.path.join(base, m)) for m in _MARKERS)
  return _is_hub_id(base)


def _is_hub_id(base: str) -> bool:
  return not os.path.exists(base) and bool(_HUB_ID.fullmatch(base)) and not base.endswith(_FILE_SUFFIXES)


def read_rows(path: str, what: str) -> list[tuple[int, Any]]:
  """The rows of the dataset `path` names, each with its index (0-based, as `dataset[i]`), as plain Python values.
  DataFormatError naming the source when it cannot be read or holds no row; ConfigError when `datasets` is not
  installed or a DatasetDict's split is not named."""
  dataset = _open(path, what)
  rows = list(enumerate(dataset))
  if not rows:
    raise DataFormatError(f"{path}: {what} holds no records (a dataset of 0 rows)")
  return rows


def _open(path: str, what: str):
  """The `datasets.Dataset` of one split."""
  parts = path.split(SEPARATOR)
  base = parts[0]
  if not os.path.isdir(base) and not _is_hub_id(base):
    raise DataFormatError(f"{base}: no such file or folder, and not a Hugging Face hub id (owner/name)")
  hf = _datasets(base if os.path.isdir(base) else f"{base} (no local file or folder, so a hub id)")
  if os.path.isdir(base):
    if len(parts) > 2:
      raise ConfigError(f"{path}: a saved dataset folder takes at most one '::split' suffix, got {parts[1:]}")
    if not any(os.path.isfile(os.path.join(base, m)) for m in _MARKERS):
      raise DataFormatError(
        f"{base}: a folder, but not one `save_to_disk` wrote (no dataset_dict.json or state.json): name a data file "
        f"or a saved Hugging Face dataset as the {what}"
      )
    try:
      loaded = hf.load_from_disk(base)
    except (OSError, ValueError, KeyError, IndexError) as e:  # IndexError: `datasets` 5.2 on a folder of 0 rows
      raise DataFormatError(f"{base}: cannot read the saved Hugging Face dataset ({type(e).__name__}: {e})") from None
    return _split(loaded, path, parts[1] if len(parts) == 2 else None)
  if len(parts) > 3:
    raise ConfigError(f"{path}: a hub id takes at most '::config::split', got {parts[1:]}")
  config = parts[1] if len(parts) == 3 else None
  split = parts[-1] if len(parts) >= 2 else None
  return _split(_from_cache(hf, base, config), path, split)


def _from_cache(hf, repo_id: str, config: str | None):
  """The DatasetDict `load_dataset(repo_id, config)` cached on this machine, read through the `datasets` cache
  builder, which opens the cached Arrow files and nothing else: no network, whatever HF_HUB_OFFLINE says."""
  # Imported here with the rest of `datasets`: the cache builder is part of the optional extra.
  from datasets.packaged_modules.cache.cache import Cache

  cache = os.path.expanduser(str(hf.config.HF_DATASETS_CACHE))
  try:
    builder = Cache(
      cache_dir=cache,
      dataset_name=repo_id.split("/")[-1],
      repo_id=repo_id,
      config_name=config,
      version="auto",
      hash="auto",
    )
    return builder.as_dataset()
  except (ValueError, FileNotFoundError, OSError) as e:
    detail = str(e).replace("\n", " ")
    raise DataFormatError(
      f"{repo_id}: not a local path, and the Hugging Face dataset {repo_id!r} is not in the local cache {cache} "
      f"({detail}); nothing is downloaded: on a machine with internet run datasets.load_dataset({repo_id!r}, ...)"
      ".save_to_disk(folder) and name the folder (docs/own-data.md)"
    ) from None


def _split(loaded, path: str, split: str | None):
  """One split of what was loaded: a Dataset is its own split (a named split must match it, when it knows its
  name); a DatasetDict needs the split named unless it holds one."""
  if not hasattr(loaded, "keys"):
    own = loaded.split
    if split is not None and own is not None and str(own) != split:
      raise ConfigError(f"{path}: the saved dataset is the split {str(own)!r}, not {split!r}")
    return loaded
  names = sorted(loaded.keys())
  if split is None:
    if len(names) == 1:
      return loaded[names[0]]
    raise ConfigError(f"{path}: the dataset has the splits {', '.join(names)}; name one as '{path}::<split>'")
  if split not in loaded:
    raise ConfigError(f"{path}: no split {split!r}; the dataset has {', '.join(names)}")
  return loaded[split]


def _datasets(source: str):
  """The `datasets` module; ConfigError naming `source` and saying how to install it when it is missing."""
  try:
    # Imported at first use, not at the top: `datasets` (with pyarrow and pandas) is an optional extra, and the
    # files readers, which most runs use, must not need it or pay for its import.
    import datasets
  except ImportError:
    raise ConfigError(
      f"{source}: reading a Hugging Face dataset needs the `datasets` package: pip install 'reprobe-jax[hf]'"
    ) from None
  return datasets
