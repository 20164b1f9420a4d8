"""A trained probe as one shareable artefact (docs/method.md §A4): graph, parameters, feature spec and probe config.

On disk it is a folder like a Hugging Face model's: `config.json` (format and version, the ProbeConfig, the
FeatureSpec and the fingerprint of the target model whose features it was trained on) and `model.safetensors` (the
parameters by module path, e.g. `layers.0.attn.query.kernel`, float32), each with its seal (`<file>.sha256`,
`reprobe_jax.io.seal`), so a bundle changed or damaged after it was saved is refused when it is loaded. Orbax stays
the format of training checkpoints (exact resume); this is the format a finished probe is shared and loaded in.

Format version 1 (written before bundles were sealed) still loads, without seals and with a warning: its
config fields and every tensor's name, shape and dtype are checked as before, and refusing it would strand every
probe saved until then; `save_probe` writes version 2, whose seals must be there and match.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx, struct

from reprobe_jax.io.atomic import atomic_folder, write_seal
from reprobe_jax.io.seal import file_digest, recorded_digest, regular_file, seal_path
from reprobe_jax.errors import CheckpointError, ConfigError, DataFormatError, ReprobeError
from reprobe_jax.features.spec import FeatureSpec
from reprobe_jax.features.store import FeatureMismatchError
from reprobe_jax.models.safetensors_io import SafetensorsFile, write_safetensors
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.probe.model import ProbeConfig, abstract_probe, score_steps
from reprobe_jax.io.readers import read_json

FORMAT = "reprobe-probe"
FORMAT_VERSION = 2
SEALED_SINCE = 2  # the first format version whose files are sealed
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def _name(path) -> str:
  return ".".join(str(p) for p in path)


def _expected(cfg: ProbeConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{tensor name: (shape, dtype)} of every parameter of a probe of this config."""
  _, state = abstract_probe(cfg)
  return {_name(p): (tuple(v.get_value().shape), np.dtype(v.get_value().dtype)) for p, v in nnx.to_flat_state(state)}


def _check_tensors(expected: dict, found: dict, source: str, error: type[ReprobeError]) -> None:
  """Names the first missing, unexpected, misshapen or mistyped tensor; found is {name: (shape, dtype)}."""
  missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
  if missing:
    raise error(f"{source}: missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} in all)")
  if extra:
    raise error(f"{source}: unexpected tensors {extra[:8]}{' ...' if len(extra) > 8 else ''} (another probe shape?)")
  for k, (shape, dtype) in expected.items():
    if tuple(found[k][0]) != shape:
      raise error(f"{source}: tensor {k!r} has shape {list(found[k][0])}, the config expects {list(shape)}")
    if np.dtype(found[k][1]) != dtype:
      raise error(f"{source}: tensor {k!r} has dtype {np.dtype(found[k][1]).name}, expected {dtype.name}")


@struct.dataclass
class ProbeBundle:
  """Everything needed to score steps with a trained probe. A pytree: params are the leaves; config, feature spec
  and target fingerprint are static, so jit compiles once per probe config and shape."""

  params: nnx.State
  config: ProbeConfig = struct.field(pytree_node=False)
  features: FeatureSpec = struct.field(pytree_node=False)
  model_fingerprint: str | None = struct.field(pytree_node=False, default=None)

  @classmethod
  def create(
    cls, config: ProbeConfig, params: nnx.State, features: FeatureSpec, model_fingerprint: str | None = None
  ) -> "ProbeBundle":
    """Checks the parameters against the config (names, shapes, dtypes: ConfigError) and bundles them."""
    found = {
      _name(p): (tuple(np.shape(v.get_value())), jnp.result_type(v.get_value())) for p, v in nnx.to_flat_state(params)
    }
    _check_tensors(_expected(config), found, "ProbeBundle.create", ConfigError)
    return cls(params=params, config=config, features=features, model_fingerprint=model_fingerprint)

  @property
  def graph(self) -> StaticGraph:
    return abstract_probe(self.config)[0]

  def probabilities(self, features, token_mask, spans) -> jax.Array:
    """P(step incorrect) [B, S] for features [B, T, F], token_mask [B, T], spans [B, S, 2] (`score_steps`)."""
    return score_steps(self.graph, self.params, features, token_mask, spans)


