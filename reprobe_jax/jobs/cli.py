"""The CLI layer shared by train.py and eval.py: flag parsing, progress bars, the target model, one-line errors.

Every mistake a user can make on the command line ends in one line on stderr, `error: <field or file>: <reason>`,
and a non-zero exit, with nothing written: a config flag that does not parse (`parse_flags`, exit 2) and any
ReprobeError of the job (`run_job`, exit 1). A job's whole config is checked before its target is built or loaded,
and what depends on the target's shape right after it is known and before anything is sampled (`reprobe_setup`).

Flags beside `--config` (per process, so not in the shared config): a multi-process job's `--coordinator_address`,
`--num_processes`, `--process_id`, `--local_device_ids` and `--distributed_timeout` (each defaulting to its JAX_*
environment variable, and on Cloud TPU pods and SLURM to what jax detects; `run_job` joins the job before anything
runs on a device), and the target's `--mesh` and `--target_dtype` (docs/scale.md).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable, Mapping, NoReturn, Sequence, TypeVar

from absl import flags, logging
from tqdm.auto import tqdm

from reprobe_jax.errors import ConfigError, ReprobeError
from reprobe_jax.fields import plain, replace_fields
from reprobe_jax.jobs import target, target_config
from reprobe_jax.jobs.reprobe_config import ReprobeConfig, check_model, check_target, config_from_dict, run_folder
from reprobe_jax.models import LanguageModel, load_pretrained, make_mesh
from reprobe_jax.models.sharding import DistributedConfig, maybe_initialize_distributed

T = TypeVar("T")

_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "Multi-process jobs: host:port of process 0 (default: $JAX_COORDINATOR_ADDRESS; on "
  "Cloud TPU pods and SLURM jax finds it).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Multi-process jobs: how many processes take part (default: $JAX_NUM_PROCESSES)."
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "Multi-process jobs: this process's id in [0, num_processes) (default: $JAX_PROCESS_ID)."
)
_LOCAL_DEVICE_IDS = flags.DEFINE_list(
  "local_device_ids",
  None,
  "Multi-process jobs: the accelerators this process "
  "drives, e.g. 0 or 0,1 (default: $JAX_LOCAL_DEVICE_IDS, else all it sees).",
)
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
  "distributed_timeout",
  300,
  "Multi-process jobs: seconds for every process to reach the coordinator before the job stops.",
  lower_bound=1,
)
_MESH = flags.DEFINE_list(
  "mesh",
  None,
  "Shard the target model over a (data, fsdp, tensor) mesh of all devices, "
  "e.g. 1,1,4 or -1,1,8 (-1: what the others leave); default: no mesh (one device).",
)
_TARGET_DTYPE = flags.DEFINE_enum(
  "target_dtype", "float32", ["float32", "bfloat16"], "dtype of the target model's parameters and activations."
)


class ProgressBars:
  """Context manager; `update(stage, done, total)` moves the bar of that stage (the label's first word)."""

  def __init__(self):
    self.bars: dict[str, tqdm] = {}

  def update(self, stage: str, done: int, total: int) -> None:
    key = stage.split(" ")[0]
    bar = self.bars.get(key)
    if bar is None:
      bar = self.bars[key] = tqdm(total=total, desc=key, dynamic_ncols=True)
    bar.set_description(stage, refresh=False)
    bar.update(done - bar.n)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for bar in self.bars.values():
      bar.close()


def fail(message: str, code: int = 1) -> NoReturn:
  """Prints `error: <message>` as one line on stderr and exits with `code`."""
  print("error: " + " ".join(str(message).split()), file=sys.stderr)
  sys.exit(code)


_OVERRIDE = re.compile(r"^--?(config(?:\.[^=\s]+)+)(?:=|$)")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parser for train.py / eval.py (`app.run(main, flags_parser=parse_flags)`): a config file that is
  missing or fails to load, an override of a field the config lacks, a value of the wrong type or a flag without
  its value is one line `error: --config...: <reason>` and exit 2, not a traceback."""
  given = [a.split("=", 1)[1] for a in argv if a.startswith(("--config=", "-config="))]
  path = given[-1] if given else "the default config"  # absl keeps the last value of a repeated flag
  try:
    rest = flags.FLAGS(argv)
    flags.FLAGS["config"].value.to_dict()  # a config file that failed to load raises only when read
    return rest
  except flags.Error as e:
    lines = _lines(str(e))  # a config file's traceback: its first line says where, its last what
    fail((lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}").removeprefix("flag "), 2)
  except (KeyError, AttributeError) as e:  # ml_collections' answer to an override of a field the config lacks
    key = str(e.args[0] if e.args else e).strip("'\"")
    overrides = [m.group(1) for m in map(_OVERRIDE.match, argv) if m]
    named = next((o for o in overrides if key in o.split(".")[1:]), None)
    if named is None:
      fail(f"--config={path}: {type(e).__name__}: {key}", 2)
    fail(f"--{named}: {path} has no field {key!r} there", 2)
  except (OSError, SyntaxError, ImportError) as e:
    lines = _lines(str(e))  # the paths tried, the error last
    fail(f"--config={path}: cannot load the config ({lines[-1]})", 2)


def _lines(message: str) -> list[str]:
  """The non-blank lines of a message, stripped (at least one)."""
  return [line.strip() for line in message.splitlines() if line.strip()] or [message]


def workdir_of(config, where: str = "config") -> str:
  """`config.workdir`, a non-empty path (ConfigError naming `<where>.workdir` otherwise)."""
  workdir = config.get("workdir")
  if not isinstance(workdir, str) or not workdir:
    raise ConfigError(f"{where}.workdir: expected a non-empty path, got {workdir!r}")
  return workdir


def job_section(config, section: str, from_dict: Callable[[Any], T], lifted: Sequence[str] = ("seed",)) -> T:
  """`from_dict(config.<section>)` with the job's top-level fields `lifted` (its `config.seed`, ...) put in.

  A lifted value is checked first on its own, at the path the user wrote (`replace_fields` at the root
  `config`), so `--config.seed=-1` is named `config.seed`, not `config.<section>.seed` nor the dataclass's field;
  the section and the lifted values are then checked together (`from_dict` names `config.<section>.<field>`)."""
  values = config.get(section, {})
  values = values.to_dict() if hasattr(values, "to_dict") else values
  if not isinstance(values, Mapping):
    raise ConfigError(f"config.{section}: expected a mapping of fields, got {values!r}")
  given = {
    name: plain(config[name]) if hasattr(config[name], "to_dict") else config[name] for name in lifted if name in config
  }
  replace_fields(from_dict({}), given, root="config")
  return from_dict({**values, **given})


def distributed_config() -> DistributedConfig:
  """The DistributedConfig of this process's flags (all unset when the flags were not parsed: a library caller)."""
  if not flags.FLAGS.is_parsed():
    return DistributedConfig(where="--")
  ids = _LOCAL_DEVICE_IDS.value
  return DistributedConfig(
    coordinator_address=_COORDINATOR.value,
    num_processes=_NUM_PROCESSES.value,
    process_id=_PROCESS_ID.value,
    local_device_ids=tuple(ids) if ids else None,
    timeout_s=_DISTRIBUTED_TIMEOUT.value,
    where="--",
  )


def target_placement() -> dict:
  """`load_pretrained`'s dtype and mesh from `--target_dtype` and `--mesh` (ConfigError naming --mesh)."""
  if not flags.FLAGS.is_parsed():
    return {}
  out = {"dtype": _TARGET_DTYPE.value}
  if _MESH.value:
    try:
      sizes = [int(v) for v in _MESH.value]
      if len(sizes) != 3 or any(v == 0 or v < -1 for v in sizes):
        raise ValueError("expected three sizes data,fsdp,tensor, each >= 1 or -1")
      out["mesh"] = make_mesh(*sizes)
    except ValueError as e:
      raise ConfigError(f"--mesh={','.join(_MESH.value)}: {e}") from None
  return out


def pretrained_target(config) -> str:
  """The pretrained target a job names: `config.target` when it is a string (the math configs: a Hugging Face
  folder, a .gguf file, a hub id in the local cache or an alias such as 'smollm2'), else `config.target_path`
  (the synthetic configs, whose `config.target` is the built-in target's build section); '' for the built-in one.
  ConfigError naming the field for anything but a string."""
  if isinstance(config.get("target"), str):
    if not config.target:
      raise ConfigError("config.target: expected a model (a HF folder, a .gguf file or a hub id), got ''")
    return config.target
  path = config.get("target_path", "")
  if not isinstance(path, str):
    raise ConfigError(f"config.target_path: expected a path or hub id (empty = the built-in target), got {path!r}")
  return path


def build_target(config) -> LanguageModel:
  """The target LM of a job: the pretrained one it names (`pretrained_target`), else the built-in synthetic one
  (built or reused); placed by `--target_dtype` and `--mesh`."""
  if pretrained_target(config):
    return load_pretrained(pretrained_target(config), **target_placement())
  with ProgressBars() as bars:
    out = target.build(
      target_config.config_from_dict(config.target, "config.target"), config.target.workdir, progress=bars.update
    )
  print(f"\nTarget model {out}/model, its own samples on held-out problems (T=1.0):\n")
  print(target.report_markdown(target.load_report(out)))
  return load_pretrained(f"{out}/model", **target_placement())


def target_report(config) -> dict | None:
  """The built-in target's report (`jobs.target.build`, reused from its cache), or None for a pretrained target."""
  if pretrained_target(config):
    return None
  return target.load_report(
    target.build(target_config.config_from_dict(config.target, "config.target"), config.target.workdir)
  )


def run_dir(config, lm: LanguageModel) -> str:
  """`<config.workdir>/<hash>`: one folder per (job config, target model, problems and prompts), so a rebuilt
  target, a changed config or a changed task generator starts afresh while a rerun of the same one resumes and
  reuses its cached stages (`reprobe_config.run_folder`)."""
  return run_folder(config.workdir, lm, config_from_dict(config))


def reprobe_setup(config) -> tuple[LanguageModel, ReprobeConfig, str]:
  """(target model, ReprobeConfig, run folder) of a reprobe job: the common start of its train and eval runs. The
  whole config is checked before the target is built or loaded, and against the target's shape (its layers,
  context, vocabulary) before anything is sampled: for the built-in target from its config, before the build."""
  cfg = config_from_dict(config)
  workdir = workdir_of(config)
  if not pretrained_target(config):
    built = target_config.config_from_dict(config.target, "config.target")
    workdir_of(config.target, "config.target")
    check_model(
      cfg, num_layers=built.model.num_layers, context=built.model.max_position_embeddings, vocab_size=built.vocab_size
    )
  lm = build_target(config)
  check_target(cfg, lm)
  return lm, cfg, run_folder(workdir, lm, cfg)


def run_job(config, jobs: dict[str, Callable]) -> None:
  """Runs `jobs[config.job]`, first joining a multi-process job when the flags or the environment describe one
  (`maybe_initialize_distributed`); a ReprobeError (a DistributedError included) is printed in one line and exits
  1."""
  logging.set_verbosity(logging.WARNING)  # orbax and grain log every checkpoint at INFO
  job = config.get("job")
  if job not in jobs:
    fail(f"config.job={job!r} is not one of {sorted(jobs)}", 2)
  try:
    maybe_initialize_distributed(distributed_config())
    jobs[job](config)
  except ReprobeError as e:
    fail(str(e))
