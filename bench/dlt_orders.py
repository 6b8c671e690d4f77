"""dlt, the peer in bench/ingest.sh: the same PostgreSQL table extracted to
Parquet files with dlt's sql_database source and its pyarrow backend, the
fastest dlt offers. Prints the rows loaded and the seconds taken.

    python bench/dlt_orders.py POSTGRES_URL TABLE OUT_DIR [delta]

With `delta` (bench/ingest_delta.sh), into dlt's delta destination
(the filesystem destination with table_format="delta", through the
deltalake package).
"""

import sys
import time

import dlt
from dlt.sources.sql_database import sql_table

url, table, out = sys.argv[1], sys.argv[2], sys.argv[3]
delta = len(sys.argv) > 4 and sys.argv[4] == "delta"
t0 = time.time()
source = sql_table(credentials=url, table=table, backend="pyarrow", chunk_size=100_000)
pipeline = dlt.pipeline(
    pipeline_name=f"bench_{table}",
    pipelines_dir=f"{out}/.dlt",
    destination=dlt.destinations.filesystem(bucket_url=f"file://{out}"),
    dataset_name="bench",
)
if delta:
    info = pipeline.run(source, table_format="delta")
else:
    info = pipeline.run(source, loader_file_format="parquet")
info.raise_on_failed_jobs()
secs = time.time() - t0
rows = pipeline.last_trace.last_normalize_info.row_counts.get(table, 0)
print(f"{rows} {secs:.3f}")