def _config(cls, raw, source: str, field: str):
  """A frozen dataclass from its JSON object; errors name the file and the field."""
  if not isinstance(raw, dict):
    raise CheckpointError(f"{source}: field {field!r} must be an object, got {type(raw).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(raw) - set(fields))
  if unknown:
    raise CheckpointError(f"{source}: unknown keys {unknown} in {field!r}; known: {sorted(fields)}")
  kwargs = {}
  for name, f in fields.items():
    where = f"{field}.{name}"
    if name not in raw:
      if f.default is dataclasses.MISSING:
        raise CheckpointError(f"{source}: missing key {where!r}")
      continue
    v, kind = raw[name], str(f.type)
    if kind.startswith("tuple"):
      if not isinstance(v, list):
        raise CheckpointError(f"{source}: {where!r} must be a list, got {v!r}")
      v = tuple(v)
    elif kind == "int" and (not isinstance(v, int) or isinstance(v, bool)):
      raise CheckpointError(f"{source}: {where!r} must be an integer, got {v!r}")
    elif kind == "float" and (not isinstance(v, (int, float)) or isinstance(v, bool)):
      raise CheckpointError(f"{source}: {where!r} must be a number, got {v!r}")
    kwargs[name] = v
  try:
    return cls(**kwargs)
  except (ConfigError, TypeError, ValueError) as e:
    raise CheckpointError(f"{source}: {field!r}: {e}") from e


def _folder(directory) -> str:
  if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
    raise ConfigError(f"probe folder: expected a path, got {directory!r}")
  return os.fspath(directory)


def _regular(path: str, what: str) -> str:
  """`path` if it is a regular file (a named pipe would block the read forever); CheckpointError naming it."""
  try:
    return regular_file(path, what)
  except DataFormatError as e:
    raise CheckpointError(str(e)) from None


BUNDLE_FILES = (CONFIG_FILE, WEIGHTS_FILE, seal_path(CONFIG_FILE), seal_path(WEIGHTS_FILE))


def save_probe(bundle: ProbeBundle, directory: str) -> None:
  """Writes `directory`/config.json + model.safetensors (float32), each sealed, atomically: a crash leaves the old
  folder. ConfigError when `directory` is a file or a folder holding anything but a probe bundle (it is replaced
  whole)."""
  directory = _folder(directory)
  if os.path.lexists(directory):
    if not os.path.isdir(directory):
      raise ConfigError(f"{directory}: cannot save a probe there: it exists and is not a folder")
    others = sorted(set(os.listdir(directory)) - set(BUNDLE_FILES))
    if others:
      raise ConfigError(
        f"{directory}: cannot save a probe there: the folder holds {others[:5]}, not only a probe bundle's files, "
        "and saving replaces it whole"
      )
  meta = {
    "format": FORMAT,
    "format_version": FORMAT_VERSION,
    "probe": dataclasses.asdict(bundle.config),
    "features": dataclasses.asdict(bundle.features),
    "model_fingerprint": bundle.model_fingerprint,
    "dtype": "float32",
  }
  tensors = {
    _name(p): np.asarray(jax.device_get(v.get_value()), np.float32) for p, v in nnx.to_flat_state(bundle.params)
  }
  with atomic_folder(directory) as tmp:
    with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
      json.dump(meta, f, indent=2)
    write_safetensors(os.path.join(tmp, WEIGHTS_FILE), tensors, {"format": FORMAT})
    for name in (CONFIG_FILE, WEIGHTS_FILE):
      write_seal(os.path.join(tmp, name))


def _check_sealed(path: str, what: str) -> None:
  """DataFormatError unless the bytes of `path` match its seal (which exists)."""
  want, got = recorded_digest(path, what), file_digest(path, what)
  if got != want:
    raise DataFormatError(
      f"{path}: {what} does not match its seal (sha256 {got[:16]}..., sealed {want[:16]}...): it was changed or "
      "damaged after save_probe wrote it"
    )


def load_probe(directory: str, *, model_fingerprint: str | None = None) -> ProbeBundle:
  """Reads a folder `save_probe` wrote. Errors (CheckpointError) name the file and the field or tensor, or say that
  a file is not a regular one (a named pipe would block the read forever); a file that does not match its seal, or a
  seal missing from a sealed format, is a DataFormatError naming the file; with `model_fingerprint`, a probe trained
  on another target model is refused (FeatureMismatchError)."""
  directory = _folder(directory)
  cfg_path, w_path = os.path.join(directory, CONFIG_FILE), os.path.join(directory, WEIGHTS_FILE)
  for path, what in ((cfg_path, "probe config"), (w_path, "probe weights")):
    if not os.path.lexists(path):
      raise CheckpointError(f"{directory}: no {os.path.basename(path)} (not a probe folder)")
    _regular(path, what)
    if os.path.lexists(seal_path(path)):  # sealed files are checked before they are parsed
      _check_sealed(path, what)
  try:
    meta = read_json(cfg_path, "probe config")
  except DataFormatError as e:  # unreadable, not UTF-8, not JSON, not an object: named, as a checkpoint error
    raise CheckpointError(str(e)) from None
  for key in ("format", "format_version", "probe", "features"):
    if key not in meta:
      raise CheckpointError(f"{cfg_path}: missing key {key!r}")
  version = meta["format_version"]
  known = isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= FORMAT_VERSION
  if meta["format"] != FORMAT or not known:
    raise CheckpointError(
      f"{cfg_path}: format {meta['format']!r} version {version!r}; this reader "
      f"knows {FORMAT!r} versions 1 to {FORMAT_VERSION}"
    )
  if version >= SEALED_SINCE:  # each present seal was checked above; none may be missing
    for path, what in ((cfg_path, "probe config"), (w_path, "probe weights")):
      if not os.path.lexists(seal_path(path)):
        raise DataFormatError(
          f"{path}: {what} has no seal ({os.path.basename(seal_path(path))} is missing; a bundle of format "
          f"version >= {SEALED_SINCE} is saved with one beside each file): copy the whole folder, or save it again"
        )
  else:
    logging.warning(
      "%s: a probe bundle of format version %d has no seals; save it again to seal it", directory, version
    )
  cfg = _config(ProbeConfig, meta["probe"], cfg_path, "probe")
  spec = _config(FeatureSpec, meta["features"], cfg_path, "features")
  fingerprint = meta.get("model_fingerprint")
  if fingerprint is not None and not isinstance(fingerprint, str):
    raise CheckpointError(f"{cfg_path}: 'model_fingerprint' must be a string or null, got {fingerprint!r}")
  if model_fingerprint is not None and fingerprint != model_fingerprint:
    raise FeatureMismatchError(
      f"{cfg_path}: the probe was trained on features of target model {fingerprint!r}, "
      f"this model is {model_fingerprint!r}"
    )
  st = SafetensorsFile(w_path)
  found = {}
  for k in st.keys():
    a = st.get(k)
    found[k] = (a.shape, a.dtype)
  _check_tensors(_expected(cfg), found, w_path, CheckpointError)
  _, abstract = abstract_probe(cfg)
  params = nnx.from_flat_state([(p, v.replace(jnp.asarray(st.get(_name(p))))) for p, v in nnx.to_flat_state(abstract)])
  return ProbeBundle(params=params, config=cfg, features=spec, model_fingerprint=fingerprint)
