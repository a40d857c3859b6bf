"""Atomic writes: old or new content, never a mix; results readable like a plain write."""
import os
import stat

import pytest

from ppvarlen.utils.io import atomic_dir, atomic_write_json, atomic_write_text


def test_atomic_file_replaces_whole_and_gets_normal_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "sub" / "a.json"
        atomic_write_json(path, {"x": 1})
        atomic_write_text(path, "new\n")
        assert path.read_text() == "new\n"
        # mkstemp would leave 0600: a server running as another user could not read an export
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp files left
    finally:
        os.umask(old)


def test_atomic_dir_keeps_the_old_directory_when_writing_fails(tmp_path):
    target = tmp_path / "export"
    with atomic_dir(target) as d:
        atomic_write_text(os.path.join(d, "f.txt"), "v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as d:
            atomic_write_text(os.path.join(d, "f.txt"), "v2")
            raise RuntimeError("export failed half-way")
    assert (target / "f.txt").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o777 & ~umask
