"""Write a reftrain config with one suggestion applied (``analyzer suggest --emit-config``).

The run's own ``config.yaml`` (reftrain writes the resolved config there;
``run.json``'s ``config`` when the file is missing) with the suggestion's
overrides laid over it, key by dotted key, and a new ``run.name``; every
other key stays as the run had it. The analyzer never imports reftrain
(docs/architecture.md), so the overlay is plain YAML: a key the run's
config does not have is refused here, and the values are the rules' own
typed values; tests/test_suggest_cli.py runs reftrain on the emitted file.
The file runs as is: ``reftrain --nproc N --config FILE``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import RunManifest
from analyzer.verbs.suggest.engine import Suggestion, format_value

if TYPE_CHECKING:
    from analyzer.api import RunAnalysis


def new_run_name(ra: "RunAnalysis", suggestion: Suggestion, runs_dir: str | None) -> str:
    """``<run_id>-<rule>``, with ``-2``, ``-3``, ... when a directory of that name exists in ``runs_dir``."""
    base_id = ra.run_manifest.run_id or (Path(ra.path).name if isinstance(ra.path, Path) else "run")
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
    has no reftrain override, or an override names a key the run's config
    does not have (reftrain validates the values when it loads the file).
    """
    manifest = ra.run_manifest
    if ra.kind != "reftrain" or manifest.config is None:
        raise AnalyzerError(f"{ra.path}: --emit-config needs a reftrain run directory (this is a folder of traces)")
    if not suggestion.change.overrides:
        raise AnalyzerError(
            f"suggestion '{suggestion.rule}' has no reftrain override (advice only); pick another with --pick"
        )
    config = _run_config(ra, manifest)
    for key, value in suggestion.change.overrides.items():
        _overlay(config, key, value, f"suggestion '{suggestion.rule}'", ra.path)
    run_section = config.get("run") if isinstance(config.get("run"), dict) else None
    runs_dir = run_section.get("runs_dir") if run_section else None
    _overlay(config, "run.name", run_name or new_run_name(ra, suggestion, runs_dir), "analyzer suggest", ra.path)
    world = manifest.world_size or 1
    p = suggestion.predicted
    lines = [
        f"# reftrain config emitted by `analyzer suggest` from {ra.path}",
        f"# rule {suggestion.rule}: {suggestion.title}",
        "# change: " + " ".join(f"{k}={format_value(v)}" for k, v in suggestion.change.overrides.items()),
    ]
    if p is not None:
        lines.append(
            f"# predicted ({p.scope}): step {p.step_time_ms_before:.1f} -> {p.step_time_ms_after:.1f} ms, "
            f"throughput {p.gain:+.1%}"
        )
    lines.append(f"# run it: reftrain --nproc {world} --config <this file>")
    import yaml  # here, not at the top: every analyzer command imports this package, few emit (10 ms)

    return "\n".join(lines) + "\n" + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _run_config(ra: "RunAnalysis", manifest: RunManifest) -> dict:
    """The run's config.yaml as a dict (a deep copy), else run.json's ``config``."""
    rel = manifest.files.config or "config.yaml"
    path = Path(ra.path) / rel if isinstance(ra.path, Path) else None
    if path is not None and path.is_file():
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise AnalyzerError(f"{path}: cannot read the run's config ({str(exc).splitlines()[0]})") from None
        if isinstance(data, dict):
            return data
    return copy.deepcopy(manifest.config or {})


def _overlay(config: dict, key: str, value: object, origin: str, run: object) -> None:
    """Set ``section.name`` in ``config``; the key must be one the run's config has."""
    section, _, name = key.partition(".")
    table = config.get(section)
    if not name or not isinstance(table, dict) or name not in table:
        raise AnalyzerError(f"{run}: {origin} sets {key}, which the run's config does not have")
    table[name] = value


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
