"""A model given as a .yaml path that does not exist is "file not found", not an
unknown profile name with suggestions (audit D37)."""

from __future__ import annotations


def test_fit_names_the_missing_file(tmp_path, kvsim_cli):
    missing = tmp_path / "nonexist.yaml"
    rc, err, _ = kvsim_cli("fit", "--gpu", "rtx-4090", "--model", missing)
    assert (rc, err) == (2, f"error: model: '{missing}' — file not found")
