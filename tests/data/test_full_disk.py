"""Issue 38, target 7 (reliability round 4): `preprocess` onto a full disk says which output, which
file system and how much room is left, in one line, and leaves nothing.  A file size limit stands
for the full disk (EFBIG, or numpy's short write, as ENOSPC)."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

from dlrm_cache.cli import main


def test_preprocess_onto_a_full_disk_names_the_output_and_the_file_system(
    capsys, processed_synth: Path, tmp_path: Path
):
    """Before: "520000 requested and 257520 written", naming neither the file nor the disk."""
    raw, out = processed_synth.parent / "raw", tmp_path / "ds"
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))
    try:
        main(["preprocess", f"input={raw}", f"output={out}", "workers=1", "progress=false"])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        signal.signal(signal.SIGXFSZ, old)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"dlrm-cache preprocess: error: output {out}: not written: "), lines
    assert "out of room on the file system at /" in lines[0] and "bytes free" in lines[0]
    assert list(tmp_path.iterdir()) == []
