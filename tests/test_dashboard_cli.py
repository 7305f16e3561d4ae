"""dashboard CLI: address, port and runs-folder handling, without a browser."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard import cli


class _Exec(Exception):
    pass


@pytest.fixture
def captured_exec(monkeypatch):
    """Replace os.execve so main() returns what it would have run."""
    calls = {}

    def fake_execve(path, argv, env):
        calls.update(path=path, argv=argv, env=env)
        raise _Exec

    monkeypatch.setattr(cli.os, "execve", fake_execve)
    return calls


def _opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_default_binds_localhost_on_a_free_port_and_prints_url(tmp_path, captured_exec, capsys):
    with pytest.raises(_Exec):
        cli.main([str(tmp_path)])
    argv = captured_exec["argv"]
    assert argv[1:5] == ["-m", "dashboard.serve", "run", str(cli.APP_PATH)]
    assert _opt(argv, "--runner.magicEnabled") == "false"
    assert _opt(argv, "--server.address") == "127.0.0.1"
    assert _opt(argv, "--server.headless") == "true"
    assert _opt(argv, "--browser.gatherUsageStats") == "false"
    assert _opt(argv, "--server.fileWatcherType") == "none"
    port = int(_opt(argv, "--server.port"))
    assert 0 < port < 65536
    assert captured_exec["env"][cli.RUNS_DIR_ENV] == str(tmp_path.resolve())
    out = capsys.readouterr().out
    assert f"http://127.0.0.1:{port}/" in out
    assert str(tmp_path.resolve()) in out


def test_explicit_port_and_host(tmp_path, captured_exec, capsys):
    port = cli.free_port("127.0.0.1")
    with pytest.raises(_Exec):
        cli.main([str(tmp_path), "--port", str(port), "--host", "0.0.0.0"])
    argv = captured_exec["argv"]
    assert _opt(argv, "--server.port") == str(port)
    assert _opt(argv, "--server.address") == "0.0.0.0"
    assert "reachable from other machines" in capsys.readouterr().out


def test_busy_port_is_one_line_error(tmp_path, captured_exec, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert cli.main([str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dashboard: port {port} on 127.0.0.1 is already in use"
    assert captured_exec == {}


def test_missing_runs_dir_is_one_line_error(tmp_path, captured_exec, capsys):
    missing = tmp_path / "nope"
    assert cli.main([str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "is not a folder" in err[0]
    assert captured_exec == {}


def test_out_of_range_port(tmp_path, captured_exec, capsys):
    assert cli.main([str(tmp_path), "--port", "70000"]) == 2
    assert "not a TCP port" in capsys.readouterr().err


def test_app_path_exists():
    assert Path(cli.APP_PATH).is_file()


def test_server_process_imports_the_analyzer_then_runs_streamlit(monkeypatch):
    """dashboard.serve is `python -m streamlit` with the analyzer imported before the server listens."""

    code = (
        "import sys\n"
        "import streamlit.web.cli as st_cli\n"
        "def fake_main(prog_name):\n"
        "    print(prog_name, 'pandas' in sys.modules, 'analyzer.api' in sys.modules, 'analyzer.verbs.suggest.engine' in sys.modules)\n"
        "st_cli.main = fake_main\n"
        "from dashboard import serve\n"
        "serve.main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["streamlit", "True", "True", "True"]
