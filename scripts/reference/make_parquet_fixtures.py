"""Parquet files as the field writes them (pyarrow, which Hugging Face `datasets` and pandas use),
for `variorum prepare`'s Parquet reader: crates/variorum-data/tests/fixtures/parquet/.

    pip install pyarrow==26.0.1   # pinned in scripts/reference/requirements.txt
    python scripts/reference/make_parquet_fixtures.py

Each file holds the same rows: an `id` column, a `text` column with multi-byte characters, an
empty string and nulls (no document, as variorum reads them), and a `meta` struct column that
the reader must pass over. `expected.json` lists the documents pyarrow itself reads back, in
order: what `prepare` must find. The files differ in what a reader must handle:

- `snappy-dictionary.parquet`: snappy pages, dictionary encoding, row groups of 7 rows (the
  `datasets` defaults, but for the row-group size);
- `zstd-plain-large-string.parquet`: zstd pages, no dictionary, `large_string` text, data page
  format v2;
- `gzip-v1.parquet`: gzip pages, format 1.0 files.
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parents[2] / "crates/variorum-data/tests/fixtures/parquet"


def rows():
    texts = []
    for i in range(40):
        if i % 13 == 5:
            texts.append(None)
        elif i == 8:
            texts.append("")
        else:
            words = ["Tyger", "Tyger", "burning", "bright", "Früh", "λόγος", "夜", "🔥"]
            texts.append(" ".join(words[(i + k) % len(words)] for k in range(3 + i % 9)) + f" #{i}\n")
    return texts


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    texts = rows()
    meta = [{"source": f"s{i % 3}", "score": i / 7} for i in range(len(texts))]
    ids = pa.array(range(len(texts)), pa.int64())
    for name, text_type, options in [
        ("snappy-dictionary", pa.string(), dict(compression="snappy", use_dictionary=True, row_group_size=7)),
        (
            "zstd-plain-large-string",
            pa.large_string(),
            dict(compression="zstd", use_dictionary=False, data_page_version="2.0", row_group_size=16),
        ),
        ("gzip-v1", pa.string(), dict(compression="gzip", version="1.0", row_group_size=40)),
    ]:
        table = pa.table({"id": ids, "text": pa.array(texts, text_type), "meta": pa.array(meta)})
        pq.write_table(table, OUT / f"{name}.parquet", **options)
        back = pq.read_table(OUT / f"{name}.parquet").column("text").to_pylist()
        assert back == texts, name
    documents = [t for t in texts if t]
    (OUT / "expected.json").write_text(
        json.dumps({"pyarrow": pa.__version__, "documents": documents}, ensure_ascii=False, indent=1) + "\n"
    )
    print(f"{len(documents)} documents in {OUT}")


if __name__ == "__main__":
    main()
