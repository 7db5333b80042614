"""The read path, one module per step: `reader` resolves a URI on the snapshot the read leased and runs the reader
for its target type (`file`, `query`, `rendered`; text is inline); each source read goes through `cached` (this
replica's cache, then the cluster's) to `backend` (the source call). docs/design.md, "The read path", draws it.
"""
