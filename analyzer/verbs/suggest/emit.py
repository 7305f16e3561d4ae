"""Write a reftrain config with one suggestion applied (``analyzer suggest --emit-config``).

The config is the run's resolved config (``run.json`` ``config``, the same
content as the run's ``config.yaml``) with the suggestion's overrides set
through reftrain's own typed setters and validated by ``reftrain.config.resolve``,
so the file runs as is: ``reftrain --nproc N --config FILE``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.errors import AnalyzerError
from analyzer.verbs.suggest.engine import Suggestion, format_value

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


def new_run_name(ra: "RunAnalysis", suggestion: Suggestion, runs_dir: str | None) -> str:
    """``<run_id>-<rule>``, with ``-2``, ``-3``, ... when a directory of that name exists in ``runs_dir``."""
    base_id = (ra.manifest or {}).get("run_id") or (Path(ra.path).name if isinstance(ra.path, Path) else "run")
    name = f"{base_id}-{suggestion.rule.replace('_', '-')}"
    if runs_dir:
        n = 2
        candidate = name
        while (Path(runs_dir) / candidate).exists():
            candidate = f"{name}-{n}"
            n += 1
        name = candidate
    return name


def emitted_config_text(ra: "RunAnalysis", suggestion: Suggestion, run_name: str | None = None) -> str:
    """The YAML text of the run's config with ``suggestion`` applied and a new run name.

    Raises AnalyzerError when the run is not a reftrain run, the suggestion
    has no reftrain override, or the result is not a valid reftrain config.
    """
    from reftrain.config import from_dict, resolve, set_value, to_yaml
    from reftrain.errors import ReftrainError

    manifest = ra.manifest or {}
    config = manifest.get("config")
    if ra.kind != "reftrain" or not isinstance(config, dict):
        raise AnalyzerError(f"{ra.path}: --emit-config needs a reftrain run directory (this is a folder of traces)")
    if not suggestion.change.overrides:
        raise AnalyzerError(f"suggestion '{suggestion.rule}' has no reftrain override (advice only); pick another with --pick")
    try:
        cfg = from_dict(config, f"{ra.path}/run.json config")
        for key, value in suggestion.change.overrides.items():
            set_value(cfg, key, value, f"suggestion {suggestion.rule}")
        name = run_name or new_run_name(ra, suggestion, cfg.run.runs_dir)
        set_value(cfg, "run.name", name, "analyzer suggest")
        resolve(cfg, manifest.get("world_size"))
    except ReftrainError as exc:
        raise AnalyzerError(f"{ra.path}: the config with '{suggestion.rule}' applied is not valid: {exc}") from None
    world = manifest.get("world_size") or 1
    p = suggestion.predicted
    lines = [
        f"# reftrain config emitted by `analyzer suggest` from {ra.path}",
        f"# rule {suggestion.rule}: {suggestion.title}",
        "# change: " + " ".join(f"{k}={format_value(v)}" for k, v in suggestion.change.overrides.items()),
    ]
    if p is not None:
        lines.append(f"# predicted ({p.scope}): step {p.step_time_ms_before:.1f} -> {p.step_time_ms_after:.1f} ms, "
                     f"throughput {p.gain:+.1%}")
    lines.append(f"# run it: reftrain --nproc {world} --config <this file>")
    return "\n".join(lines) + "\n" + to_yaml(cfg)


def emit_config(ra: "RunAnalysis", suggestion: Suggestion, path: Path | str, run_name: str | None = None) -> Path:
    """Write :func:`emitted_config_text` to ``path`` (``.yaml``); returns the path. AnalyzerError on failure."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise AnalyzerError(f"{path}: --emit-config writes YAML; name the file *.yaml")
    text = emitted_config_text(ra, suggestion, run_name)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise AnalyzerError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
