"""pack from a plain script: an unguarded script is refused with what to do, a guarded one packs."""

import os
import subprocess
import sys
import textwrap

from shardlake.testing import synth_corpus


def _run_script(tmp_path, body):
    src = tmp_path / "frames"
    synth_corpus(src, 2, 3, seed=1, neighbors=2, lanes=4)
    script = tmp_path / "pack_script.py"
    script.write_text(textwrap.dedent(body).format(src=str(src), root=str(tmp_path / "root")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )


def test_unguarded_script_is_refused_with_the_fix(tmp_path):
    proc = _run_script(
        tmp_path,
        """
        import shardlake
        print("script ran")
        shardlake.open({root!r}).pack({src!r}, tag="v1", options=shardlake.PackOptions(workers=2))
        """,
    )
    assert proc.returncode != 0
    assert proc.stdout.count("script ran") == 1  # no worker re-ran it
    assert 'if __name__ == "__main__":' in proc.stderr
    assert 'executor="thread"' in proc.stderr
    assert "memory" not in proc.stderr
    assert not (tmp_path / "root" / "commits").exists()


def test_guarded_script_packs_with_processes(tmp_path):
    proc = _run_script(
        tmp_path,
        """
        import shardlake
        if __name__ == "__main__":
            root = shardlake.open({root!r})
            root.pack({src!r}, tag="v1", options=shardlake.PackOptions(workers=2))
            print("tags", [v.tag for v in root.versions()])
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tags ['v1']" in proc.stdout
