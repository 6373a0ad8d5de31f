"""The config-directory watcher sees a ConfigMap update (an atomic ``..data`` symlink swap)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vgpu_state.agent.configwatch import FALLBACK_POLL, ConfigDirWatcher
from vgpu_state.agent.queue import WorkQueue


def write_configmap_volume(directory: Path, generation: str, text: str) -> None:
    """Do what the kubelet does: a new timestamped dir, then rename ``..data`` over the old link."""
    version_dir = directory / f"..2026_11_23_{generation}"
    version_dir.mkdir()
    (version_dir / "config.yaml").write_text(text, encoding="utf-8")
    tmp_link = directory / "..data_tmp"
    tmp_link.symlink_to(version_dir.name)
    os.rename(tmp_link, directory / "..data")  # atomic replace of the symlink
    user_link = directory / "config.yaml"
    if not user_link.is_symlink():
        user_link.symlink_to("..data/config.yaml")


def wait_watching(watcher: ConfigDirWatcher, timeout: float) -> bool:
    """True once the watch is set up (changes from then on are seen)."""
    return watcher._watching.wait(timeout)


def test_a_symlink_swap_of_the_configmap_triggers_once(tmp_path: Path) -> None:
    write_configmap_volume(tmp_path, "1", "version: v1\n")
    queue = WorkQueue(settle=0.3)
    watcher = ConfigDirWatcher(tmp_path, lambda: queue.trigger("config"), poll=0.1).start()
    try:
        assert wait_watching(watcher, 5)
        assert queue.get(timeout=0.3) is None, "nothing changed yet"
        write_configmap_volume(tmp_path, "2", "version: v1\ndefault: x\n")
        batch = queue.get(timeout=5)
        assert batch is not None and batch.reasons == ("config",)
        # The file read through the stable name is the new one.
        assert (tmp_path / "config.yaml").read_text() == "version: v1\ndefault: x\n"
        assert queue.get(timeout=0.5) is None, "one swap -> one reconcile"
    finally:
        watcher.stop(timeout=5)


def test_a_directory_that_appears_later_is_watched(tmp_path: Path) -> None:
    directory = tmp_path / "config"
    queue = WorkQueue(settle=0.1)
    watcher = ConfigDirWatcher(
        directory, lambda: queue.trigger("config"), poll=0.1, retry=0.1
    ).start()
    try:
        assert not wait_watching(watcher, 0.3)
        directory.mkdir()
        assert wait_watching(watcher, 5)
        write_configmap_volume(directory, "1", "version: v1\n")
        assert queue.get(timeout=5) is not None
    finally:
        watcher.stop(timeout=5)


def test_stop_ends_the_watch_thread(tmp_path: Path) -> None:
    watcher = ConfigDirWatcher(tmp_path, lambda: None, poll=0.1).start()
    assert wait_watching(watcher, 5)
    watcher.stop(timeout=5)
    assert not watcher._thread.is_alive()


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "listing"])
def test_a_swap_and_an_edit_in_place_are_each_seen_once(tmp_path: Path, inotify: bool) -> None:
    """Both watches (the kernel's, and the look at the listing every second where it is
    not available) see the ConfigMap's swap, and an edit of a plain file."""
    write_configmap_volume(tmp_path, "1", "version: v1\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("version: v1\n")
    queue = WorkQueue(settle=0.2)
    watcher = ConfigDirWatcher(
        tmp_path, lambda: queue.trigger("config"), poll=0.1, inotify=inotify
    ).start()
    try:
        assert wait_watching(watcher, 5)
        assert queue.get(timeout=0.3) is None, "nothing changed yet"
        write_configmap_volume(tmp_path, "2", "version: v1\ndefault: x\n")
        assert queue.get(timeout=5) is not None
        assert queue.get(timeout=FALLBACK_POLL + 0.5) is None, "one swap -> one reconcile"
        plain.write_text("version: v1\ndefault: y\n")
        assert queue.get(timeout=5) is not None
    finally:
        watcher.stop(timeout=5)


def test_a_directory_removed_and_made_again_is_watched_again(tmp_path: Path) -> None:
    directory = tmp_path / "config"
    directory.mkdir()
    queue = WorkQueue(settle=0.1)
    watcher = ConfigDirWatcher(
        directory, lambda: queue.trigger("config"), poll=0.1, retry=0.1
    ).start()
    try:
        assert wait_watching(watcher, 5)
        directory.rmdir()
        assert queue.get(timeout=5) is not None, "the directory's removal is a change"
        directory.mkdir()
        assert wait_watching(watcher, 5)
        write_configmap_volume(directory, "1", "version: v1\n")
        assert queue.get(timeout=5) is not None
    finally:
        watcher.stop(timeout=5)


def test_the_agent_watches_without_watchfiles(tmp_path: Path) -> None:
    """The watch is the standard library's: no third-party watcher is loaded."""
    watcher = ConfigDirWatcher(tmp_path, lambda: None, poll=0.1).start()
    try:
        assert wait_watching(watcher, 5)
        assert "watchfiles" not in sys.modules
    finally:
        watcher.stop(timeout=5)
