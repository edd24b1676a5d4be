"""``{dataset: ...}`` sources read with the datasets library, offline: a local directory, a save_to_disk
output, and a Hub id in a temporary hub cache laid out as ``hf download`` leaves it."""

import json

import pytest

from gyre.config.data_schema import DataConfig, DatasetSource
from gyre.data.sources import DataError, read_sources

datasets = pytest.importorskip("datasets")

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
# tiny gsm8k-style set
"""


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Empty hub and datasets caches of this test's own (nothing in the user's caches is read or written)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    return tmp_path / "hub"


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def gsm(n, split):
    return [{"question": f"{split} {i}?", "answer": f"so\n#### {i}"} for i in range(n)]


def rows(source):
    return [(r.where, r.data) for r in read_sources([source])]


def test_local_directory_with_splits(caches, tmp_path):
    write_jsonl(tmp_path / "mine" / "train.jsonl", gsm(3, "train"))
    write_jsonl(tmp_path / "mine" / "test.jsonl", gsm(2, "test"))
    got = rows(DatasetSource(dataset=str(tmp_path / "mine"), split="test"))
    assert got == [(f"{tmp_path / 'mine'}[test]:row {i}", r) for i, r in enumerate(gsm(2, "test"))]


def test_save_to_disk_output(caches, tmp_path):
    d = datasets.DatasetDict({"train": datasets.Dataset.from_list(gsm(2, "train"))})
    d.save_to_disk(str(tmp_path / "saved"))
    assert [data for _, data in rows(DatasetSource(dataset=str(tmp_path / "saved")))] == gsm(2, "train")
    with pytest.raises(DataError, match=r"has no split 'test'; its splits: train; set split to one of them"):
        rows(DatasetSource(dataset=str(tmp_path / "saved"), split="test"))


def test_a_save_to_disk_folder_given_as_a_plain_path(caches, tmp_path):
    """As a data file entry, a saved split or a saved one-split DatasetDict is read as the dataset it is (not
    its dataset_dict.json as a row); with several splits, the error says how to pick one."""
    datasets.Dataset.from_list(gsm(3, "train")).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(gsm(2, "train"))}).save_to_disk(str(tmp_path / "dict"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(gsm(2, "train")),
                          "test": datasets.Dataset.from_list(gsm(1, "test"))}).save_to_disk(str(tmp_path / "two"))
    assert [data for _, data in rows(str(tmp_path / "one"))] == gsm(3, "train")
    assert [data for _, data in rows(str(tmp_path / "dict"))] == gsm(2, "train")
    with pytest.raises(DataError, match=r"holding the splits train, test; say which to read: \{dataset: .*two, "
                                        r"split: train\}"):
        rows(str(tmp_path / "two"))


def test_hub_id_from_the_hub_cache(caches):
    repo = caches / "datasets--acme--tiny-gsm8k"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (snapshot).mkdir(parents=True)
    (snapshot / "README.md").write_text(README)
    write_jsonl(snapshot / "main" / "train-00000-of-00001.jsonl", gsm(4, "train"))
    write_jsonl(snapshot / "main" / "test-00000-of-00001.jsonl", gsm(1, "test"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    # The form a YAML config gives, through the config schema.
    cfg = DataConfig(train_files=[{"dataset": "acme/tiny-gsm8k", "name": "main", "split": "test"}])
    assert rows(cfg.train_files[0]) == [("acme/tiny-gsm8k[test]:row 0", gsm(1, "test")[0])]
    with pytest.raises(DataError, match=r"cannot be read offline: ValueError: Unknown split \"dev\""):
        rows(DatasetSource(dataset="acme/tiny-gsm8k", name="main", split="dev"))


def test_a_dataset_in_no_cache_names_the_command_that_fetches_it(caches, tmp_path):
    with pytest.raises(DataError, match=r"dataset 'acme/absent' is neither a local path nor in the local caches "
                                        r".* `hf download --repo-type dataset acme/absent`"):
        rows(DatasetSource(dataset="acme/absent"))
    (tmp_path / "f.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match=r"is a file: list it in the data files directly"):
        rows(DatasetSource(dataset=str(tmp_path / "f.jsonl")))
