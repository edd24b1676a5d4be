"""Every local input form gyre reads itself, and the errors of each."""

import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gyre.data.sources import DataError, expand, read_sources

ROWS = [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "2+2=", "ground_truth": "4"}]


def rows(*sources):
    return [(r.where.rsplit("/", 1)[-1], r.data) for r in read_sources([str(s) for s in sources])]


def test_jsonl_and_json_array_and_jsonl_named_json(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    (tmp_path / "b.json").write_text(json.dumps(ROWS, indent=2))
    (tmp_path / "c.json").write_text(json.dumps(ROWS[0]) + "\n")
    assert rows(tmp_path / "a.jsonl") == [("a.jsonl:1", ROWS[0]), ("a.jsonl:2", ROWS[1])]
    assert rows(tmp_path / "b.json") == [("b.json:row 0", ROWS[0]), ("b.json:row 1", ROWS[1])]
    assert rows(tmp_path / "c.json") == [("c.json:1", ROWS[0])]


def test_parquet_keeps_types(tmp_path):
    pq.write_table(pa.table({"prompt": ["x"], "n": [3], "tests": [{"asserts": ["assert f() == 1"]}]}),
                   tmp_path / "a.parquet")
    assert rows(tmp_path / "a.parquet") == [("a.parquet:row 0", {"prompt": "x", "n": 3,
                                                                  "tests": {"asserts": ["assert f() == 1"]}})]


def test_csv_and_tsv(tmp_path):
    # Excel's byte-order mark, a quoted comma and a quoted line break.
    (tmp_path / "a.csv").write_bytes('\ufeffquestion,answer\n"a, b",1\n"two\nlines",2\n'.encode())
    (tmp_path / "a.tsv").write_text("question\tanswer\nx\t3\n")
    assert rows(tmp_path / "a.csv") == [("a.csv:2", {"question": "a, b", "answer": "1"}),
                                        ("a.csv:4", {"question": "two\nlines", "answer": "2"})]
    assert rows(tmp_path / "a.tsv") == [("a.tsv:2", {"question": "x", "answer": "3"})]
    (tmp_path / "bad.csv").write_text("question,answer\nx,1,2\n")
    with pytest.raises(DataError, match=r"bad.csv:2: 3 cells, but the header names 2 columns; quote cells"):
        rows(tmp_path / "bad.csv")
    (tmp_path / "latin.csv").write_bytes(b"question\n\xe9\n")
    with pytest.raises(DataError, match=r"latin.csv: not UTF-8 text \(byte 0xe9\)"):
        rows(tmp_path / "latin.csv")


def test_directory_reads_its_data_files_in_order(tmp_path):
    d = tmp_path / "shards"
    (d / "sub").mkdir(parents=True)
    (d / "part-1.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    (d / "part-0.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (d / "README.md").write_text("not data")
    (d / ".hidden.jsonl").write_text("{")
    (d / "sub" / "x.jsonl").write_text("{")  # subdirectories are not read
    assert [w for w, _ in rows(d)] == ["part-0.jsonl:1", "part-1.jsonl:1"]


def test_directory_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no data files .* subdirectories are not read: name the files"):
        expand(str(tmp_path / "empty"))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        (mixed / name).write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(DataError, match=r"mixes held-out split files \(test.jsonl\) with the others"):
        expand(str(mixed))


def test_glob(tmp_path):
    for i in (2, 0, 1):
        (tmp_path / "deep" / str(i)).mkdir(parents=True)
        (tmp_path / "deep" / str(i) / "rows.jsonl").write_text(json.dumps(ROWS[i % 2]) + "\n")
    assert [p.parent.name for p in expand(str(tmp_path / "deep" / "**" / "*.jsonl"))] == ["0", "1", "2"]
    with pytest.raises(DataError, match=r"the glob .*nothing-\*.parquet matches no file"):
        expand(str(tmp_path / "nothing-*.parquet"))


@pytest.mark.parametrize("name,content,message", [
    ("empty.jsonl", "", r"data source .*empty.jsonl holds no rows"),
    ("blank.jsonl", "\n\n", r"holds no rows"),
    ("header.csv", "prompt,ground_truth\n", r"holds no rows"),
    ("empty.json", "[]", r"holds no rows"),
    ("rows.parquet", "PAR1 garbage", r"not a readable Parquet file"),
    ("array.jsonl", json.dumps(ROWS), r"array.jsonl:1: expected a JSON object, got list; .* JSON array belongs in"),
    ("split.jsonl", '[{"prompt": "x",\n', r"split.jsonl:1: invalid JSON .* a JSON array belongs in a .json file"),
    ("broken.json", "[{", r"broken.json: invalid JSON at line 1"),
    ("rows.txt", "x", r"unsupported format '.txt'; use .jsonl, .json, .parquet, .csv or .tsv"),
])
def test_unusable_files(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=message):
        rows(tmp_path / name)


def test_missing_and_unreadable_files(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"data file .*nope.jsonl does not exist"):
        rows(tmp_path / "nope.jsonl")
    (tmp_path / "locked.jsonl").write_text(json.dumps(ROWS[0]) + "\n")

    def refuse(self, *args, **kwargs):  # what open() raises for a user without read access (tests run as root)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "open", refuse)
    with pytest.raises(DataError, match=r"locked.jsonl cannot be read \(Permission denied\); give this user read"):
        rows(tmp_path / "locked.jsonl")
