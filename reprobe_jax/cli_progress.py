"""tqdm bars for the CLI layer: one bar per stage, driven by the library's (stage, done, total) callbacks."""

from __future__ import annotations

from tqdm.auto import tqdm


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
