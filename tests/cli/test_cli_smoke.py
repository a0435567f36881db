import subprocess
import sys

from shardlake.cli.main import main


def test_help_exits_zero(capsys):
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "shardlake" in capsys.readouterr().out


def test_unknown_command_is_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "shardlake.cli.main", "no-such-command"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
