"""Every command answers --version with the installed trainperf version."""

from __future__ import annotations

from importlib import metadata

import pytest

VERSION = metadata.version("trainperf")


def _parse(prog: str, argv: list[str]):
    if prog == "dashboard":
        from dashboard.cli import parse_args

        return parse_args(argv)
    mod = __import__(f"{prog}.cli", fromlist=["build_parser"])
    return mod.build_parser().parse_args(argv)


@pytest.mark.parametrize("prog", ["analyzer", "dashboard", "reftrain"])
def test_version_flag_prints_the_package_version(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(prog, ["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} (trainperf) {VERSION}"
